//! A gauge's growth explained by its sites, inside the one judge ([`GaugeEvidence`]).
//!
//! Which sites a gauge holds follows from what it measures: a site allocates from one layer
//! (`Domain`), whose gauge is that layer's family under the site's process prefix
//! (`target.engine_core.malloc.in_use_bytes`); a tree's sums (`target.malloc.in_use_bytes`) hold
//! the sites of every process under them; and a gauge the header declares an overhead of a heap
//! (`proc.rss` of `malloc.in_use_bytes`, with Python's objects) holds the sites of that heap and of
//! the levels it is declared with.
//!
//! For every gauge that failed or is undecided, its sites that rose over the judged window are
//! judged ([`crate::judge`]) and listed with their kind, rate per request and share of the gauge's
//! rise; `explained_share` is the part of that rise they account for. Then:
//! - a gauge whose rise its sites explain ([`EXPLAINED`]) as fills alone is not a leak: it passes
//!   when every fill levelled off, and is undecided, with the length that decides, while a fill
//!   still dies away or a site is undecided;
//! - a gauge with a leaking site keeps its failure and names the site;
//! - an overhead of a heap that levelled off (the allocator's pages kept under churn: glibc's
//!   free chunks, the process's pages around them) whose rise is no more than the allocator's
//!   own (its overheads that hold nothing else) and at most the live heap it serves, in a process
//!   whose recorded sites hold no leak, is undecided with the length that decides: freed memory
//!   kept is no leak of the program's, yet an allocator can keep more and more of it
//!   (fragmentation), which only a longer run tells. Never a pass on this evidence alone.

use std::collections::BTreeMap;

use plateau_detector::series::fmt_value;
use plateau_detector::stats::median;
use plateau_detector::{DetectorConfig, GaugeEvidence, Overrides};
use plateau_reports::{MetricVerdict, Samples, Site, Status};

use super::judge::{judge_sites, SiteJudgement, SiteKind};
use super::read::SiteLog;
use super::record::{Domain, SiteDef};

/// A gauge whose sites account for at least this share of its rise is explained by them: what
/// is left is the allocator's rounding and headers (glibc adds 8-16 B to a chunk) and the
/// harness's and profiler's own objects, a few percent of any growth worth a verdict.
pub const EXPLAINED: f64 = 0.8;

/// Sites with less than this share of a gauge's rise are not listed (the verdict lists what
/// explains it, not every crumb).
pub const MIN_SHARE: f64 = 0.01;

/// Sites listed at most for one gauge, and judged at most: the largest risers, enough to explain
/// nearly all of a gauge's rise where a few sites hold it (a leak of a whole object graph spreads
/// over more: vLLM 0.8.5's finished sequence groups kept, its 20 largest lines hold 73% of the
/// engine process's Python objects' rise, and every line that rose 95%).
pub const MAX_SITES_LISTED: usize = 20;

/// A leaking site with less than this share of a gauge's rise does not make the gauge a leak's
/// (it is listed, and the gauge is judged on what explains the rest).
pub const LEAK_SHARE: f64 = 0.05;

/// Sites whose rises add up to more than this many times a gauge's are not what the gauge holds
/// (a heap of 355 KiB more against 12 KiB more of the allocator's bookkeeping): a gauge made of
/// its sites' bytes rises at least as much as they do, give or take the sampling's estimate.
pub const OUTGROWN: f64 = 1.5;

/// The rise of a judged series: the median of its last points less that of its first (a
/// twentieth of the series, 1 to 10 points, each end), the same measure for a gauge and its
/// sites.
pub fn window_rise(y: &[f64]) -> f64 {
    if y.is_empty() {
        return 0.0;
    }
    let k = (y.len() / 20).clamp(1, 10);
    median(&mut y[y.len() - k..].to_vec()) - median(&mut y[..k].to_vec())
}

/// The sites of a run as evidence for its gauges.
pub struct SiteEvidence<'a> {
    pub log: &'a SiteLog,
}

/// The prefix and layers whose sites a gauge holds, if any (see the module's doc).
pub(crate) fn holds(s: &Samples, name: &str) -> Option<(String, Vec<Domain>)> {
    let own = |n: &str| Domain::ALL.iter().find_map(|d| n.strip_suffix(d.family()).map(|p| (p.to_string(), *d)));
    if let Some((prefix, d)) = own(name) {
        return Some((prefix, vec![d]));
    }
    let spec = s.header.metrics.get(name)?;
    let (prefix, d) = own(spec.overhead_of.as_deref()?)?;
    let mut domains = vec![d];
    domains.extend(spec.overhead_with.iter().filter_map(|w| own(w)).filter(|(p, _)| *p == prefix).map(|(_, d)| d));
    Some((prefix, domains))
}

/// Whether a site of prefix `site` belongs to a gauge of prefix `gauge`: its own process, or a
/// process of the tree whose sums the gauge is.
pub(crate) fn under(gauge: &str, site: &str) -> bool {
    site == gauge || (gauge.ends_with("target.") && site.starts_with(gauge))
}

pub(crate) fn judged(s: &Samples, name: &str, warmup: u64) -> Vec<f64> {
    judged_points(s, name, warmup).1
}

/// A gauge's judged points: iterations and values.
fn judged_points(s: &Samples, name: &str, warmup: u64) -> (Vec<f64>, Vec<f64>) {
    let Some(i) = s.index(name) else { return (Vec::new(), Vec::new()) };
    s.quiescent_series(i).into_iter().filter(|(it, _)| *it > warmup).map(|(it, v)| (it as f64, v)).unzip()
}

/// What the evidence found for one gauge.
struct Explained {
    /// The gauge's own judged points.
    points: (Vec<f64>, Vec<f64>),
    rise: f64,
    listed: Vec<(usize, f64)>,
    /// What every site that rose accounts for (the verdict's `explained_share`).
    share: Option<f64>,
    /// What the listed (and judged) sites account for: what a decision on their kinds rests on.
    listed_share: f64,
}

impl SiteEvidence<'_> {
    /// The sites of gauge `name` that rose over the judged window, most first, with their rises.
    fn risers(&self, s: &Samples, name: &str, warmup: u64, rises: &mut BTreeMap<usize, f64>) -> Vec<(usize, f64)> {
        let Some((prefix, domains)) = holds(s, name) else { return Vec::new() };
        let mut out: Vec<(usize, f64)> = self
            .log
            .sites
            .iter()
            .filter(|d| domains.contains(&d.domain) && under(&prefix, &d.prefix))
            .map(|d| {
                let id = d.id as usize;
                let r = *rises.entry(id).or_insert_with(|| {
                    let y: Vec<f64> = self.log.series(id).into_iter().filter(|p| p.0 > warmup).map(|p| p.1).collect();
                    window_rise(&y)
                });
                (id, r)
            })
            .filter(|(_, r)| *r > 0.0)
            .collect();
        out.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        out
    }

    /// Whether the log recorded any site for gauge `name`'s process and layers.
    pub(crate) fn recorded_for(&self, s: &Samples, name: &str) -> bool {
        holds(s, name).is_some_and(|(prefix, domains)| {
            self.log.sites.iter().any(|d| domains.contains(&d.domain) && under(&prefix, &d.prefix))
        })
    }
}

impl GaugeEvidence for SiteEvidence<'_> {
    fn amend(
        &self,
        s: &Samples,
        metrics: &mut [MetricVerdict],
        cfg: &DetectorConfig,
        _requests_per_iter: Option<f64>,
    ) -> Vec<String> {
        let warmup = cfg.warmup_iterations;
        let mut lines: Vec<String> = self.log.notes.iter().map(|n| format!("sites: {n}")).collect();
        let mut rises = BTreeMap::new();
        let open = |m: &MetricVerdict| {
            m.kind == "gauge" && m.unit == "bytes" && matches!(m.status, Status::Fail | Status::Inconclusive)
        };
        // Each open gauge's risers; the union of the listed ones is judged once.
        let mut found: BTreeMap<String, Explained> = BTreeMap::new();
        for m in metrics.iter().filter(|m| open(m)) {
            let risers = self.risers(s, &m.name, warmup, &mut rises);
            if risers.is_empty() {
                continue;
            }
            let points = judged_points(s, &m.name, warmup);
            let rise = window_rise(&points.1);
            // Every site that rose counts in what the sites explain; the largest are listed (and
            // judged).
            let sum: f64 = risers.iter().map(|l| l.1).sum();
            let listed: Vec<(usize, f64)> = risers
                .into_iter()
                .filter(|(_, r)| rise <= 0.0 || *r >= MIN_SHARE * rise)
                .take(MAX_SITES_LISTED)
                .collect();
            // A gauge its sites outgrow many times over is not made of their bytes (the allocator's
            // bookkeeping of a heap that grew): its sites are named, no share is claimed.
            let share = (rise > 0.0 && sum <= OUTGROWN * rise).then(|| (sum / rise).min(1.0));
            let listed_sum: f64 = listed.iter().map(|l| l.1).sum();
            let listed_share = share.map(|_| (listed_sum / rise).min(1.0)).unwrap_or(0.0);
            found.insert(m.name.clone(), Explained { points, rise, listed, share, listed_share });
        }
        let mut ids: Vec<usize> = found.values().flat_map(|e| e.listed.iter().map(|l| l.0)).collect();
        ids.sort();
        ids.dedup();
        let overrides = Overrides { warmup: Some(warmup), tolerance: Some(cfg.tolerance) };
        let judgements: BTreeMap<usize, SiteJudgement> = match judge_sites(self.log, &ids, s, &overrides) {
            Ok(js) => js.into_iter().map(|j| (j.id, j)).collect(),
            Err(e) => {
                lines.push(format!("sites: not judged: {e}"));
                return lines;
            }
        };
        for m in metrics.iter_mut().filter(|m| open(m)) {
            let Some(e) = found.get(&m.name) else { continue };
            if let Some(line) = decide(m, e, &judgements, &self.log.sites) {
                lines.push(line);
            }
        }
        lines.extend(self.passed(s, metrics, warmup, &mut rises));
        self.churn(s, metrics, &judgements, cfg, &mut lines);
        lines
    }
}

/// The verdict's site for a judged one.
fn as_site(def: &SiteDef, j: &SiteJudgement, rise: f64, gauge_rise: Option<f64>) -> Site {
    let (file, line, function) = split_name(&def.name);
    Site {
        site: Some(def.name.clone()),
        kind: Some(j.kind.as_str().to_string()),
        per_request: j.per_request,
        share: gauge_rise.filter(|g| *g > 0.0).map(|g| (rise / g).min(1.0)),
        size_bytes: Some(j.size),
        bound_bytes: j.bound,
        reason: Some(j.reason.clone()),
        function,
        file,
        line,
        bytes_per_iter: Some(j.slope_per_iter),
        ..Site::default()
    }
}

/// `FILE:LINE FUNCTION` into its parts; `LIBRARY!FUNCTION` into the library and function.
fn split_name(name: &str) -> (String, u32, Option<String>) {
    if let Some((lib, f)) = name.split_once('!') {
        return (lib.to_string(), 0, Some(f.to_string()));
    }
    let (place, function) = name.split_once(' ').map_or((name, None), |(p, f)| (p, Some(f.to_string())));
    match place.rsplit_once(':') {
        Some((file, line)) => (file.to_string(), line.parse().unwrap_or(0), function),
        None => (place.to_string(), 0, function),
    }
}

/// The sites of one name in several layers (a line whose objects are Python's small ones and
/// malloc's larger ones, both held by the process's pages) listed once: their shares and rates
/// added, the line judged as its least settled part (a leak if either part is one).
fn one_per_name(sites: Vec<(Site, &SiteJudgement)>) -> Vec<(Site, &SiteJudgement)> {
    let mut out: Vec<(Site, &SiteJudgement)> = Vec::new();
    for (s, j) in sites {
        let Some(k) = out.iter().position(|(o, _)| o.site == s.site) else {
            out.push((s, j));
            continue;
        };
        let (o, oj) = &mut out[k];
        let add = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        o.share = add(o.share, s.share).map(|x| x.min(1.0));
        o.per_request = add(o.per_request, s.per_request);
        o.size_bytes = add(o.size_bytes, s.size_bytes);
        o.bound_bytes = add(o.bound_bytes, s.bound_bytes);
        o.bytes_per_iter = add(o.bytes_per_iter, s.bytes_per_iter);
        // The part that says least for it speaks for the line: a leak, else what is undecided.
        let weight = |j: &SiteJudgement| match (j.kind, j.status) {
            (SiteKind::Leak, _) => 2,
            (_, Status::Pass) => 0,
            _ => 1,
        };
        if weight(j) > weight(oj) {
            o.kind = s.kind.clone();
            o.reason = s.reason.clone();
            *oj = j;
        }
    }
    out
}

/// One site for a person: `NAME (leak, 512 B/request, 98%)`.
fn say(s: &Site) -> String {
    let rate = s.per_request.map(|r| format!(", {}/request", fmt_value(r, "bytes"))).unwrap_or_default();
    let share = s.share.map(|x| format!(", {:.0}%", 100.0 * x)).unwrap_or_default();
    format!("{} ({}{rate}{share})", s.place(), s.kind.as_deref().unwrap_or("?"))
}

/// Lists gauge `m`'s sites and decides what its growth is (see the module's doc); returns the
/// verdict's attribution line for it.
fn decide(
    m: &mut MetricVerdict,
    e: &Explained,
    judgements: &BTreeMap<usize, SiteJudgement>,
    defs: &[SiteDef],
) -> Option<String> {
    let sites = one_per_name(
        e.listed
            .iter()
            .filter_map(|(id, r)| judgements.get(id).map(|j| (as_site(&defs[*id], j, *r, e.share.map(|_| e.rise)), j)))
            .collect(),
    );
    if sites.is_empty() {
        return None;
    }
    let explained = e.share.unwrap_or(0.0);
    let leaks: Vec<&Site> = sites
        .iter()
        .filter(|(s, j)| j.kind == SiteKind::Leak && s.share.is_none_or(|x| x >= LEAK_SHARE))
        .map(|(s, _)| s)
        .collect();
    let said: Vec<String> = sites.iter().map(|(s, _)| say(s)).collect();
    let line = match e.share {
        Some(x) => format!(
            "sites: {} rose {} over its judged window; its sites explain {:.0}% of it: {}",
            m.name,
            fmt_value(e.rise, &m.unit),
            100.0 * x,
            said.join("; ")
        ),
        None => format!(
            "sites: {} rose {} over its judged window, the heap it serves far more, at: {}",
            m.name,
            fmt_value(e.rise, &m.unit),
            said.join("; ")
        ),
    };
    if let Some(top) = leaks.first() {
        m.reason.push_str(&format!("; grown at {}", say(top)));
    } else if e.listed_share >= EXPLAINED {
        let fills: Vec<&SiteJudgement> = sites.iter().map(|(_, j)| *j).collect();
        let all_level = fills.iter().all(|j| j.kind == SiteKind::Fill && j.status == Status::Pass);
        let what: Vec<String> = sites.iter().map(|(s, _)| fill_story(s)).collect();
        if all_level {
            let reason = format!(
                "grew by {}, {:.0}% of it in sites that filled and levelled off or turn over, none leaking: {}",
                fmt_value(e.rise, &m.unit),
                100.0 * explained,
                what.join("; ")
            );
            settle(m, Status::Pass, None, reason);
        } else {
            let needs = fills.iter().filter_map(|j| j.needs_iterations).max();
            let reason = format!(
                "grew by {}, {:.0}% of it in sites that are no leak but have not levelled off yet: {}{}",
                fmt_value(e.rise, &m.unit),
                100.0 * explained,
                what.join("; "),
                needs.map(|n| format!("; {n} iterations would decide")).unwrap_or_default()
            );
            settle(m, Status::Inconclusive, needs, reason);
        }
    } else if let (Status::Fail, Some(d)) = (m.status, unblamed_fill(e)) {
        let reason = format!(
            "{}; no site of it leaks (its sites explain {:.0}% of it, as fills), and it rises as a fill dying away: its last half rose {:.0}% as much as its first (at most {:.0}%), toward about {}: undecided; {} iterations would decide",
            m.reason.split("; that is").next().unwrap_or_default(),
            100.0 * explained,
            100.0 * d.half_ratio,
            100.0 * super::judge::DYING_HALF_RATIO,
            fmt_value(d.bound, &m.unit),
            d.needs_iterations
        );
        settle(m, Status::Inconclusive, Some(d.needs_iterations), reason);
    } else if m.status == Status::Fail && e.share.is_some() {
        m.reason.push_str(&format!("; its recorded sites explain {:.0}% of it", 100.0 * explained));
    }
    m.sites = sites.into_iter().map(|(s, _)| s).collect();
    m.explained_share = e.share;
    Some(line)
}

/// A gauge none of whose sites leaks, whose own series rises as a fill dying away (the same rule
/// a site is judged a fill by: `judge::dying_fill`, never for steps that have not stopped): what
/// its sites do not explain (an allocator's pages kept, a profiler's own tables) levels off with
/// what they do. Undecided, never a pass: the verdict asks for the length that would show it level.
fn unblamed_fill(e: &Explained) -> Option<super::judge::DyingFill> {
    let (x, y) = &e.points;
    let climbing = plateau_detector::steps::staircase(x, y, 1.0).is_some_and(|st| st.climbs());
    (!climbing).then(|| super::judge::dying_fill(x, y)).flatten()
}

/// A gauge decided by its sites: its status, the length that would decide it, and why; no
/// failure's first iteration or projection stays on it.
pub(crate) fn settle(m: &mut MetricVerdict, status: Status, needs_iterations: Option<u64>, reason: String) {
    m.status = status;
    m.first_iter = None;
    m.projected = None;
    m.needs_iterations = needs_iterations;
    m.reason = reason;
}

/// A fill as the verdict tells it: its size and, where known, its bound.
fn fill_story(s: &Site) -> String {
    let size = s.size_bytes.map(|b| fmt_value(b, "bytes")).unwrap_or_default();
    let bound = match (s.kind.as_deref(), s.bound_bytes) {
        (Some("fill"), Some(b)) if s.reason.as_deref().is_some_and(|r| r.starts_with("a fill dying")) => {
            format!(", dying away toward about {}", fmt_value(b, "bytes"))
        }
        (Some("fill"), Some(b)) => format!(", level at about {}", fmt_value(b, "bytes")),
        _ => String::new(),
    };
    format!("{} ({}, {size} held{bound})", s.place(), s.kind.as_deref().unwrap_or("?"))
}

impl SiteEvidence<'_> {
    /// For each heap layer that passed with sites recorded (`--profile`, or a run whose other
    /// gauges called for them), what rose most at its sites, blaming nothing.
    fn passed(
        &self,
        s: &Samples,
        metrics: &[MetricVerdict],
        warmup: u64,
        rises: &mut BTreeMap<usize, f64>,
    ) -> Vec<String> {
        let layer = |n: &str| Domain::ALL.iter().any(|d| n.ends_with(d.family()));
        let mut out = Vec::new();
        for m in metrics.iter().filter(|m| m.status == Status::Pass && m.kind == "gauge" && layer(&m.name)) {
            let risers = self.risers(s, &m.name, warmup, rises);
            if risers.is_empty() {
                continue;
            }
            let top: Vec<String> = risers
                .iter()
                .take(3)
                .map(|(id, r)| format!("{} (+{})", self.log.sites[*id].name, fmt_value(*r, &m.unit)))
                .collect();
            out.push(format!(
                "sites: {} passed; its sites that rose most over the judged window, none blamed: {}",
                m.name,
                top.join("; ")
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_split_into_file_line_and_function_or_library() {
        assert_eq!(split_name("sites_server.py:32 remember"), ("sites_server.py".into(), 32, Some("remember".into())));
        assert_eq!(split_name("libledger.so!ledger_worker"), ("libledger.so".into(), 0, Some("ledger_worker".into())));
        assert_eq!(
            split_name("engine/src/output.rs:265 plateau_engine::output::OutputProcessor::finalize"),
            ("engine/src/output.rs".into(), 265, Some("plateau_engine::output::OutputProcessor::finalize".into()))
        );
    }

    #[test]
    fn a_tree_sum_holds_its_processes_sites_and_a_process_only_its_own() {
        assert!(under("target.", "target.engine_core."));
        assert!(under("target.", "target."));
        assert!(!under("target.engine_core.", "target.worker."));
        assert!(!under("", "decode."), "plateau's own heap is not a node's");
        assert_eq!(window_rise(&[1.0, 2.0, 3.0]), 2.0);
    }
}
