//! A run reduced to what a reader compares: per metric its status, its level at the end and its
//! slope; and a metric's series thinned for drawing. The report's baseline table and the history
//! database use the same figures, so a level in one is the level in the other.

use crate::samples::{Kind, Samples};
use crate::verdict::{MetricVerdict, Status, Verdict};

/// One metric of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricFigures {
    pub name: String,
    pub kind: Kind,
    pub unit: String,
    /// None when the verdict does not judge it (observed metrics, counters).
    pub status: Option<Status>,
    /// Median of the last tenth of quiescent values after warm-up (of every quiescent value when
    /// the run is shorter than its warm-up); None when the metric was never read at a quiescent point.
    pub level: Option<f64>,
    /// The verdict's Theil–Sen slope, unit per iteration (gauges only).
    pub slope_per_iter: Option<f64>,
}

/// The median of `v`, None when it is empty; reorders `v` (a selection, not a sort). Samples hold
/// finite numbers, so no NaN decides an order.
pub fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let m = v.len() / 2;
    let (_, &mut upper, _) = v.select_nth_unstable_by(m, f64::total_cmp);
    Some(if v.len() % 2 == 1 {
        upper
    } else {
        // The lower middle is the largest value left of `m` after the selection.
        let lower = v[..m].iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (lower + upper) / 2.0
    })
}

/// The end level of a quiescent series: see [`MetricFigures::level`].
pub fn level(series: &[(u64, f64)], warmup_iterations: u64) -> Option<f64> {
    let after: Vec<f64> = series.iter().filter(|p| p.0 > warmup_iterations).map(|p| p.1).collect();
    let pool: Vec<f64> = if after.is_empty() { series.iter().map(|p| p.1).collect() } else { after };
    let tenth = pool.len().div_ceil(10);
    median(&mut pool[pool.len() - tenth..].to_vec())
}

/// Every metric of the samples file, in the header's (name) order.
pub fn of_run(s: &Samples, v: &Verdict) -> Vec<MetricFigures> {
    s.names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let spec = &s.header.metrics[name];
            let judged: Option<&MetricVerdict> = v.metrics.iter().find(|m| &m.name == name);
            MetricFigures {
                name: name.clone(),
                kind: spec.kind,
                unit: spec.unit.clone(),
                status: judged.map(|m| m.status),
                level: level(&s.quiescent_series(i), v.warmup_iterations),
                slope_per_iter: judged.and_then(|m| m.trend.as_ref()).map(|t| t.slope_per_iter),
            }
        })
        .collect()
}

/// At most `2 * buckets` points of `pts` (sorted by x): the lowest and the highest of each bucket,
/// in order, so that a spike survives thinning. Short series are returned whole.
pub fn thin(pts: &[(f64, f64)], buckets: usize) -> Vec<(f64, f64)> {
    assert!(buckets > 0, "thinning needs at least one bucket");
    if pts.len() <= 2 * buckets {
        return pts.to_vec();
    }
    let size = pts.len().div_ceil(buckets);
    let mut out = Vec::with_capacity(2 * buckets);
    for chunk in pts.chunks(size) {
        let lo = chunk.iter().enumerate().min_by(|a, b| a.1 .1.total_cmp(&b.1 .1)).map(|x| x.0).unwrap_or(0);
        let hi = chunk.iter().enumerate().max_by(|a, b| a.1 .1.total_cmp(&b.1 .1)).map(|x| x.0).unwrap_or(0);
        let (a, b) = (lo.min(hi), lo.max(hi));
        out.push(chunk[a]);
        if b != a {
            out.push(chunk[b]);
        }
    }
    out
}

/// The order a report lists metrics in: failing first, then not judged, passes, and shown-only
/// metrics last; by name within each.
pub fn report_rank(status: Option<Status>) -> u8 {
    match status {
        Some(Status::Fail) => 0,
        Some(Status::Inconclusive) => 1,
        Some(Status::Pass) => 2,
        None => 3,
    }
}

/// A byte or count value with a unit a person reads, with the precision a verdict's small rates
/// need (`45.78 MiB`, `2.0 KiB`, `26 B`, `0.04 B`; counts `41`, `0.125`): one format for verdicts,
/// reports, plots and history alike.
pub fn fmt_value(v: f64, unit: &str) -> String {
    let a = v.abs();
    if unit != "bytes" {
        return if a >= 10.0 || v.fract() == 0.0 { format!("{v:.0}") } else { format!("{v:.3}") };
    }
    match byte_scale(a) {
        (_, "B") if a >= 10.0 || a == 0.0 => format!("{v:.0} B"),
        (_, "B") => format!("{v:.2} B"),
        (div, "KiB") => format!("{:.1} KiB", v / div),
        (div, suffix) => format!("{:.2} {suffix}", v / div),
    }
}

/// The divisor and suffix that show `max_abs` bytes in a readable unit.
pub fn byte_scale(max_abs: f64) -> (f64, &'static str) {
    const UNITS: [(f64, &str); 4] =
        [(1024.0 * 1024.0 * 1024.0, "GiB"), (1024.0 * 1024.0, "MiB"), (1024.0, "KiB"), (1.0, "B")];
    UNITS.into_iter().find(|(d, _)| max_abs >= *d).unwrap_or((1.0, "B"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn level_is_the_median_of_the_last_tenth_after_warmup() {
        let series: Vec<(u64, f64)> = (1..=120).map(|i| (i, i as f64)).collect();
        // After warm-up 20: iterations 21..=120 (100 points), last tenth 111..=120, median 115.5.
        assert_eq!(level(&series, 20), Some(115.5));
        // A run shorter than its warm-up still has a level: the last tenth of what it has.
        assert_eq!(level(&series[..5], 20), Some(5.0));
        assert_eq!(level(&[], 20), None);
    }

    #[test]
    fn thinning_keeps_spikes_and_bounds_the_points() {
        let mut pts: Vec<(f64, f64)> = (0..10_000).map(|i| (i as f64, 1.0)).collect();
        pts[5_000].1 = 99.0;
        let t = thin(&pts, 100);
        assert!(t.len() <= 200, "{} points", t.len());
        assert!(t.iter().any(|p| p.1 == 99.0), "the spike was thinned away");
        assert!(t.windows(2).all(|w| w[0].0 <= w[1].0), "points out of order");
        assert_eq!(thin(&pts[..50], 100).len(), 50);
    }

    #[test]
    fn the_median_selects_the_middle_of_odd_and_even_series() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&mut []), None);
    }

    #[test]
    fn values_read_in_their_unit() {
        assert_eq!(fmt_value(2048.0, "bytes"), "2.0 KiB");
        assert_eq!(fmt_value(512.0, "bytes"), "512 B");
        assert_eq!(fmt_value(3.0 * 1024.0 * 1024.0, "bytes"), "3.00 MiB");
        assert_eq!(fmt_value(0.04, "bytes"), "0.04 B");
        assert_eq!(fmt_value(0.0, "bytes"), "0 B");
        assert_eq!(fmt_value(41.0, "count"), "41");
        assert_eq!(fmt_value(3.0, "count"), "3");
        assert_eq!(fmt_value(0.125, "count"), "0.125");
    }
}
