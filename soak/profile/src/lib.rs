//! Where heap growth comes from, by deterministic replay: the run is replayed (same scenario, seed
//! and injections) with jemalloc's heap profiler sampling every allocation, the live heap is
//! dumped at three quiescent points of the window (after warm-up, in the middle, at the end: the
//! same phase of the scenario's cycle each time), and the difference is taken per allocation stack
//! and symbolized to the function and line that allocated what stayed. A stack counts when it grew
//! in both halves: a leak does, while memory alive at one point and not another (a buffer the
//! vision encoder keeps until its next use, a pool released by sleep and made again) does not, and
//! no longer inflates the replay's total. No profiler alone can do this: it needs a run that can
//! be repeated exactly.
//!
//! Outputs in the run directory: `growth.txt` (the top growing stacks, the project's own frames
//! first), `growth.pb.gz` (the difference as a pprof profile), `growth.svg` (its flamegraph) and
//! `growth.json` (the sites and the replay's figures, which the verdict's heap metric carries).

// The harness's allocator in this crate's unit tests, as the `plateau` binary has it (the
// tests read jemalloc's statistics and arenas).
#[cfg(test)]
plateau_probes::install_harness_allocator!();

pub mod control;
pub mod live;
pub mod parse;
pub mod pprof;
pub mod replay;
pub mod sites_growth;
pub mod symbolize;

use std::path::Path;

use plateau_reports::Site;
use serde::{Deserialize, Serialize};

use parse::HeapProfile;
use symbolize::{short_name, Frame, Symbolizer};

/// The share of a replay's heap growth below which a site is not named in the verdict: what the
/// harness itself keeps between the dumps (the dump's own buffers, a growing sample row) is a few
/// bytes in a window of 40 iterations, under a thousandth of the smallest leak a run resolves.
const MIN_SITE_SHARE: f64 = 0.01;

/// One allocation stack whose live heap grew between the dumps.
#[derive(Debug, Clone)]
pub struct StackGrowth {
    /// Return addresses, innermost first, and the frames at each.
    pub addrs: Vec<u64>,
    pub frames: Vec<Vec<Frame>>,
    pub objects: i64,
    pub bytes: i64,
}

impl StackGrowth {
    /// Every frame, innermost first.
    pub fn flat(&self) -> impl Iterator<Item = &Frame> {
        self.frames.iter().flatten()
    }

    /// The allocation site: the innermost frame of this project's code (past the allocator, the
    /// standard library and dependencies), else the innermost frame past the allocator.
    pub fn site(&self) -> Option<&Frame> {
        self.flat().find(|f| f.is_project() && !f.is_allocator()).or_else(|| {
            self.flat().find(|f| !f.is_allocator() && !f.file.as_deref().is_some_and(|p| p.starts_with("target/")))
        })
    }
}

/// The heap's growth between two dumps of a replay.
#[derive(Debug, Clone)]
pub struct Growth {
    /// The profiled binary.
    pub binary: String,
    /// Where the growth was seen, for growth.txt's first line ("a profiled replay ...").
    pub source: String,
    pub start_iter: u64,
    pub end_iter: u64,
    /// Stacks that grew in both halves of the window, most bytes first.
    pub stacks: Vec<StackGrowth>,
    /// Stacks whose live heap changed in one half only (not counted): how many, their net bytes.
    pub one_half_only: (usize, i64),
    /// Stacks whose live heap shrank in both halves (not counted as growth): how many, their net
    /// bytes (negative): what the window gave back, an evicting cache's oldest entries.
    pub shrank: (usize, i64),
    /// Of those, the ones that gained in one half and kept it, most bytes first: a table that
    /// doubled once in the window (its next doubling comes after twice the gap) grows this way,
    /// and so does a buffer made again. Listed as candidates, never blamed.
    pub once: Vec<StackGrowth>,
}

/// Turns a return address into the frames at it, innermost first: plateau's own binary
/// ([`Symbolizer`]) or a server's executable and libraries (`external::profile::native`).
pub trait Symbolize {
    fn frames(&self, addr: u64) -> Vec<Frame>;
}

impl Symbolize for Symbolizer {
    fn frames(&self, addr: u64) -> Vec<Frame> {
        Symbolizer::frames(self, addr)
    }
}

/// Reads a heap_v2 dump.
pub fn read_dump(p: &Path) -> Result<HeapProfile, String> {
    std::fs::read_to_string(p)
        .map_err(|e| format!("{}: {e}", p.display()))
        .and_then(|t| HeapProfile::parse(&t).map_err(|e| format!("{}: {e}", p.display())))
}

/// The growth between dumps at a window's start, middle and end, by stack: stacks that gained in
/// both halves count (objects and bytes over the whole window), the rest are tallied apart.
pub fn growth_between(
    [start, mid, end]: [&HeapProfile; 3],
    (start_iter, end_iter): (u64, u64),
    binary: String,
    sym: &dyn Symbolize,
) -> Growth {
    let (first, second) = (start.diff(mid), mid.diff(end));
    let mut stacks = Vec::new();
    let mut one_half_only = (0usize, 0i64);
    let mut shrank = (0usize, 0i64);
    let mut once = Vec::new();
    let keys: std::collections::BTreeSet<&Vec<u64>> = first.keys().chain(second.keys()).collect();
    for addrs in keys {
        let (o1, b1) = first.get(addrs).copied().unwrap_or_default();
        let (o2, b2) = second.get(addrs).copied().unwrap_or_default();
        if b1 > 0 && b2 > 0 {
            let frames = addrs.iter().map(|&x| sym.frames(x)).collect();
            stacks.push(StackGrowth { addrs: addrs.clone(), frames, objects: o1 + o2, bytes: b1 + b2 });
        } else if b1 < 0 && b2 < 0 {
            shrank.0 += 1;
            shrank.1 += b1 + b2;
        } else if b1 + b2 != 0 {
            one_half_only.0 += 1;
            one_half_only.1 += b1 + b2;
            if b1 >= 0 && b2 >= 0 {
                let frames = addrs.iter().map(|&x| sym.frames(x)).collect();
                once.push(StackGrowth { addrs: addrs.clone(), frames, objects: o1 + o2, bytes: b1 + b2 });
            }
        }
    }
    stacks.sort_by(|x, y| y.bytes.cmp(&x.bytes).then(x.addrs.cmp(&y.addrs)));
    once.sort_by(|x, y| y.bytes.cmp(&x.bytes).then(x.addrs.cmp(&y.addrs)));
    let source = "a profiled replay (every allocation sampled), by stacks that grew in both halves".to_string();
    Growth { binary, source, start_iter, end_iter, stacks, one_half_only, shrank, once }
}

impl Growth {
    pub fn iterations(&self) -> f64 {
        (self.end_iter.saturating_sub(self.start_iter)).max(1) as f64
    }

    pub fn bytes_per_iter(&self) -> f64 {
        self.stacks.iter().map(|s| s.bytes).sum::<i64>() as f64 / self.iterations()
    }

    /// The whole live heap's change per iteration over the window, every stack counted, frees of
    /// older objects included: what the program's objects took, whatever its allocator did.
    pub fn net_bytes_per_iter(&self) -> f64 {
        (self.stacks.iter().map(|s| s.bytes).sum::<i64>() + self.one_half_only.1 + self.shrank.1) as f64
            / self.iterations()
    }

    /// Growth by allocation site, most bytes first: (site, objects, bytes).
    pub fn sites(&self) -> Vec<(Frame, i64, i64)> {
        sites_of(&self.stacks)
    }

    /// The sites of the stacks that grew once in the window ([`Growth::once`]), as a verdict
    /// carries sites: candidates a person reads, never blamed.
    pub fn once_sites(&self, requests_per_iter: Option<f64>, top: usize) -> Vec<Site> {
        let n = self.iterations();
        sites_of(&self.once)
            .into_iter()
            .filter(|s| s.2 > 0)
            .take(top)
            .map(|(f, objects, bytes)| as_site(&f, objects, bytes, n, requests_per_iter))
            .collect()
    }

    /// The top sites as a verdict carries them: those with at least [`MIN_SITE_SHARE`] of the
    /// growth (growth.txt lists every one).
    pub fn verdict_sites(&self, requests_per_iter: Option<f64>, top: usize) -> Vec<Site> {
        let n = self.iterations();
        let total: i64 = self.stacks.iter().map(|s| s.bytes).sum();
        self.sites()
            .into_iter()
            .filter(|s| s.2 > 0 && s.2 as f64 >= MIN_SITE_SHARE * total as f64)
            .take(top)
            .map(|(f, objects, bytes)| as_site(&f, objects, bytes, n, requests_per_iter))
            .collect()
    }
}

/// A site's growth as a verdict carries it, per iteration (and per request) of `n`.
fn as_site(f: &Frame, objects: i64, bytes: i64, n: f64, requests_per_iter: Option<f64>) -> Site {
    Site {
        function: Some(short_name(&f.function)),
        file: f.file.clone().unwrap_or_default(),
        line: f.line.unwrap_or(0),
        bytes_per_iter: Some(bytes as f64 / n),
        bytes_per_request: requests_per_iter.map(|r| bytes as f64 / n / r),
        objects_per_iter: Some(objects as f64 / n),
        ..Site::default()
    }
}

/// Stacks merged by allocation site, most bytes first: (site, objects, bytes).
fn sites_of(stacks: &[StackGrowth]) -> Vec<(Frame, i64, i64)> {
    let mut by: Vec<(Frame, i64, i64)> = Vec::new();
    for s in stacks {
        let Some(site) = s.site() else { continue };
        match by.iter_mut().find(|x| x.0 == *site) {
            Some(x) => (x.1, x.2) = (x.1 + s.objects, x.2 + s.bytes),
            None => by.push((site.clone(), s.objects, s.bytes)),
        }
    }
    by.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.file.cmp(&b.0.file)).then(a.0.line.cmp(&b.0.line)));
    by
}

/// What growth.json holds: the sites and the replay that found them.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct GrowthRecord {
    /// The heap metric the sites explain.
    pub metric: String,
    pub start_iter: u64,
    pub end_iter: u64,
    /// The replay's heap growth against the run's: whether the replay reproduced it.
    pub replay_bytes_per_iter: f64,
    pub run_bytes_per_iter: f64,
    pub reproduced: bool,
    /// The factor within which the replay's rate reproduces the run's (2 for plateau's own
    /// engine; 4 for a server, whose pages and allocator's caching sit between the two); 0 in a
    /// record that names no replay.
    #[serde(default)]
    pub within: f64,
    /// The replay's command line, for a person to run again.
    pub command: String,
    pub sites: Vec<Site>,
    /// Sites that grew once in the window and kept it (a table that doubled once), most bytes
    /// first: named as candidates when the sites above do not explain the run, never blamed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub grew_once: Vec<Site>,
    /// Why no replay named a site (a server plateau did not start, one with its own allocator,
    /// no profiler installed), in place of the figures above.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// For a gauge of a server's process memory: the replay's whole live heap change per
    /// iteration over the window (its profiler's, frees included), the evidence of whether the
    /// program's objects grew or only its allocator's footprint did; and the profiler it came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live_heap_bytes_per_iter: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live_heap_source: Option<String>,
    /// The other gauges of the same process's memory (RSS beside its anonymous pages) the live
    /// heap is weighed against too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub also: Vec<String>,
}

/// Writes growth.json, which the verdict's judging reads back.
pub fn write_record(dir: &Path, record: &GrowthRecord) -> Result<(), String> {
    let path = dir.join("growth.json");
    let json = serde_json::to_vec_pretty(record).map_err(|e| e.to_string())?;
    plateau_reports::fsutil::write_atomic(&path, &json).map_err(|e| format!("{}: {e}", path.display()))
}

/// Writes growth.txt, growth.pb.gz and growth.svg into `dir`.
pub fn write_files(dir: &Path, g: &Growth, requests_per_iter: Option<f64>, command: &str) -> Result<(), String> {
    let io = |p: &str, e: std::io::Error| format!("{}: {e}", dir.join(p).display());
    let txt = growth_text(g, requests_per_iter, command);
    plateau_reports::fsutil::write_atomic(&dir.join("growth.txt"), txt.as_bytes()).map_err(|e| io("growth.txt", e))?;
    // The allocator's and the profiler's own frames (innermost) would take every byte's `flat`
    // share in pprof: each stack starts at its first frame past them.
    let stacks: Vec<pprof::Stack> = g
        .stacks
        .iter()
        .map(|s| {
            // An address is the allocator's when any frame at it is (jemalloc inlines its
            // profiling hooks into its own entry points), or when nothing at it is known.
            let skip = s
                .frames
                .iter()
                .take_while(|fs| {
                    fs.iter().any(Frame::is_allocator)
                        || fs.iter().all(|f| f.file.is_none() && f.function.starts_with("0x"))
                })
                .count();
            let skip = if skip == s.frames.len() { 0 } else { skip };
            (s.addrs[skip..].to_vec(), s.frames[skip..].to_vec(), s.objects, s.bytes)
        })
        .collect();
    let comment =
        format!("heap gained between iterations {} and {} of {}: {command}", g.start_iter, g.end_iter, g.source);
    let profile = pprof::profile(&stacks, &g.binary, &comment);
    pprof::write(&dir.join("growth.pb.gz"), &profile).map_err(|e| io("growth.pb.gz", e))?;
    let svg = flamegraph(g).map_err(|e| io("growth.svg", e))?;
    plateau_reports::fsutil::write_atomic(&dir.join("growth.svg"), &svg).map_err(|e| io("growth.svg", e))
}

fn fmt_bytes(v: f64) -> String {
    plateau_reports::figures::fmt_value(v, "bytes")
}

/// The top growing stacks, one block each: the rate, then the project's frames, then how many
/// frames of the standard library and dependencies were left out.
pub fn growth_text(g: &Growth, requests_per_iter: Option<f64>, command: &str) -> String {
    let n = g.iterations();
    let per_req = |b: f64| requests_per_iter.map(|r| format!(", {}/request", fmt_bytes(b / r))).unwrap_or_default();
    let total = g.bytes_per_iter();
    let mut out = format!(
        "Heap growth between iterations {} and {} of {}:\n{}/iteration in all{}\n",
        g.start_iter,
        g.end_iter,
        g.source,
        fmt_bytes(total),
        per_req(total)
    );
    if !command.is_empty() {
        out.push_str(&format!("replay: {command}\n"));
    }
    if g.shrank.0 > 0 {
        out.push_str(&format!(
            "not counted: {} stacks that shrank in both halves of the window ({} net): memory given back\n",
            g.shrank.0,
            fmt_bytes(g.shrank.1 as f64)
        ));
    }
    if g.one_half_only.0 > 0 {
        out.push_str(&format!(
            "not counted: {} stacks that changed in one half of the window only ({} net): memory alive at one quiescent point and not another\n",
            g.one_half_only.0,
            fmt_bytes(g.one_half_only.1 as f64)
        ));
        for (f, _, bytes) in sites_of(&g.once).into_iter().filter(|s| s.2 > 0).take(3) {
            out.push_str(&format!(
                "  grew once in the window (a table that doubled, a buffer made again): {} at {} ({}:{})\n",
                fmt_bytes(bytes as f64),
                short_name(&f.function),
                f.file.as_deref().unwrap_or("?"),
                f.line.unwrap_or(0)
            ));
        }
    }
    for s in g.stacks.iter().take(10) {
        let b = s.bytes as f64 / n;
        let site = s.site().map(|f| {
            format!("{} ({}:{})", short_name(&f.function), f.file.as_deref().unwrap_or("?"), f.line.unwrap_or(0))
        });
        out.push_str(&format!(
            "\n{}/iteration, {:.1} objects/iteration{}: {}\n",
            fmt_bytes(b),
            s.objects as f64 / n,
            per_req(b),
            site.unwrap_or_else(|| "?".into())
        ));
        let mut others = 0;
        for f in s.flat().filter(|f| !f.is_allocator()) {
            if f.is_project() {
                out.push_str(&format!(
                    "    {}:{}  {}\n",
                    f.file.as_deref().unwrap_or("?"),
                    f.line.unwrap_or(0),
                    short_name(&f.function)
                ));
            } else {
                others += 1;
            }
        }
        if others > 0 {
            out.push_str(&format!("    (+{others} frames of the standard library and dependencies)\n"));
        }
    }
    out
}

/// A flamegraph of the bytes gained, stacks outermost first, allocator frames left out. Stacks
/// that gained nothing (or gave back, frees of older objects counted) are not drawn; with none
/// left the page says so.
fn flamegraph(g: &Growth) -> std::io::Result<Vec<u8>> {
    let title = format!("Heap gained between iterations {} and {}", g.start_iter, g.end_iter);
    let lines: Vec<String> = g
        .stacks
        .iter()
        .filter(|s| s.bytes > 0)
        .map(|s| {
            let names: Vec<String> = s
                .flat()
                .filter(|f| !f.is_allocator())
                .map(|f| short_name(&f.function).replace(';', ","))
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            format!("{} {}", if names.is_empty() { "?".to_string() } else { names.join(";") }, s.bytes)
        })
        .collect();
    if lines.is_empty() {
        return Ok(format!(
            "<?xml version=\"1.0\" standalone=\"no\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"600\" height=\"60\"><text x=\"10\" y=\"25\">{title}</text><text x=\"10\" y=\"45\">no stack gained memory</text></svg>\n"
        )
        .into_bytes());
    }
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = title;
    opts.count_name = "bytes".into();
    opts.deterministic = true;
    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), &mut svg)?;
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(file: &str, line: u32, objects: i64, bytes: i64) -> StackGrowth {
        let f = Frame::plateau_code(format!("f{line}"), Some(file.into()), Some(line));
        StackGrowth { addrs: vec![line as u64], frames: vec![vec![f]], objects, bytes }
    }

    struct ByAddress;
    impl Symbolize for ByAddress {
        fn frames(&self, addr: u64) -> Vec<Frame> {
            vec![Frame::plateau_code(format!("f{addr}"), Some("engine/src/x.rs".into()), Some(addr as u32))]
        }
    }

    fn dump(stacks: &[(u64, i64)]) -> HeapProfile {
        HeapProfile {
            sample_period: 1,
            stacks: stacks.iter().map(|&(a, b)| (vec![a], (1, b))).collect(),
            maps: String::new(),
        }
    }

    #[test]
    fn a_stack_counts_when_it_grew_in_both_halves() {
        // 1: a leak (grows in both halves); 2: a buffer alive at the middle only; 3: a pool made
        // again in the second half only; 4: steady; 5: an evicting cache's oldest entries, given
        // back in both halves.
        let (a, m, b) = (
            dump(&[(1, 1_000), (3, 500), (4, 64), (5, 900)]),
            dump(&[(1, 2_000), (2, 1 << 20), (3, 500), (4, 64), (5, 600)]),
            dump(&[(1, 3_100), (3, 900), (4, 64), (5, 200)]),
        );
        let g = growth_between([&a, &m, &b], (20, 60), "x".into(), &ByAddress);
        assert_eq!(g.stacks.len(), 1);
        assert_eq!((g.stacks[0].addrs.clone(), g.stacks[0].bytes), (vec![1], 2_100));
        assert_eq!(g.one_half_only, (1, 400), "the buffer came and went (net 0); the pool grew once");
        assert_eq!(g.shrank, (1, -700), "the cache's old entries shrank in both halves");
        assert_eq!(g.net_bytes_per_iter(), (2_100.0 + 400.0 - 700.0) / 40.0);
        assert_eq!(g.once.iter().map(|s| (s.addrs.clone(), s.bytes)).collect::<Vec<_>>(), vec![(vec![3], 400)]);
        assert_eq!(g.bytes_per_iter(), 2_100.0 / 40.0);
    }

    #[test]
    fn sites_merge_stacks_and_drop_the_harness_crumbs() {
        let g = Growth {
            binary: "plateau".into(),
            source: "a test".into(),
            start_iter: 20,
            end_iter: 60,
            stacks: vec![
                stack("engine/src/output.rs", 243, 800, 112_000),
                stack("engine/src/output.rs", 243, 10, 1_000),
                stack("engine/src/registry.rs", 208, 64, 24_000),
                stack("soak/src/driver/run_loop.rs", 173, 1, 32),
            ],
            one_half_only: (0, 0),
            shrank: (0, 0),
            once: Vec::new(),
        };
        let s = g.verdict_sites(Some(20.0), 5);
        assert_eq!(s.len(), 2, "{s:?}");
        assert_eq!((s[0].file.as_str(), s[0].line), ("engine/src/output.rs", 243));
        assert_eq!(s[0].bytes_per_iter, Some(113_000.0 / 40.0));
        assert_eq!(s[0].objects_per_iter, Some(810.0 / 40.0));
        assert_eq!(s[0].bytes_per_request, Some(113_000.0 / 40.0 / 20.0));
        assert_eq!(s[1].line, 208);
    }
}
