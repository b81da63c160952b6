//! Known entries weighed against a verdict's failing gauges (see the module's doc).
//!
//! 1. A failing gauge whose sites were judged: each leaking site it lists (at least
//!    [`LEAK_SHARE`] of its rise) is matched with the first entry of its process whose regular
//!    expression finds the site's name. Every one matched, at or under its entry's rate, before
//!    its date, and the matched leaks with the fills beside them explaining [`EXPLAINED`] of the
//!    gauge's rise: the gauge passes, naming the entries. One unmatched, faster, or expired: the
//!    gauge keeps its failure, and its reason says which.
//! 2. A failing gauge no site was listed for (`proc.anon_bytes`, a tree's sum), or whose accepted
//!    sites and fills explain less than [`EXPLAINED`] of it (a process's pages, whose listing
//!    holds malloc's sites but not the pages mapped beside them): it passes only when its rate
//!    per request is no more than the accepted sites of its processes account for (each site
//!    counted once: in the processes under a tree where they name it), divided by
//!    [`EXPLAINED`]. An undecided gauge no site decided (a process's page tables, stepping up as
//!    its accepted leak maps pages) is weighed by the same rule at its whole rise: its highest
//!    value in the judged window above its first, over the window's iterations (the caller's
//!    `undecided_rate`). A faster one stays undecided, and says why.

use std::collections::BTreeMap;

use plateau_detector::series::fmt_value;
use plateau_reports::{KnownEntry, MetricVerdict, Site, Status};

use super::{Entry, Known};
use crate::explain::{settle, under, EXPLAINED, LEAK_SHARE};

/// What became of one entry.
#[derive(Default)]
struct Use {
    matched: Vec<String>,
    exceeded: bool,
    expired: bool,
}

/// The entries as the verdict records them, and the attribution lines; gauges amended.
pub(super) fn apply(
    k: &Known,
    metrics: &mut [MetricVerdict],
    undecided_rate: &dyn Fn(&MetricVerdict) -> Option<f64>,
) -> (Vec<KnownEntry>, Vec<String>) {
    let mut uses: Vec<Use> = k.entries.iter().map(|_| Use::default()).collect();
    let mut lines = Vec::new();
    // (process prefix, site) -> its rate per request, for the gauges no site was listed for.
    let mut accepted: BTreeMap<(String, String), f64> = BTreeMap::new();
    // Gauges a named site keeps failing (unmatched, faster, expired): no rate can accept them.
    let mut named = std::collections::BTreeSet::new();
    let open = |m: &MetricVerdict| bytes_gauge(m, Status::Fail) || bytes_gauge(m, Status::Inconclusive);
    for m in metrics.iter_mut().filter(|m| open(m) && !m.sites.is_empty() && m.explained_share.is_some()) {
        match by_sites(k, m, &mut uses, &mut accepted) {
            BySites::Decided(line) => lines.push(line),
            BySites::Named(line) => {
                named.insert(m.name.clone());
                lines.push(line);
            }
            BySites::Unexplained | BySites::Nothing => {}
        }
    }
    for m in metrics.iter_mut().filter(|m| open(m) && !named.contains(&m.name)) {
        let rate = match m.status {
            Status::Fail => m.projected.as_ref().and_then(|p| p.per_request),
            _ => undecided_rate(m),
        };
        if let Some(line) = rate.and_then(|rate| by_rate(m, rate, &accepted)) {
            lines.push(line);
        }
    }
    let entries: Vec<KnownEntry> = k.entries.iter().zip(uses).map(|(e, u)| record(e, u)).collect();
    for (e, entry) in entries.iter().zip(&k.entries).filter(|(e, _)| e.state == "unmatched") {
        let expired = if entry.until < k.on { format!(" (expired: until {})", e.until) } else { String::new() };
        lines.push(format!(
            "known: entry {} of {} ({} at {}: {}){expired} matched no growing site in this run: fixed, or stale",
            e.entry, k.file, e.process, e.site, e.reason
        ));
    }
    (entries, lines)
}

/// Every entry recorded as not applied (plateau's own engine).
pub(super) fn not_applied(k: &Known) -> Vec<KnownEntry> {
    k.entries.iter().map(|e| KnownEntry { state: "not applied".into(), ..record(e, Use::default()) }).collect()
}

/// A byte gauge of `status`. Failing and undecided ones are weighed by their sites, then by their
/// rate (an undecided one at its whole rise in the judged window).
fn bytes_gauge(m: &MetricVerdict, status: Status) -> bool {
    m.status == status && m.kind == "gauge" && m.unit == "bytes"
}

/// The first clause of a gauge's reason: how it failed, before what was added to it.
fn first_clause(reason: &str) -> String {
    reason.split(';').next().unwrap_or_default().to_string()
}

/// A gauge's process: its name less the layer and the gauge (`target.engine_core` of
/// `target.engine_core.malloc.in_use_bytes`; `target` of a tree's sum `target.proc.rss`).
pub(crate) fn process_of(gauge: &str) -> &str {
    let mut cut = gauge;
    for _ in 0..2 {
        cut = cut.rsplit_once('.').map_or("", |(head, _)| head);
    }
    cut
}

/// Whether an entry's `process` names gauge prefix `prefix`: `*`, the prefix whole, or its last
/// part (the role); a tree's sum (`target`, `decode.target`) holds every process under it, so an
/// entry of any role may name its sites (each process's own gauges hold the entry to its role).
fn names(entry: &Entry, prefix: &str) -> bool {
    entry.process == "*"
        || entry.process == prefix
        || prefix.rsplit('.').next() == Some(entry.process.as_str())
        || prefix == "target"
        || prefix.ends_with(".target")
}

/// What step 1 made of a gauge.
enum BySites {
    /// Passed or undecided as known growth (the attribution line).
    Decided(String),
    /// A leaking site no entry covers, or one faster than its entry or past its date: it fails.
    Named(String),
    /// Every leaking site accepted, but they and the fills explain too little of the gauge's
    /// rise (a listing of one layer of the memory it measures): step 2 weighs its rate.
    Unexplained,
    /// No leaking site listed.
    Nothing,
}

/// Step 1 for one gauge.
fn by_sites(
    k: &Known,
    m: &mut MetricVerdict,
    uses: &mut [Use],
    accepted: &mut BTreeMap<(String, String), f64>,
) -> BySites {
    let prefix = process_of(&m.name).to_string();
    let leaking = |s: &Site| s.kind.as_deref() == Some("leak") && s.share.is_none_or(|x| x >= LEAK_SHARE);
    let mut problems = Vec::new();
    let mut covered_share = 0.0;
    let mut covered = Vec::new();
    for s in m.sites.iter().filter(|s| leaking(s)) {
        let name = s.place();
        let Some(i) = k.entries.iter().position(|e| names(e, &prefix) && e.site.is_match(&name)) else {
            problems.push(format!("{name} is in no known entry"));
            continue;
        };
        let e = &k.entries[i];
        let rate = s.per_request;
        uses[i].matched.push(KnownEntry::matched_line(&m.name, &name, &rate.map_or("no rate".into(), per_request)));
        if e.until < k.on {
            uses[i].expired = true;
            problems.push(format!("{name}: known entry {} expired: until {} ({})", e.number, e.until, e.reason));
        } else if rate.is_none_or(|r| r > e.max_per_request) {
            uses[i].exceeded = true;
            problems.push(format!(
                "{name} grows {}, above known entry {}'s {} ({})",
                rate.map_or("at an unmeasured rate".into(), per_request),
                e.number,
                per_request(e.max_per_request),
                e.reason
            ));
        } else {
            covered_share += s.share.unwrap_or(0.0);
            covered.push(format!(
                "{name} at {} under entry {} ({})",
                per_request(rate.unwrap_or(0.0)),
                e.number,
                e.reason
            ));
            let key = (prefix.clone(), name.clone());
            let r = accepted.entry(key).or_insert(0.0);
            *r = r.max(rate.unwrap_or(0.0));
        }
    }
    if covered.is_empty() && problems.is_empty() {
        return BySites::Nothing;
    }
    if !problems.is_empty() {
        m.reason.push_str(&format!("; known growth does not cover it: {}", problems.join("; ")));
        return BySites::Named(format!("known: {} still fails: {}", m.name, problems.join("; ")));
    }
    let share_of = |kind: &str| -> f64 {
        m.sites.iter().filter(|s| !leaking(s) && s.kind.as_deref() == Some(kind)).filter_map(|s| s.share).sum()
    };
    let (fills, undecided) = (share_of("fill"), share_of("undecided"));
    let rise = first_clause(&m.reason);
    if covered_share + fills >= EXPLAINED {
        let reason = format!(
            "known growth, accepted: {} ({:.0}% of its rise; fills {:.0}%); it failed as: {rise}",
            covered.join("; "),
            100.0 * covered_share,
            100.0 * fills
        );
        settle(m, Status::Pass, None, reason);
        BySites::Decided(format!("known: {} passes as known growth: {}", m.name, covered.join("; ")))
    } else if covered_share + fills + undecided >= EXPLAINED {
        let reason = format!(
            "known growth, {:.0}% of its rise ({}), the rest in sites not decided yet ({:.0}%): undecided",
            100.0 * covered_share,
            covered.join("; "),
            100.0 * undecided
        );
        settle(m, Status::Inconclusive, None, reason);
        BySites::Decided(format!("known: {} is known growth beside undecided sites", m.name))
    } else {
        m.reason.push_str(&format!(
            "; known entries cover {:.0}% of its rise and fills {:.0}%",
            100.0 * covered_share,
            100.0 * fills
        ));
        BySites::Unexplained
    }
}

/// What the accepted sites of process `prefix` and the processes under it keep a request: each
/// site's rate in the processes under it where they name it (a tree's sum lists its children's
/// sites again), else its own.
fn accepted_under(prefix: &str, accepted: &BTreeMap<(String, String), f64>) -> f64 {
    let tree = format!("{prefix}.");
    let mut by_site: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
    for ((p, site), r) in accepted {
        let e = by_site.entry(site.as_str()).or_default();
        if p == prefix {
            e.0 = e.0.max(*r);
        } else if under(&tree, &format!("{p}.")) {
            e.1 += r;
        }
    }
    by_site.values().map(|(own, children)| if *children > 0.0 { *children } else { *own }).sum()
}

/// Step 2 for one gauge no site explained: its rate a request against its processes' accepted
/// sites.
fn by_rate(m: &mut MetricVerdict, rate: f64, accepted: &BTreeMap<(String, String), f64>) -> Option<String> {
    let prefix = process_of(&m.name);
    let own = accepted_under(prefix, accepted);
    if own <= 0.0 {
        return None;
    }
    if rate <= own / EXPLAINED {
        let was = if m.status == Status::Fail { "it failed as" } else { "it was undecided as" };
        let reason = format!(
            "known growth, accepted: it rises {}, no more than the known sites of its processes account for ({}, at least {:.0}% of it); {was}: {}",
            per_request(rate),
            per_request(own),
            100.0 * EXPLAINED,
            first_clause(&m.reason)
        );
        settle(m, Status::Pass, None, reason);
        Some(format!(
            "known: {} passes: it rises {}, and the accepted sites of its processes keep {} (at least {:.0}% of it)",
            m.name,
            per_request(rate),
            per_request(own),
            100.0 * EXPLAINED
        ))
    } else {
        let why = format!(
            "known sites of its processes account for {} of its {}: the rest is growth no entry explains",
            per_request(own),
            per_request(rate)
        );
        m.reason.push_str(&format!("; {why}"));
        let still = if m.status == Status::Fail { "still fails" } else { "stays undecided" };
        Some(format!("known: {} {still}: {why}", m.name))
    }
}

fn per_request(b: f64) -> String {
    format!("{}/request", fmt_value(b, "bytes"))
}

fn record(e: &Entry, u: Use) -> KnownEntry {
    let state = if u.expired {
        "expired"
    } else if u.exceeded {
        "exceeded"
    } else if u.matched.is_empty() {
        "unmatched"
    } else {
        "accepted"
    };
    KnownEntry {
        entry: e.number,
        process: e.process.clone(),
        site: e.site_text.clone(),
        max_per_request: e.max_text.clone(),
        max_bytes_per_request: e.max_per_request,
        reason: e.reason.clone(),
        until: e.until.to_string(),
        state: state.into(),
        matched: u.matched,
    }
}
