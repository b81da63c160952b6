//! `plateau explain RUN_DIR`: the whole story of a run in a few lines a person reads first: what
//! grew, how fast, since when, where (allocation sites, the mapping, registry insertion sites),
//! and how to replay it.

use std::fmt::Write;
use std::path::Path;

use plateau_reports::{Status, Verdict};

use plateau_detector::series::fmt_value;
use plateau_profile::GrowthRecord;

/// The story of the run in `dir` and the verdict it tells, or what is missing to tell it.
pub fn explain(dir: &Path) -> Result<(String, Verdict), String> {
    let run = crate::load_run(dir)?;
    let (samples, v) = (run.samples, run.verdict);
    let growth: Option<GrowthRecord> = plateau_reports::fsutil::read_run_json(&dir.join("growth.json"));
    let environment: Option<plateau_reports::Environment> =
        plateau_reports::fsutil::read_run_json(&dir.join("environment.json"));
    let mut out = String::new();
    if let Some(why) = &run.judged_again {
        let _ = writeln!(out, "note: {why}: judged again from samples.jsonl\n");
    }
    let _ = writeln!(
        out,
        "{} (seed {}, {} backend{}), {} iterations, warm-up {}: {}",
        v.scenario,
        v.seed,
        v.backend,
        if v.injections.is_empty() { String::new() } else { format!(", injected: {}", v.injections.join(", ")) },
        v.iterations,
        v.warmup_iterations,
        v.verdict.as_str().to_uppercase()
    );
    let failing: Vec<_> = v.metrics.iter().filter(|m| m.status == Status::Fail).collect();
    if failing.is_empty() {
        let _ = writeln!(out, "{}", v.summary);
    }
    for m in &failing {
        let onset = m.trend.as_ref().and_then(|t| {
            let series: Vec<(u64, f64)> = samples
                .index(&m.name)
                .map(|i| samples.quiescent_series(i))
                .unwrap_or_default()
                .into_iter()
                .filter(|(iter, _)| *iter > v.warmup_iterations)
                .collect();
            growing_since(&series, 2.0 * t.noise.max(t.quantum))
        });
        let since = onset.map(|i| format!(", growing since iteration {i}")).unwrap_or_default();
        let conclusive = m.first_iter.map(|i| format!(", conclusive at iteration {i}")).unwrap_or_default();
        let _ = writeln!(out, "\n{} ({}){since}{conclusive}", m.name, m.kind);
        match (&m.trend, m.kind.as_str()) {
            (Some(t), _) => {
                let u = m.unit.as_str();
                let _ = write!(out, "  grows {}/iteration", fmt_value(t.slope_per_iter, u));
                if let Some(p) = &m.projected {
                    if let Some(r) = p.per_request {
                        let _ = write!(out, ", {} per request", fmt_value(r, u));
                    }
                    if let Some(d) = p.per_day {
                        let _ = write!(out, ", {} per day at this run's pace", fmt_value(d, u));
                    }
                }
                match t.resolution_per_iter {
                    Some(r) => {
                        let _ = writeln!(out, " (the run resolves {}/iteration)", fmt_value(r, u));
                    }
                    None => {
                        let _ = writeln!(out);
                    }
                }
            }
            (None, _) => {
                let _ = writeln!(out, "  {}", m.reason.split("; left by").next().unwrap_or(&m.reason));
            }
        }
        if let Some(l) = &m.location {
            let _ = writeln!(out, "  where: {l}");
        }
        write_sites(&mut out, &m.sites);
    }
    let notes: Vec<&String> = v
        .attribution
        .iter()
        .filter(|a| ["mapping:", "replay:", "profile:", "outside"].iter().any(|p| a.starts_with(p)))
        .collect();
    if !notes.is_empty() {
        out.push('\n');
        for a in notes {
            let _ = writeln!(out, "{a}");
        }
    }
    let _ = writeln!(out, "\nreplay: {}", plateau_reports::replay_command(&v, environment.as_ref()));
    if let Some(g) = growth {
        let _ = writeln!(out, "profiled replay (growth.txt, growth.pb.gz, growth.svg): {}", g.command);
    }
    Ok((out, v))
}

/// A failing metric's sites, a line each: where its leaked registry entries were inserted, or
/// where its heap growth was allocated.
fn write_sites(out: &mut String, sites: &[plateau_reports::Site]) {
    for s in sites {
        let f = s.function.as_deref().map(|f| format!(" in {f}")).unwrap_or_default();
        if let (Some(name), Some(kind)) = (&s.site, &s.kind) {
            // An allocation site judged by its own series (sites.jsonl).
            let rate = s.per_request.map(|r| format!(", {}/request", fmt_value(r, "bytes"))).unwrap_or_default();
            let share = s.share.map(|x| format!(", {:.0}% of the growth", 100.0 * x)).unwrap_or_default();
            let held = s.size_bytes.map(|b| format!(", {} held", fmt_value(b, "bytes"))).unwrap_or_default();
            let _ = writeln!(out, "  {kind} at {name}{rate}{share}{held}");
            continue;
        }
        match (s.count, s.bytes_per_iter) {
            (Some(n), _) => {
                let _ = writeln!(
                    out,
                    "  {n} entries inserted at {}:{}{f}, the oldest from iteration {}",
                    s.file,
                    s.line,
                    s.oldest_iter.unwrap_or(0)
                );
            }
            (None, Some(b)) => {
                let per_req =
                    s.bytes_per_request.map(|r| format!(", {}/request", fmt_value(r, "bytes"))).unwrap_or_default();
                let _ = writeln!(
                    out,
                    "  allocated at {}:{}{f}: {}/iteration{per_req}, {:.1} objects/iteration",
                    s.file,
                    s.line,
                    fmt_value(b, "bytes"),
                    s.objects_per_iter.unwrap_or(0.0)
                );
            }
            _ => {}
        }
    }
}

/// The iteration since which a series has stayed more than `margin` above its first point (the
/// level at the end of warm-up): the point after the last one within `margin` of it. None when
/// the series is back within the margin at its end.
fn growing_since(series: &[(u64, f64)], margin: f64) -> Option<u64> {
    let base = series.first()?.1;
    let last_low = series.iter().rposition(|(_, v)| *v <= base + margin)?;
    series.get(last_low + 1).map(|(iter, _)| *iter)
}

#[cfg(test)]
mod tests {
    use super::growing_since;

    #[test]
    fn onset_is_where_the_series_leaves_its_level_for_good() {
        let flat_then_rising: Vec<(u64, f64)> = (21..=100)
            .map(|i| (i, if i < 60 { 100.0 + (i % 2) as f64 } else { 100.0 + (i - 59) as f64 * 10.0 }))
            .collect();
        assert_eq!(growing_since(&flat_then_rising, 4.0), Some(60));
        let rising: Vec<(u64, f64)> = (21..=100).map(|i| (i, i as f64 * 100.0)).collect();
        assert_eq!(growing_since(&rising, 4.0), Some(22));
        let back_down: Vec<(u64, f64)> = (21..=30).map(|i| (i, if i == 30 { 0.0 } else { i as f64 * 100.0 })).collect();
        assert_eq!(growing_since(&back_down, 4.0), None);
        assert_eq!(growing_since(&[], 4.0), None);
    }
}
