//! Evidence that a rise stopped, for the trend judge: a rate dying away quarter by quarter (a fill
//! approaching its bound) and a one-off step with level ground on both sides (a cache filled at
//! once, a buffer grown once). Each says what it saw; the judge decides what it means.

use super::series::fmt_value;
use super::stats::{best_split, mad_scale, mann_kendall, median, theil_sen};
use super::steps::STEP_NOISE_SCALES;
use super::DetectorConfig;

/// A last half whose last quarter rises at under this fraction of its third quarter's rate is
/// dying away: a cache filling towards its bound (exponential approach) drops to a quarter within
/// the last half of a run at least eight times its time constant, while a leak that slowed to a
/// persistent rate, or one that grows as the square root of the work, keeps most of its rate from
/// one quarter to the next (the square root keeps 86% at iterations 110-200).
pub(crate) const DECAY_FRACTION: f64 = 0.25;

/// The third and fourth quarters' rates of a last half whose rate is dying away (the fourth under
/// [`DECAY_FRACTION`] of a rising third), else None. A leak that keeps its rate keeps both
/// quarters alike.
pub(crate) fn dying_away(x: &[f64], y: &[f64]) -> Option<(f64, f64)> {
    let h = x.len() / 2;
    if h < 3 {
        return None;
    }
    let third = theil_sen(&x[..h], &y[..h]);
    let fourth = theil_sen(&x[h..], &y[h..]);
    (third > 0.0 && fourth < DECAY_FRACTION * third).then_some((third, fourth))
}

/// The rate of a fill that approaches its bound geometrically halves (or more) from quarter to
/// quarter of the judged series; a leak keeps its rate, and square-root growth loses 10-20% of it
/// a quarter. A Python server's objects in its first 60 iterations (interpreter caches filling:
/// 430, 180, then 83 B an iteration in the last three quarters) fall by less than
/// [`DECAY_FRACTION`] within the last half and fell as surely.
pub(crate) const HALVING_RATIO: f64 = 0.5;

/// The third and fourth quarters' rates of a series whose rate, rising in its second quarter,
/// fell by [`HALVING_RATIO`] or more into its third and again into its fourth; else None.
pub(crate) fn halving(x: &[f64], y: &[f64]) -> Option<(f64, f64)> {
    let q = x.len() / 4;
    if q < 3 {
        return None;
    }
    let rate = |k: usize| {
        let end = if k == 3 { x.len() } else { (k + 1) * q };
        theil_sen(&x[k * q..end], &y[k * q..end])
    };
    let (second, third, fourth) = (rate(1), rate(2), rate(3));
    (second > 0.0 && third <= HALVING_RATIO * second && fourth <= HALVING_RATIO * third.max(0.0))
        .then_some((third, fourth))
}

/// A one-off step in the last half: level ground, one rise, level ground.
pub(crate) struct Step {
    pub(crate) at_iter: f64,
    pub(crate) height: f64,
    /// Points after the step: too few and it cannot be told from the start of a leak.
    pub(crate) after: usize,
}

impl Step {
    pub(crate) fn describe(&self, unit: &str) -> String {
        if self.after < MIN_SIDE_AFTER_STEP {
            format!(
                "a step of {} at iteration {}, {} points before the end: too late to tell whether it levels off (undecided)",
                fmt_value(self.height, unit),
                self.at_iter,
                self.after
            )
        } else {
            format!(
                "a one-off step of {} at iteration {}, level before and after it (the last {} points): not a leak",
                fmt_value(self.height, unit),
                self.at_iter,
                self.after
            )
        }
    }
}

/// Points on each side of a step that it takes to call the side level.
pub(crate) const MIN_SIDE: usize = 3;
pub(crate) const MIN_SIDE_AFTER_STEP: usize = 6;

pub(crate) fn one_step(x: &[f64], y: &[f64], tail_slope: f64, q: f64, cfg: &DetectorConfig) -> Option<Step> {
    let k = best_split(y, MIN_SIDE)?;
    let (left, right) = (&y[..k], &y[k..]);
    let (lm, rm) = (median(&mut left.to_vec()), median(&mut right.to_vec()));
    let height = rm - lm;
    let fitted: Vec<f64> = left.iter().map(|v| v - lm).chain(right.iter().map(|v| v - rm)).collect();
    let noise = mad_scale(&fitted).max(q);
    let rising = |xs: &[f64], ys: &[f64]| {
        xs.len() >= MIN_SIDE && {
            let s = theil_sen(xs, ys);
            let mk = mann_kendall(xs, ys, s);
            mk.s > 0.0 && mk.p_increase < cfg.p_value
        }
    };
    // A second clear jump on either side makes it a staircase, which is how leaks of large
    // chunks grow, not one step.
    let another_jump = |ys: &[f64]| {
        best_split(ys, MIN_SIDE).is_some_and(|j| {
            let (a, b) = (median(&mut ys[..j].to_vec()), median(&mut ys[j..].to_vec()));
            (b - a).abs() >= STEP_NOISE_SCALES * noise
        })
    };
    // Level ground on both sides: within each side the series does not climb at anything like
    // the rate across the step (a noisy ramp splits into two halves that each still climb).
    let within = within_sides_slope(x, y, k);
    let level = !rising(&x[..k], left)
        && !rising(&x[k..], right)
        && !another_jump(left)
        && !another_jump(right)
        && within < LEVEL_FRACTION * tail_slope;
    (height >= STEP_NOISE_SCALES * noise && level).then_some(Step { at_iter: x[k], height, after: y.len() - k })
}

/// Within-side slopes under this fraction of the slope across a step call both sides level.
pub(crate) const LEVEL_FRACTION: f64 = 0.5;

/// The Theil–Sen slope over the pairs of points on the same side of split `k`.
fn within_sides_slope(x: &[f64], y: &[f64], k: usize) -> f64 {
    let mut slopes = Vec::new();
    for (a, b) in [(0, k), (k, x.len())] {
        for i in a..b {
            for j in i + 1..b {
                if x[j] != x[i] {
                    slopes.push((y[j] - y[i]) / (x[j] - x[i]));
                }
            }
        }
    }
    if slopes.is_empty() {
        0.0
    } else {
        median(&mut slopes)
    }
}
