//! The run's power for a gauge: the smallest steady leak this run would have failed, found by
//! adding candidate leaks to the run's own series (its own growth taken out first) and judging
//! again; and the first iteration at which a failing series was already conclusive.

use plateau_reports::Status;

use super::series::{Series, MIN_QUANTA};
use super::steps::staircase;
use super::trend::judge;
use super::DetectorConfig;

/// Steps tried when searching for the resolution: doubling from the first guess, then halving
/// the bracket. Bounds the search's cost to this many judgements per metric.
pub(crate) const RESOLUTION_DOUBLINGS: usize = 48;
pub(crate) const RESOLUTION_BISECTIONS: usize = 7;

/// Margin on the resolution: the rate where detection starts is found on this run's own noise; a
/// leak's own noise differs a little, and 20% more keeps a leak at the stated resolution caught
/// (the corpus's 1x leaks, at resolutions frozen when they were measured). With seven bisections
/// (the bracket to within 1%) the quoted figure stays within 25% of the smallest steady rate
/// that fails the same series, which `soak/tests/power.rs` checks on the engine's own heap.
pub(crate) const RESOLUTION_MARGIN: f64 = 1.2;

/// The run's power for this gauge: the smallest steady rate that fails this series when added to
/// it (per iteration), found by doubling from a first guess and then bisecting, with
/// [`RESOLUTION_MARGIN`]. A series that did not pass is judged with its own growth taken out
/// first (its steps where it climbs in steps, else its fitted line), so the figure says what this
/// run's noise would have let through, not how far its own growth sits from the line between
/// undecided and failed (a staircase one byte from significance "resolved" a fraction of a byte).
pub fn resolution(s: &Series, own_slope: f64, passed: bool, cfg: &DetectorConfig) -> f64 {
    let x0 = s.x[0];
    let base: Vec<f64> = if passed { s.y.to_vec() } else { without_growth(s.x, s.y, s.quantum, own_slope) };
    let span = s.x[s.x.len() - 1] - s.x[s.x.len() / 2];
    let fails = |r: f64| {
        let y: Vec<f64> = s.x.iter().zip(&base).map(|(a, b)| b + r * (a - x0)).collect();
        judge(&Series { y: &y, ..*s }, cfg).status == Status::Fail
    };
    let mut hi = (MIN_QUANTA * s.quantum / span.max(1.0)).max(s.tolerance_per_iter).max(f64::MIN_POSITIVE);
    let mut lo = 0.0;
    let mut found = false;
    for _ in 0..RESOLUTION_DOUBLINGS {
        if fails(hi) {
            found = true;
            break;
        }
        lo = hi;
        hi *= 2.0;
    }
    if !found {
        return f64::INFINITY;
    }
    for _ in 0..RESOLUTION_BISECTIONS {
        let mid = (lo + hi) / 2.0;
        if fails(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi * RESOLUTION_MARGIN
}

/// The series less its own growth: the heights of its steps where it climbs in steps with no
/// release, else its fitted line through the first point.
fn without_growth(x: &[f64], y: &[f64], quantum: f64, slope: f64) -> Vec<f64> {
    match staircase(x, y, quantum).filter(|st| st.downs == 0) {
        Some(st) => {
            x.iter().zip(y).map(|(a, b)| b - st.ups.iter().filter(|u| u.0 <= *a).map(|u| u.1).sum::<f64>()).collect()
        }
        None => x.iter().zip(y).map(|(a, b)| b - slope * (a - x[0])).collect(),
    }
}

/// The first iteration at which the series up to it already fails (checked at up to 40 points).
pub fn first_conclusive(s: &Series, cfg: &DetectorConfig) -> u64 {
    let n = s.x.len();
    let step = (n / 40).max(1);
    let mut k = cfg.min_points;
    while k <= n {
        let prefix = Series { x: &s.x[..k], y: &s.y[..k], ..*s };
        if judge(&prefix, cfg).status == Status::Fail {
            return s.x[k - 1] as u64;
        }
        k += step;
    }
    s.x[n - 1] as u64
}
