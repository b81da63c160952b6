//! growth.txt, growth.pb.gz and growth.svg of a run whose sites were recorded as it ran: the rise
//! of each site of a failing gauge over the gauge's judged window (the verdict's `sites`), with
//! the stack each site was first seen with. The same files a profiled replay writes, drawn from
//! the run itself.

use std::path::Path;

use plateau_sites::SiteLog;

use super::symbolize::Frame;
use super::{write_files, Growth, StackGrowth};

/// A frame as a site's stack gives it (`FILE:LINE FUNCTION`, `LIBRARY!FUNCTION`, or a name).
fn frame(text: &str) -> Frame {
    let (place, function) = text.split_once(' ').unwrap_or((text, text));
    let (file, line) = match place.rsplit_once(':') {
        Some((f, l)) if l.parse::<u32>().is_ok() => (Some(f.to_string()), l.parse().ok()),
        _ => (None, None),
    };
    let own = file.as_deref().is_some_and(|f| !f.starts_with('/') && !f.starts_with("library/"));
    Frame { function: function.to_string(), file, line, own }
}

/// The growth of the sites named `names` (of `what`: a gauge's, or every site) over the judged
/// window (`start`..`end`), as the growth files draw it; None when none rose or the log lacks them.
pub fn growth_of(log: &SiteLog, names: &[&str], what: &str, (start, end): (u64, u64)) -> Option<Growth> {
    let mut stacks = Vec::new();
    for (k, name) in names.iter().enumerate() {
        let def = log.sites.iter().find(|d| d.name == *name)?;
        let series: Vec<(u64, f64)> =
            log.series(def.id as usize).into_iter().filter(|(it, _)| (start..=end).contains(it)).collect();
        let rise = series.last()?.1 - series.first()?.1;
        if rise <= 0.0 {
            continue;
        }
        let texts = if def.stack.is_empty() { vec![def.name.clone()] } else { def.stack.clone() };
        stacks.push(StackGrowth {
            addrs: (0..texts.len() as u64).map(|i| ((k as u64) << 32) | i).collect(),
            frames: texts.iter().map(|t| vec![frame(t)]).collect(),
            objects: 0,
            bytes: rise as i64,
        });
    }
    (!stacks.is_empty()).then(|| Growth {
        binary: String::new(),
        source: format!("the run, {what} (as sites.jsonl records them)"),
        start_iter: start,
        end_iter: end,
        stacks,
        one_half_only: (0, 0),
        shrank: (0, 0),
        once: Vec::new(),
    })
}

/// Writes the growth files of the first failing gauge with rising sites, else (a run whose sites
/// were recorded though nothing failed: `--profile`) of the sites of the log that rose most.
pub fn write(dir: &Path, log: &SiteLog, v: &plateau_reports::Verdict) -> Result<bool, String> {
    let end = v.iterations;
    let start = v.warmup_iterations.min(end);
    for m in v.metrics.iter().filter(|m| m.status == plateau_reports::Status::Fail && !m.sites.is_empty()) {
        let names: Vec<&str> = m.sites.iter().filter_map(|s| s.site.as_deref()).collect();
        if let Some(g) = growth_of(log, &names, &format!("{}'s sites", m.name), (start, end)) {
            write_files(dir, &g, v.requests_per_iter, "")?;
            return Ok(true);
        }
    }
    if v.failed() {
        return Ok(false);
    }
    let mut risers: Vec<(f64, &str)> = log
        .sites
        .iter()
        .filter_map(|d| {
            let series: Vec<(u64, f64)> =
                log.series(d.id as usize).into_iter().filter(|(it, _)| (start..=end).contains(it)).collect();
            let rise = series.last()?.1 - series.first()?.1;
            (rise > 0.0).then_some((rise, d.name.as_str()))
        })
        .collect();
    risers.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(b.1)));
    let names: Vec<&str> = risers.iter().take(10).map(|r| r.1).collect();
    let what = "the sites that rose most, nothing failing";
    let g = growth_of(log, &names, what, (start, end)).unwrap_or_else(|| Growth {
        binary: String::new(),
        source: format!("the run, {what} (as sites.jsonl records them): none rose"),
        start_iter: start,
        end_iter: end,
        stacks: Vec::new(),
        one_half_only: (0, 0),
        shrank: (0, 0),
        once: Vec::new(),
    });
    write_files(dir, &g, v.requests_per_iter, "").map(|()| true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_of_a_sites_stack() {
        let f = frame("engine/src/output.rs:265 plateau_engine::output::OutputProcessor::finalize");
        assert_eq!((f.file.as_deref(), f.line, f.own), (Some("engine/src/output.rs"), Some(265), true));
        let f = frame("libledger.so!ledger_worker");
        assert_eq!((f.file, f.function.as_str()), (None, "libledger.so!ledger_worker"));
        assert!(!frame("/usr/lib/python3.11/json/decoder.py:353 raw_decode").own);
        assert!(!frame("library/alloc/src/vec/mod.rs:1 push").own);
    }
}
