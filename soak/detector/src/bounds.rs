//! Gauges judged against what bounds them. Some levels live inside others: the file-backed pages a
//! process has resident (`proc.rss_file`) can never exceed its file mappings (`proc.file_bytes`).
//! Pages the kernel brings in within mappings that do not grow (code paths run for the first time,
//! 64 KiB of fault-around at a time) raise the first in steps while the second stays put: that is
//! a fill towards a fixed ceiling, not memory taken. Mappings that grow are judged as themselves.
//!
//! A bound comes from the samples header (`within`), or for the samples v1 families from what the
//! family is (`ROLE.proc.rss_file` within `ROLE.proc.file_bytes`). The bounded gauge is first
//! judged alone (`gauge.rs`); when that is not a pass, it passes here only if its bound has values
//! at the same points, was itself judged to level off (pass or warn, never fail or inconclusive),
//! and the gauge never rose above it.

use plateau_reports::{MetricVerdict, Samples, Status};

use super::gauge::fmt_value;

/// The v1 families whose bound is known from what they are: (family, bounding family).
const FAMILY_BOUNDS: [(&str, &str); 1] = [("proc.rss_file", "proc.file_bytes")];

/// The gauge that bounds `name`, if any.
pub fn bound_of(s: &Samples, name: &str) -> Option<String> {
    if let Some(w) = s.header.metrics.get(name).and_then(|m| m.within.clone()) {
        return Some(w);
    }
    FAMILY_BOUNDS.iter().find_map(|(family, bound)| {
        let prefix = name.strip_suffix(family)?;
        (prefix.is_empty() || prefix.ends_with('.')).then(|| format!("{prefix}{bound}"))
    })
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
        if !matches!(bstatus, Status::Pass | Status::Warn) || m.trend.is_none() {
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
        m.reason = format!(
            "within its bound {bound} (at most {}, judged {}): rose by {} as pages were brought into mappings that did not grow, a fill towards a fixed ceiling, not memory taken",
            fmt_value(top, &m.unit),
            bstatus.as_str(),
            fmt_value(rose, &m.unit)
        );
    }
}
