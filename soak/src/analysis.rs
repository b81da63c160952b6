//! The shell around the detector: read a samples file, judge it, add what the run directory
//! knows beyond the samples (mapping snapshots, registry residues, heap growth by site), and write verdict.json and plots.

use std::path::Path;

use plateau_reports::{Samples, Site, Status, Verdict};

use crate::detector::{analyze, warmup_rule, DetectorConfig, Per, Tolerance};
use crate::fsutil::{source_function, write_atomic};
use crate::system::Residue;

/// How a samples file is judged: what the user said, beyond what the file says.
#[derive(Debug, Clone, Default)]
pub struct JudgeOptions {
    /// `--warmup`: overrides the header's warm-up (see [`crate::detector::warmup_rule`]).
    pub warmup: Option<u64>,
    /// `--tolerance` or the scenario's; None: the default.
    pub tolerance: Option<Tolerance>,
    /// The tolerance came from the user (a per-request one then needs a request counter).
    pub tolerance_explicit: bool,
    /// The run was interrupted (a verdict already beside the samples may also say so).
    pub incomplete: bool,
}

/// Reads `samples`, judges it and, when a mapping snapshot lies beside it, names the mappings
/// that grew for every metric judged to grow outside the heap. A verdict.json already beside the
/// samples that says the run was incomplete keeps the new verdict incomplete too. Errors are
/// input errors (exit 2), each naming the file, line and field or the flag.
pub fn judge_file(samples: &Path, o: &JudgeOptions) -> Result<(Samples, Verdict), String> {
    let s = Samples::read(samples).map_err(|e| e.to_string())?;
    let iterations = s.rows.iter().map(|r| r.iter).max().unwrap_or(0);
    let warmup_iterations = warmup_rule(o.warmup, s.header.warmup_iterations, Some(iterations))?;
    let cfg =
        DetectorConfig { warmup_iterations, tolerance: o.tolerance.unwrap_or_default(), ..DetectorConfig::default() };
    // What only the run itself knew (it was cut short, its target died, some points were sampled
    // unsettled) is kept from the verdict already beside the samples.
    let earlier = std::fs::read(samples.with_file_name("verdict.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<Verdict>(&b).ok());
    let earlier_incomplete = earlier.as_ref().is_some_and(|v| v.incomplete);
    let mut v = analyze(&s, &cfg, o.incomplete || earlier_incomplete);
    if let Some(e) = earlier {
        v.target_exit = e.target_exit;
        v.settle_timeouts = e.settle_timeouts;
    }
    if o.tolerance_explicit && v.requests_per_iter.is_none() && cfg.tolerance.per == Per::Request {
        return Err(format!(
            "--tolerance {}: {} counts no requests (no counter with the role `requests` in its header), so a tolerance per request cannot be applied; give it per iteration",
            cfg.tolerance,
            samples.display()
        ));
    }
    if let Some(residues) = std::fs::read(samples.with_file_name("residues.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<Vec<Residue>>(&b).ok())
    {
        name_insertion_sites(&residues, &mut v);
    }
    if let Some(g) = std::fs::read(samples.with_file_name("growth.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<crate::heapprof::GrowthRecord>(&b).ok())
    {
        name_growth_sites(&g, &mut v);
    }
    note_node_heaps(&mut v);
    let snap_path = samples.with_file_name("mappings.json");
    if let Some(snap) =
        std::fs::read(&snap_path).ok().and_then(|b| serde_json::from_slice::<crate::mappings::Snapshots>(&b).ok())
    {
        crate::mappings::name_grown(&snap, &mut v);
    }
    Ok((s, v))
}

/// Names, for the heap metric a profiled replay explained, the allocation sites of its growth; or
/// says plainly that the replay did not reproduce it.
fn name_growth_sites(g: &crate::heapprof::GrowthRecord, v: &mut Verdict) {
    let fmt = |b: f64| crate::detector::gauge::fmt_value(b, "bytes");
    if let Some(why) = &g.note {
        v.attribution.push(format!("where: {}: {why}", g.metric));
        return;
    }
    let Some(m) = v.metrics.iter_mut().find(|m| m.name == g.metric) else { return };
    let at = |s: &Site| format!("{} ({}:{})", s.function.as_deref().unwrap_or("?"), s.file, s.line);
    if m.status != Status::Fail {
        // `--profile` on a heap that did not fail: what the replay saw, blaming nothing.
        let top = g.sites.first().map_or_else(
            || "no allocation site above 1% of it".to_string(),
            |s| format!("most at {} ({}/iteration; growth.txt)", at(s), fmt(s.bytes_per_iter.unwrap_or(0.0))),
        );
        v.attribution.push(format!(
            "profile: {} did not fail; the profiled replay (iterations {}..{}) gained {}/iteration, {top}",
            g.metric,
            g.start_iter,
            g.end_iter,
            fmt(g.replay_bytes_per_iter)
        ));
        return;
    }
    if !g.reproduced {
        v.attribution.push(format!(
            "replay: the profiled replay (iterations {}..{}) grew {}/iteration against the run's {}/iteration: it did not reproduce the growth, so no allocation site is named (the run depended on something outside its seed?)",
            g.start_iter,
            g.end_iter,
            fmt(g.replay_bytes_per_iter),
            fmt(g.run_bytes_per_iter)
        ));
        return;
    }
    let Some(top) = g.sites.first() else { return };
    m.sites = g.sites.clone();
    m.reason.push_str(&format!("; grown at {}", at(top)));
    v.attribution.push(format!(
        "site: {} gains {}/iteration ({:.1} objects/iteration) of the replay's {}/iteration (profiled replay, iterations {}..{}; growth.txt)",
        at(top),
        fmt(top.bytes_per_iter.unwrap_or(0.0)),
        top.objects_per_iter.unwrap_or(0.0),
        fmt(g.replay_bytes_per_iter),
        g.start_iter,
        g.end_iter
    ));
    v.summary.push_str(&format!("; top site: {}", at(top)));
}

/// Says, for a failing heap of a node process (`--pd-processes`) or of an external target
/// (`--target`), why no allocation site is named: the profiled replay runs plateau's own process.
fn note_node_heaps(v: &mut Verdict) {
    let nodes: Vec<String> = v
        .metrics
        .iter()
        .filter(|m| m.status == Status::Fail && m.name.ends_with(".jemalloc.allocated") && m.sites.is_empty())
        .map(|m| m.name.clone())
        .collect();
    let (targets, nodes): (Vec<String>, Vec<String>) = nodes.into_iter().partition(|n| n.starts_with("target."));
    if !targets.is_empty() {
        v.attribution.push(format!(
            "replay: {} grows in the target server, whose allocator is its own (it reports jemalloc's statistics): a preloaded profiler cannot see it; soak the same engine in-process (plateau run SCENARIO) for the allocating line, or run the server under its own allocator's profiler",
            targets.join(", ")
        ));
    }
    if !nodes.is_empty() {
        v.attribution.push(format!(
            "replay: {} grows in a node process; a profiled replay covers plateau's own process only, so no allocation site is named: rerun with --profile and without --pd-processes (the same pair in one process) for the sites",
            nodes.join(", ")
        ));
    }
}

/// Names, for every failing registry, where its leftover entries were inserted and how old the
/// oldest is.
fn name_insertion_sites(residues: &[Residue], v: &mut Verdict) {
    for m in v.metrics.iter_mut().filter(|m| m.status == Status::Fail) {
        let mut mine: Vec<&Residue> = residues.iter().filter(|r| r.registry == m.name).collect();
        if mine.is_empty() {
            continue;
        }
        mine.sort_by(|a, b| b.count.cmp(&a.count).then(a.oldest_iter.cmp(&b.oldest_iter)));
        let sites: Vec<Site> = mine
            .iter()
            .map(|r| Site {
                function: source_function(&r.file, r.line),
                file: r.file.clone(),
                line: r.line,
                count: Some(r.count),
                oldest_iter: Some(r.oldest_iter),
                ..Site::default()
            })
            .collect();
        let said: Vec<String> = sites
            .iter()
            .map(|s| {
                format!(
                    "{} entries inserted at {}, oldest from iteration {}",
                    s.count.unwrap_or(0),
                    s.place(),
                    s.oldest_iter.unwrap_or(0)
                )
            })
            .collect();
        m.reason.push_str(&format!("; left by: {}", said.join("; ")));
        m.sites = sites;
    }
}

/// Writes verdict.json and the plots into `dir`. Plot failures are reported, not fatal.
pub fn write_outputs(dir: &Path, s: &Samples, v: &Verdict) -> std::io::Result<()> {
    write_outputs_against(dir, s, v, None)
}

/// A run to compare against in report.html (`plateau report --baseline`).
pub struct BaselineRun {
    pub dir: std::path::PathBuf,
    pub samples: Samples,
    pub verdict: Verdict,
}

/// What report.html links to, when the run directory has it.
const LINKED_FILES: [&str; 16] = [
    "samples.jsonl",
    "verdict.json",
    "environment.json",
    "memory.svg",
    "memory.png",
    "counts.svg",
    "counts.png",
    "mappings.json",
    "residues.json",
    "growth.txt",
    "growth.svg",
    "growth.pb.gz",
    "target.log",
    "replay",
    "shrink/story.md",
    "shrink/minimal.toml",
];

/// Writes verdict.json, the plots and report.html into `dir` (each whole or not at all), with a
/// baseline's comparison in the report when one is given.
pub fn write_outputs_against(
    dir: &Path,
    s: &Samples,
    v: &Verdict,
    baseline: Option<&BaselineRun>,
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut json = serde_json::to_string_pretty(v).map_err(std::io::Error::other)?;
    json.push('\n');
    write_atomic(&dir.join("verdict.json"), json.as_bytes())?;
    if let Err(e) = plateau_reports::plot::plot_run(s, v, dir) {
        eprintln!("plateau: warning: plots in {} not drawn: {e}", dir.display());
    }
    let environment: Option<plateau_reports::Environment> =
        std::fs::read(dir.join("environment.json")).ok().and_then(|b| serde_json::from_slice(&b).ok());
    let input = plateau_reports::html::ReportInput {
        samples: s,
        verdict: v,
        environment: environment.as_ref(),
        baseline: baseline.map(|b| plateau_reports::html::Baseline {
            label: b.dir.display().to_string(),
            samples: &b.samples,
            verdict: &b.verdict,
        }),
        files: LINKED_FILES.iter().filter(|f| dir.join(f).exists()).map(|f| f.to_string()).collect(),
    };
    let html = plateau_reports::html::report_html(&input).map_err(std::io::Error::other)?;
    write_atomic(&dir.join("report.html"), html.as_bytes())
}

/// A short human summary of a verdict: the summary line, then each failing or warning metric.
pub fn describe(v: &Verdict) -> String {
    let mut out = format!("verdict: {}{}\n", v.summary, if v.incomplete { " (incomplete)" } else { "" });
    for m in v.metrics.iter().filter(|m| m.status != Status::Pass) {
        let status = match m.status {
            Status::Fail => "FAIL",
            Status::Inconclusive => "inconclusive",
            _ => "warn",
        };
        out.push_str(&format!("  {status} {} ({}): {}", m.name, m.kind, m.reason));
        if let Some(l) = &m.location {
            out.push_str(&format!(" [{l}]"));
        }
        out.push('\n');
    }
    for a in &v.attribution {
        out.push_str(&format!("  where: {a}\n"));
    }
    for w in &v.warnings {
        out.push_str(&format!("  note: {w}\n"));
    }
    out
}
