//! The allocator's pages kept under churn: an overhead of a heap that levelled off (malloc's free
//! bytes, the process's pages around them) whose rise is the allocator keeping freed pages, in a
//! process whose recorded sites hold no leak, is undecided with the length that decides, never
//! failed as a leak and never passed on this evidence alone (the module doc of `explain.rs`).

use std::collections::BTreeMap;

use plateau_detector::series::{fmt_value, round_up_50};
use plateau_detector::DetectorConfig;
use plateau_reports::{MetricVerdict, Samples, Status};

use super::explain::{holds, judged, settle, under, window_rise, SiteEvidence};
use super::judge::{SiteJudgement, SiteKind};

/// The process's pages may rise this many times what the allocator keeps and still be its
/// keeping (see `churn`): in the churning stdlib server of soak/README.md's cases, malloc's freed
/// memory and the pages rose by the same 244 KiB.
const KEPT_SLACK: f64 = 1.25;

impl SiteEvidence<'_> {
    /// The allocator's pages kept under churn (see the module's doc): overheads of a heap that
    /// levelled off, in a process whose sites hold no leak, are undecided, never failed as leaks.
    pub(crate) fn churn(
        &self,
        s: &Samples,
        metrics: &mut [MetricVerdict],
        judgements: &BTreeMap<usize, SiteJudgement>,
        cfg: &DetectorConfig,
        lines: &mut Vec<String>,
    ) {
        let warmup = cfg.warmup_iterations;
        let status: BTreeMap<String, Status> = metrics.iter().map(|m| (m.name.clone(), m.status)).collect();
        let passed = |n: &str| status.get(n) == Some(&Status::Pass);
        for m in
            metrics.iter_mut().filter(|m| m.kind == "gauge" && matches!(m.status, Status::Fail | Status::Inconclusive))
        {
            let Some(spec) = s.header.metrics.get(&m.name) else { continue };
            let Some(heap) = spec.overhead_of.clone() else { continue };
            if !passed(&heap) || !spec.overhead_with.iter().all(|w| passed(w)) || !self.recorded_for(s, &heap) {
                continue;
            }
            let leak = m.sites.iter().any(|x| x.kind.as_deref() == Some("leak"))
                || judgements.values().any(|j| {
                    j.kind == SiteKind::Leak
                        && holds(s, &heap).is_some_and(|(p, _)| under(&p, &self.log.sites[j.id].prefix))
                });
            if leak {
                continue;
            }
            let rise = window_rise(&judged(s, &m.name, warmup));
            // The allocator's own overheads of the same heap (declared with nothing else beside).
            let kept: f64 = s
                .header
                .metrics
                .iter()
                .filter(|(n, sp)| {
                    sp.overhead_of.as_deref() == Some(heap.as_str()) && sp.overhead_with.is_empty() && *n != &m.name
                })
                .map(|(n, _)| window_rise(&judged(s, n, warmup)).max(0.0))
                .sum();
            let own = spec.overhead_with.is_empty();
            let live = judged(s, &heap, warmup);
            let live = live.last().copied().unwrap_or(0.0);
            let quantum = m.trend.as_ref().map_or(1.0, |t| t.quantum);
            // The pages' rise must be the allocator's kept memory: it comes a page at a time
            // (two quanta: the rounding at either end) and with the pages around the kept chunks
            // touched (a quarter more); pages that rose beyond it are memory of another kind.
            let matched = own || rise <= KEPT_SLACK * kept + 2.0 * quantum;
            if rise <= 0.0 || !matched || rise > live {
                continue;
            }
            let last = s.rows.iter().filter(|r| r.quiescent).map(|r| r.iter).max().unwrap_or(0) as f64;
            let needs = m.needs_iterations.unwrap_or_else(|| round_up_50(last * 1.5));
            let v = |x: f64| fmt_value(x, &m.unit);
            let reason = format!(
                "{}; but the heap it serves ({heap}, {} live) levelled off and its recorded sites hold no leak, and this rise of {} is the allocator keeping freed pages under churn{}, at most the live heap: freed memory kept is no leak of the program's, yet whether the allocator stops keeping more (fragmentation that levels off) needs a longer run: undecided; {needs} iterations would tell",
                m.reason.split("; that is").next().unwrap_or_default(),
                v(live),
                v(rise),
                if own { String::new() } else { format!(" (the allocator's own overheads rose {})", v(kept)) }
            );
            settle(m, Status::Inconclusive, Some(needs), reason);
            lines.push(format!("sites: {} is the allocator's pages kept under churn, undecided: {}", m.name, m.reason));
        }
    }
}
