//! Gauges judged against what bounds them. Some levels live inside others: the file-backed pages a
//! process has resident (`proc.rss_file`) can never exceed its file mappings (`proc.file_bytes`).
//! Pages the kernel brings in within mappings that do not grow (code paths run for the first time,
//! 64 KiB of fault-around at a time) raise the first in steps while the second stays put: that is
//! a fill towards a fixed ceiling, not memory taken. Mappings that grow are judged as themselves.
//!
//! A bound is a relation the samples header declares (`within`; the reader fills in the v1
//! families' own where a writer declared none). The bounded gauge is first judged alone
//! (`gauge.rs`); when that is not a pass, the bound is the evidence that decides it: it passes
//! only if it was judged on enough points of its own (a trend), its bound has values at the same
//! points, was itself judged a pass (never fail or inconclusive), and the gauge never rose above
//! it. A bound that did not pass leaves the gauge's own verdict as it was.

use plateau_reports::{MetricVerdict, Samples, Status};

use super::series::fmt_value;

/// The gauge that bounds `name`, as the header declares it.
pub fn bound_of(s: &Samples, name: &str) -> Option<String> {
    s.header.metrics.get(name).and_then(|m| m.within.clone())
}

/// Quiescent (iteration, value) points of a metric.
fn series(s: &Samples, name: &str) -> Vec<(u64, f64)> {
    s.names.iter().position(|n| n == name).map(|i| s.quiescent_series(i)).unwrap_or_default()
}

/// Turns a non-passing gauge into a pass when it stayed within a bound that levelled off.
pub fn apply(s: &Samples, metrics: &mut [MetricVerdict]) {
    let bound_status: Vec<(String, Status, String)> =
        metrics.iter().map(|m| (m.name.clone(), m.status, m.reason.clone())).collect();
    for m in metrics.iter_mut().filter(|m| m.kind == "gauge" && matches!(m.status, Status::Fail | Status::Inconclusive))
    {
        let Some(bound) = bound_of(s, &m.name) else { continue };
        let Some((_, bstatus, _)) = bound_status.iter().find(|b| b.0 == bound) else { continue };
        if *bstatus != Status::Pass || m.trend.is_none() {
            continue;
        }
        let own = series(s, &m.name);
        let ceiling: std::collections::BTreeMap<u64, f64> = series(s, &bound).into_iter().collect();
        let paired: Vec<(f64, f64)> = own.iter().filter_map(|(it, v)| ceiling.get(it).map(|c| (*v, *c))).collect();
        if paired.is_empty() || paired.len() < own.len() || paired.iter().any(|(v, c)| v > c) {
            continue;
        }
        let top = paired.iter().map(|p| p.1).fold(f64::MIN, f64::max);
        let rose = m.trend.as_ref().map_or(0.0, |t| t.growth_after_warmup);
        m.status = Status::Pass;
        m.first_iter = None;
        m.projected = None;
        m.needs_iterations = None;
        m.reason = format!(
            "within its bound {bound} (at most {}, judged {}): rose by {} as pages were brought into mappings that did not grow, a fill towards a fixed ceiling, not memory taken",
            fmt_value(top, &m.unit),
            bstatus.as_str(),
            fmt_value(rose, &m.unit)
        );
    }
}
