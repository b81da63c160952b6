//! A shrink's outputs: minimal.toml (a scenario anyone can run, its replay command at the top),
//! story.md (what the leak needs, what does not matter, every candidate with its verdict and
//! time) and shrink.json (the same for programs).

use std::fmt::Write as _;
use std::path::Path;

use plateau_reports::shell_word;
use toml::Table;

use super::features::{self, Feature};
use super::{Origin, Record, Search, Signature};

/// What the minimal scenario was checked without, one part at a time.
pub struct Check {
    /// "phase 2 (batch: ...)" or a feature's name.
    pub part: String,
    /// "without phase 2", "with n = 1".
    pub off: String,
    /// The candidate that ran it.
    pub record: usize,
    pub still_fails: bool,
}

/// A part of the minimal scenario a check takes away.
#[derive(Debug, Clone)]
enum Part {
    Phase(usize),
    Feature(Feature),
}

impl Part {
    fn remove(&self, doc: &Table) -> Table {
        match self {
            Part::Phase(p) => {
                let keep: Vec<usize> = (0..features::phase_count(doc)).filter(|q| q != p).collect();
                features::with_phases(doc, &keep)
            }
            Part::Feature(f) => features::without(doc, std::slice::from_ref(f)),
        }
    }
}

/// Runs the minimal scenario without each of its phases (where it has more than one) and without
/// each of its features, one at a time, as one batch, at the original run's length: "passes with
/// n = 1" is then as strong a claim as the run's own verdict, however short the minimal scenario
/// became. A part whose removal still fails (halving the requests can make a phase kept by
/// ddmin unneeded) is removed and the checks run again, so the result is 1-minimal.
pub fn one_minimal_checks(search: &mut Search, length: u64, seed: u64) -> Vec<Check> {
    // Each round removes a part or ends: at most as many rounds as parts.
    let rounds = features::phase_count(&search.best) + features::features(&search.best).len() + 1;
    let mut checks = Vec::new();
    for _ in 0..rounds {
        let best = features::with_length(&search.best, length, seed);
        let phases = features::phase_count(&best);
        let mut parts = Vec::new();
        if phases > 1 {
            for p in 0..phases {
                let part = format!("phase {} ({})", p + 1, features::describe_phase(&best, p));
                parts.push((part, format!("without phase {}", p + 1), Part::Phase(p)));
            }
        }
        for f in features::features(&best) {
            parts.push((f.name(), f.off(), Part::Feature(f)));
        }
        let batch: Vec<(String, Table)> =
            parts.iter().map(|(_, off, part)| (format!("check: {off}"), part.remove(&best))).collect();
        let judged = search.runner.judge(&batch);
        if let Some(k) = judged.iter().position(|(fails, _)| *fails) {
            search.best = parts[k].2.remove(&search.best);
            continue;
        }
        checks = parts
            .into_iter()
            .zip(judged)
            .map(|((part, off, _), (still_fails, record))| Check { part, off, record, still_fails })
            .collect();
        break;
    }
    checks
}

pub struct Inputs<'a> {
    pub run_dir: &'a Path,
    pub out_dir: &'a Path,
    pub origin: &'a Origin,
    pub signature: &'a Signature,
    pub original: &'a Table,
    pub minimal: &'a Table,
    pub checks: &'a [Check],
    pub records: &'a [Record],
    pub out_of_budget: bool,
    /// plateau was told to stop (SIGTERM, SIGINT) before the search ended.
    pub interrupted: bool,
    pub secs: f64,
}

/// The command that runs the minimal scenario as the original ran.
fn replay(i: &Inputs) -> String {
    let mut cmd = format!("plateau run {}", i.out_dir.join("minimal.toml").display());
    for f in &i.origin.flags {
        if f.starts_with("--") {
            cmd.push_str(&format!(" {f}"));
        } else {
            cmd.push_str(&format!(" {}", shell_word(f)));
        }
    }
    if let Some(t) = &i.origin.target {
        cmd.push_str(&format!(" --target {t}"));
    }
    if let Some(s) = &i.origin.spawn {
        cmd.push_str(&format!(" --spawn {}", shell_word(s)));
    }
    cmd
}

fn count(k: u64, one: &str, many: &str) -> String {
    format!("{k} {}", if k == 1 { one } else { many })
}

fn size(doc: &Table) -> String {
    format!(
        "{}, {}, {} per iteration",
        count(features::phase_count(doc) as u64, "phase", "phases"),
        count(features::length(doc).unwrap_or(0), "iteration", "iterations"),
        count(features::batch_requests(doc), "batch request", "batch requests")
    )
}

/// What a minimal scenario that needs no feature needs, by the kinds of the phases it kept:
/// requests, or something else (a sleep and wake, a weight update), which the story names rather
/// than claiming a request triggers it.
fn nothing_needed(kinds: &[String]) -> String {
    match kinds {
        [k] if k == "batch" || k == "pressure" => {
            format!("nothing beyond one `{k}` phase of requests: any request of it triggers the leak")
        }
        [k] => {
            format!("nothing beyond one `{k}` phase, with no feature of it needed: the phase alone triggers the leak")
        }
        ks => format!("nothing beyond the phases kept ({}): no feature of them is needed", ks.join(", ")),
    }
}

/// Writes minimal.toml, story.md and shrink.json into the shrink's directory; returns the story.
pub fn write(i: &Inputs) -> Result<String, String> {
    let run_secs: f64 = i.records.iter().map(|r| r.secs).sum();
    let ran = i.records.iter().filter(|r| r.secs > 0.0).count();
    // A part is needed only where its candidate ran to a verdict and did not fail the same way;
    // one whose candidate did not run (the budget, an invalid or broken candidate) is unchecked.
    let kept: Vec<&Check> = i.checks.iter().filter(|c| !c.still_fails && i.records[c.record].judged()).collect();
    let unchecked: Vec<&Check> = i.checks.iter().filter(|c| !c.still_fails && !i.records[c.record].judged()).collect();
    let loose: Vec<&Check> = i.checks.iter().filter(|c| c.still_fails).collect();
    let kept_features = features::features(i.minimal);
    let gone: Vec<String> = features::features(i.original)
        .into_iter()
        .filter(|f| !kept_features.contains(f))
        .map(|f: Feature| f.name())
        .collect();
    // The gauge layer judges trends and staircases alike: "a trend" misnamed a table that doubles.
    let what = if i.signature.exact { "the exact layer" } else { "the gauge layer" };
    let mut s = String::new();
    let _ = writeln!(s, "# What the leak needs\n");
    let _ = writeln!(
        s,
        "Shrunk `{}` from {} to {}, in {ran} candidate runs ({:.0} s of runs, {:.0} s of wall time).\n",
        i.run_dir.display(),
        size(i.original),
        size(i.minimal),
        run_secs,
        i.secs
    );
    let _ = writeln!(
        s,
        "It fails the same way: on {} ({what}), with seed {} and {}.\n",
        i.signature.metrics.join(", "),
        features::seed(i.minimal).unwrap_or(0),
        if i.origin.injections.is_empty() { "no injection".to_string() } else { i.origin.injections.join(", ") }
    );
    if i.interrupted {
        let _ =
            writeln!(s, "**Interrupted** (SIGTERM or Ctrl-C): the search stopped there, so this may not be minimal.\n");
    } else if i.out_of_budget {
        let _ = writeln!(s, "**The budget ran out**: some candidates were not run, so this may not be minimal.\n");
    }
    let _ = writeln!(
        s,
        "## Needed: without any one of these it does not fail (each checked at the run's length, {})\n",
        count(features::length(i.original).unwrap_or(0), "iteration", "iterations")
    );
    write_parts(&mut s, i, &kept, &unchecked, &loose);
    let _ = writeln!(s, "\n## Does not matter\n");
    let dropped = features::phase_count(i.original) - features::phase_count(i.minimal);
    let _ = writeln!(s, "- phases dropped: {dropped} of {}", features::phase_count(i.original));
    if !gone.is_empty() {
        let _ = writeln!(s, "- turned off and still failing: {}", gone.join(", "));
    }
    let _ = writeln!(s, "\n## Replay\n\n```\n{}\n```\n", replay(i));
    write_candidates(&mut s, i.records);
    let minimal = format!(
        "# The smallest scenario found by `plateau shrink {}` that still fails on {}.\n# Replay: {}\n\n{}",
        i.run_dir.display(),
        i.signature.metrics.join(", "),
        replay(i),
        features::render(i.minimal)
    );
    let json = serde_json::json!({
        "schema": "plateau.shrink.v1",
        "run": i.run_dir.display().to_string(),
        "signature": { "metrics": i.signature.metrics, "exact": i.signature.exact },
        "needed": kept.iter().map(|c| &c.part).collect::<Vec<_>>(),
        "unchecked": unchecked.iter().map(|c| &c.part).collect::<Vec<_>>(),
        "turned_off": gone,
        "phases": features::phase_kinds(i.minimal),
        "features": features::features(i.minimal).iter().map(Feature::name).collect::<Vec<_>>(),
        "iterations": features::length(i.minimal),
        "original_iterations": features::length(i.original),
        "replay": replay(i),
        "out_of_budget": i.out_of_budget,
        "interrupted": i.interrupted,
        "wall_secs": i.secs,
        "candidates": i.records,
    });
    let put = |name: &str, text: &str| {
        plateau_reports::fsutil::write_atomic(&i.out_dir.join(name), text.as_bytes())
            .map_err(|e| format!("{}: {e}", i.out_dir.join(name).display()))
    };
    put("minimal.toml", &minimal)?;
    put("story.md", &s)?;
    put("shrink.json", &(serde_json::to_string_pretty(&json).map_err(|e| e.to_string())? + "\n"))?;
    Ok(s)
}

/// The parts the leak needs (each turned off and checked), those whose check did not run to a
/// verdict, and those it still fails without.
fn write_parts(s: &mut String, i: &Inputs, kept: &[&Check], unchecked: &[&Check], loose: &[&Check]) {
    for c in kept {
        let r = &i.records[c.record];
        let _ = writeln!(s, "- {}: {} {} (candidate {})", c.part, c.off, outcome(r), r.id);
    }
    if kept.is_empty() && unchecked.is_empty() {
        let _ = writeln!(s, "- {}", nothing_needed(&features::phase_kinds(i.minimal)));
    }
    if !unchecked.is_empty() {
        let _ = writeln!(
            s,
            "\nNot checked: whether these are needed is undecided, their candidates did not run to a verdict:\n"
        );
        for c in unchecked {
            let r = &i.records[c.record];
            let _ = writeln!(s, "- {}: {} {} (candidate {})", c.part, c.off, outcome(r), r.id);
        }
    }
    if !loose.is_empty() {
        let _ = writeln!(s, "\nStill failing without these (not minimal: the budget ran out):\n");
        for c in loose {
            let _ = writeln!(s, "- {}: {} it still fails (candidate {})", c.part, c.off, i.records[c.record].id);
        }
    }
}

/// The table of every candidate run: its change, verdict, what failed, length and seconds.
fn write_candidates(s: &mut String, records: &[Record]) {
    let _ = writeln!(s, "## Candidates\n");
    let _ = writeln!(s, "| # | change | verdict | fails on | iterations | seconds |");
    let _ = writeln!(s, "|---|---|---|---|---|---|");
    for r in records {
        let verdict = if r.note.is_empty() { r.verdict.clone() } else { format!("{} ({})", r.verdict, r.note) };
        let _ = writeln!(
            s,
            "| {} | {} | {}{} | {} | {} | {:.1} |",
            r.id,
            r.change.replace('|', "\\|"),
            verdict.replace('|', "\\|"),
            if r.same_way { " (same way)" } else { "" },
            r.failing.join(", "),
            r.iterations,
            r.secs
        );
    }
}

fn outcome(r: &Record) -> String {
    let sig = r.signature.join(", ");
    match r.verdict.as_str() {
        "pass" => format!("it passes ({sig})"),
        "inconclusive" => format!("it does not fail ({sig}; inconclusive overall)"),
        "fail" if !r.note.is_empty() => format!("it does not fail the same way ({sig}; {})", r.note),
        "fail" => format!("it does not fail the same way ({sig}; it fails on {})", r.failing.join(", ")),
        other => format!(
            "it does not run ({other}{})",
            if r.note.is_empty() { String::new() } else { format!(": {}", r.note) }
        ),
    }
}
