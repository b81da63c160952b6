//! The shell around the detector: the one judge of a run. [`judge_run`] reads a samples file,
//! judges it with what it recorded (`plateau_detector::judge`), and adds what the run directory
//! knows beyond the samples (registry residues, heap growth by site, mapping snapshots); every
//! command that shows or stores a verdict takes it from there or from the verdict.json written
//! from it, and none judges with other settings behind the user's back.

// The harness's allocator in this crate's unit tests, as the `plateau` binary has it (the
// tests read jemalloc's statistics and arenas).
#[cfg(test)]
plateau_probes::install_harness_allocator!();

pub mod explain;
pub mod known;
mod load;

pub use load::{load_run, LoadedRun};

use std::path::Path;

use plateau_reports::{Samples, Site, Status, Verdict};

use plateau_detector::Overrides;
use plateau_probes::system::Residue;
use plateau_reports::fsutil::{read_run_json, source_function, write_atomic};

/// The verdict of the samples at `samples`, a function of what is on disk: the samples (their
/// header's warm-up, tolerance and planned length; their end record), and beside them the
/// residues, growth sites and mapping snapshots the run left. `overrides` judges with other
/// settings (`plateau analyze --tolerance`), named in the verdict. Errors are input errors (exit
/// 2), each naming the file, line and field.
pub fn judge_run(samples: &Path, overrides: &Overrides) -> Result<(Samples, Verdict), String> {
    // Read once: the bytes parsed are the bytes hashed.
    let bytes = plateau_reports::fsutil::read_input(samples, plateau_reports::samples::MAX_FILE_BYTES)?;
    let s = Samples::parse(&bytes[..], samples).map_err(|e| e.to_string())?;
    let v = judge_bytes(&s, &bytes, samples, overrides, None)?;
    Ok((s, v))
}

/// A file beside the samples, read once: its SHA-256 goes into `files` (by name) and its JSON is
/// returned, when it is there and reads.
fn read_evidence<T: serde::de::DeserializeOwned>(
    samples: &Path,
    name: &str,
    files: &mut std::collections::BTreeMap<String, String>,
) -> Option<T> {
    let bytes =
        plateau_reports::fsutil::read_input(&samples.with_file_name(name), plateau_reports::fsutil::RUN_FILE_BYTES)
            .ok()?;
    files.insert(name.to_string(), sha256_hex(&bytes));
    serde_json::from_slice(&bytes).ok()
}

/// The run's sites.jsonl beside the samples, when it is there: its SHA-256 goes into `files`. A
/// sites file that does not read is an input error naming its line and field, as a samples file's.
fn read_sites(
    samples: &Path,
    files: &mut std::collections::BTreeMap<String, String>,
) -> Result<Option<plateau_sites::SiteLog>, String> {
    let path = samples.with_file_name(plateau_sites::SITES_FILE);
    if !path.exists() {
        return Ok(None);
    }
    let bytes = plateau_reports::fsutil::read_input(&path, plateau_sites::record::MAX_FILE_BYTES)?;
    files.insert(plateau_sites::SITES_FILE.to_string(), sha256_hex(&bytes));
    plateau_sites::SiteLog::parse(&bytes[..]).map(Some).map_err(|e| format!("{}:{e}", path.display()))
}

/// SHA-256 of `bytes`, in hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    format!("{:x}", Sha256::digest(bytes))
}

/// [`judge_run`] of samples already read from `samples`. The verdict's evidence records the
/// SHA-256 of the samples file and of every file beside it that was read.
pub fn judge_read(s: &Samples, samples: &Path, overrides: &Overrides) -> Result<Verdict, String> {
    judge_read_known(s, samples, overrides, None)
}

/// [`judge_read`] with a known-growth file of the user's in place of the one the run recorded
/// (`plateau analyze --known`): the verdict names it among its overrides.
pub fn judge_read_known(
    s: &Samples,
    samples: &Path,
    overrides: &Overrides,
    known: Option<&plateau_sites::known::Known>,
) -> Result<Verdict, String> {
    let samples_bytes = plateau_reports::fsutil::read_input(samples, plateau_reports::samples::MAX_FILE_BYTES)?;
    let mut v = judge_bytes(s, &samples_bytes, samples, overrides, known)?;
    if let Some(k) = known {
        v.overrides.push(format!("--known {}", k.file));
    }
    Ok(v)
}

/// [`judge_read`] with the bytes `s` was parsed from.
pub(crate) fn judge_bytes(
    s: &Samples,
    samples_bytes: &[u8],
    samples: &Path,
    overrides: &Overrides,
    known: Option<&plateau_sites::known::Known>,
) -> Result<Verdict, String> {
    let mut files = std::collections::BTreeMap::new();
    let growth = read_evidence::<plateau_profile::GrowthRecord>(samples, "growth.json", &mut files);
    // What a replay of a server showed of its live heap, weighed against its process memory.
    let live_heap: Vec<plateau_detector::LiveHeap> = growth
        .iter()
        .filter_map(|g| Some((g, g.live_heap_bytes_per_iter?, g.live_heap_source.clone()?)))
        .flat_map(|(g, live, source)| {
            std::iter::once(&g.metric).chain(&g.also).map(move |metric| plateau_detector::LiveHeap {
                metric: metric.clone(),
                start_iter: g.start_iter,
                end_iter: g.end_iter,
                live_bytes_per_iter: live,
                source: source.clone(),
            })
        })
        .collect();
    let sites = read_sites(samples, &mut files)?;
    let evidence = sites.as_ref().map(|log| plateau_sites::SiteEvidence { log });
    let recorded_known = match known {
        Some(_) => None,
        None => known::read_record(samples, &mut files)?,
    };
    let known = known.or(recorded_known.as_ref()).map(plateau_sites::known::KnownEvidence::new);
    let layered = known::Layered {
        sites: evidence.as_ref().map(|e| e as &dyn plateau_detector::GaugeEvidence),
        known: known.as_ref().map(|e| e as &dyn plateau_detector::GaugeEvidence),
    };
    let mut v = plateau_detector::judge_with_sites(s, overrides, &live_heap, Some(&layered))
        .map_err(|e| format!("{}: {e}", samples.display()))?;
    if let Some(k) = &known {
        known::note(&mut v, k);
    }
    if let Some(residues) = read_evidence::<Vec<Residue>>(samples, "residues.json", &mut files) {
        name_insertion_sites(&residues, &mut v);
    }
    if let Some(g) = &growth {
        name_growth_sites(g, &mut v);
    }
    name_top_site(&mut v);
    note_node_heaps(&mut v);
    if let Some(snap) = read_evidence::<plateau_probes::mappings::Snapshots>(samples, "mappings.json", &mut files) {
        plateau_probes::mappings::name_grown(&snap, &mut v);
    }
    let evidence = v.evidence.get_or_insert_with(Default::default);
    evidence.samples_sha256 = sha256_hex(samples_bytes);
    evidence.files = files;
    Ok(v)
}

/// The settings of `asked` that differ from what `s` recorded (the same value is no override).
pub fn differing(s: &Samples, asked: &Overrides) -> Result<Overrides, String> {
    let recorded_warmup = s.header.warmup_iterations.unwrap_or(plateau_detector::DEFAULT_WARMUP_ITERATIONS);
    let recorded_tolerance = match &s.header.tolerance {
        Some(t) => t.parse::<plateau_detector::Tolerance>().map_err(|e| format!("header: tolerance: {e}"))?,
        None => plateau_detector::Tolerance::default(),
    };
    Ok(Overrides {
        warmup: asked.warmup.filter(|w| *w != recorded_warmup),
        tolerance: asked.tolerance.filter(|t| *t != recorded_tolerance),
    })
}

/// Names, for the heap metric a profiled replay explained, the allocation sites of its growth; or
/// says plainly that the replay did not reproduce it.
fn name_growth_sites(g: &plateau_profile::GrowthRecord, v: &mut Verdict) {
    let fmt = |b: f64| plateau_detector::series::fmt_value(b, "bytes");
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
        // What grew once in the window is named as a candidate (a table that doubles steps at
        // widening gaps, so a window sees one step of it), never blamed.
        let once = g.grew_once.first().map_or_else(String::new, |s| {
            format!(
                "; it grew once in the window at {} ({} in all: a table that doubled, or a buffer made again)",
                at(s),
                fmt(s.bytes_per_iter.unwrap_or(0.0) * (g.end_iter.saturating_sub(g.start_iter)).max(1) as f64)
            )
        });
        if g.run_bytes_per_iter <= 0.0 {
            // Nothing to compare: a ratio against no growth says nothing.
            v.attribution.push(format!(
                "replay: the run's {} did not rise over the profiled replay's window (iterations {}..{}: {}/iteration net), so the replay had no growth to explain and no allocation site is blamed{once} (growth.txt lists what the replay saw)",
                g.metric,
                g.start_iter,
                g.end_iter,
                fmt(g.run_bytes_per_iter)
            ));
            return;
        }
        v.attribution.push(format!(
            "replay: the profiled replay's sites (iterations {}..{}) grew {}/iteration against the run's {}/iteration over the same iterations: not within a factor of {}, so no allocation site is blamed{once} (growth.txt lists what the replay saw)",
            g.start_iter,
            g.end_iter,
            fmt(g.replay_bytes_per_iter),
            fmt(g.run_bytes_per_iter),
            // A record from before the factor was recorded: plateau's engine's.
            if g.within > 0.0 { g.within } else { 2.0 }
        ));
        return;
    }
    let Some(top) = g.sites.first() else { return };
    m.sites = g.sites.clone();
    m.reason.push_str(&format!("; grown at {}", at(top)));
    // The same process's other memory gauges that failed hold what the replay explained too.
    for other in v.metrics.iter_mut().filter(|o| g.also.contains(&o.name) && o.status == Status::Fail) {
        other.sites = g.sites.clone();
        other.reason.push_str(&format!("; grown at {} (the replay of {})", at(top), g.metric));
    }
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

/// The summary names the leak site of the first failing gauge that has one (sites.jsonl).
fn name_top_site(v: &mut Verdict) {
    let line = v.unknown_leaks().next().map(|s| {
        let rate = s
            .per_request
            .map(|r| format!(", {}/request", plateau_detector::series::fmt_value(r, "bytes")))
            .unwrap_or_default();
        format!("; top site: {} (leak{rate})", s.place())
    });
    if let Some(line) = line {
        v.summary.push_str(&line);
    }
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

/// Writes verdict.json, the plots and report.html into `dir`. Plot failures are reported, not
/// fatal.
pub fn write_outputs(dir: &Path, s: &Samples, v: &Verdict) -> std::io::Result<()> {
    write_verdict(dir, v)?;
    draw(dir, s, v, None)
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

/// Writes verdict.json into `dir`, whole or not at all.
pub fn write_verdict(dir: &Path, v: &Verdict) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    if let Some(what) = v.non_finite() {
        // JSON has no such number: a verdict holding one could not be read back.
        return Err(std::io::Error::other(format!("the verdict's {what} is not a finite number (a bug in plateau)")));
    }
    let mut json = serde_json::to_string_pretty(v).map_err(std::io::Error::other)?;
    json.push('\n');
    write_atomic(&dir.join("verdict.json"), json.as_bytes())
}

/// Draws the plots and report.html of a verdict into `dir` (each whole or not at all), with a
/// baseline's comparison in the report when one is given. It never writes the verdict: redrawing
/// is not judging.
pub fn draw(dir: &Path, s: &Samples, v: &Verdict, baseline: Option<&BaselineRun>) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    draw_site_growth(dir, v);
    if let Err(e) = plateau_reports::plot::plot_run(s, v, dir) {
        plateau_shell::errln!("plateau: warning: plots in {} not drawn: {e}", dir.display());
    }
    let environment: Option<plateau_reports::Environment> = read_run_json(&dir.join("environment.json"));
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

/// The growth files (growth.txt, growth.pb.gz, growth.svg) of the first failing gauge's sites,
/// drawn from the run's sites.jsonl (a run whose sites a profiled replay named has them from
/// there, with its growth.json: left as they are).
fn draw_site_growth(dir: &Path, v: &Verdict) {
    let path = dir.join(plateau_sites::SITES_FILE);
    if !path.exists() || dir.join("growth.json").exists() {
        return;
    }
    let drawn = plateau_sites::SiteLog::read(&path).and_then(|log| plateau_profile::sites_growth::write(dir, &log, v));
    if let Err(e) = drawn {
        plateau_shell::errln!("plateau: warning: growth files in {} not drawn: {e}", dir.display());
    }
}

/// A short human summary of a verdict: the summary line, then each failing or undecided metric.
pub fn describe(v: &Verdict) -> String {
    let mut out = format!("verdict: {}{}\n", v.summary, if v.incomplete { " (incomplete)" } else { "" });
    if !v.overrides.is_empty() {
        out.push_str(&format!("  judged with {} (not the run's own settings)\n", v.overrides.join(" ")));
    }
    for m in v.metrics.iter().filter(|m| m.status != Status::Pass) {
        let status = match m.status {
            Status::Fail => "FAIL",
            _ => "inconclusive",
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
