//! The trend layer for one gauge: does its quiescent series, after warm-up, grow without levelling
//! off, at a rate this run can resolve?
//!
//! A gauge fails when all of these hold (each for a reason given at its test):
//! 1. the rise is significant: Theil–Sen slope above the tolerance and a Mann–Kendall test,
//!    corrected for autocorrelation (Hamed–Rao), below `p_value`;
//! 2. it is more than noise in the metric's own units: at least `MIN_QUANTA` of its quantum over
//!    the series (a page for RSS, one for counts, a byte for the exactly settled heap);
//! 3. it has not levelled off: either it climbs in two or more steps with no release and the next
//!    step is not yet overdue (`steps.rs`), or the last half alone rises significantly, above the
//!    tolerance, by at least `MIN_TAIL_QUANTA` quanta, at a rate that is not dying away within it
//!    (a fill that approaches its bound slows down quarter by quarter; a leak that slowed to a
//!    persistent rate does not), however much faster the first half rose;
//! 4. that last-half rise is not one step with flat ground on both sides (a cache that filled at
//!    once, a buffer grown once).
//!
//! Two or more steps up with no release that are not yet significant, and whose next step is not
//! yet overdue, are inconclusive: the verdict says how long a run would show the next one. Steps
//! are weighed by the rate they imply (what they added over the iterations between them), never
//! by the average over the whole run, which dilutes steps that came late.
//!
//! Every outcome is decided once: a pass says what it saw (flat, within the tolerance, levelled
//! off after growth, a last half whose rise is within its noise, a fill dying away, a one-off
//! step with level ground after it); growth whose end this run cannot tell (a last half that
//! rises past its noise but not significantly, a step too near the end to see level ground after
//! it) is inconclusive with the length that would tell, never a pass.
//!
//! Every judged gauge also gets its resolution: the smallest steady rate that, added to this very
//! series, fails it. It is found by trying, so it accounts for everything above, noise included.

pub use plateau_reports::figures::fmt_value;
use plateau_reports::Status;

pub use super::power::{first_conclusive, resolution};
use super::release::{judge_released, releases};
use super::stats::{best_split, mad_scale, mann_kendall, median, theil_sen, MannKendall};
use super::steps::{staircase, step_noise, Staircase};
use super::DetectorConfig;

/// Growth smaller than this many quanta is never a trend: one page more RSS after a hundred
/// iterations, one more descriptor, is what a settling process does once. Three in a row that
/// never come back is a pattern a leak makes and a one-off does not.
pub const MIN_QUANTA: f64 = 3.0;

/// The last half must rise by at least this many quanta: two more descriptors in the last half
/// of a 60-iteration run are already more than a one-off, and one is not.
pub const MIN_TAIL_QUANTA: f64 = 2.0;

/// Growth over the series must also exceed this many noise scales (the robust spread of the
/// series around its line): a series that wanders by a few hundred bytes can drift by one spread
/// over a run by chance, far less often by two, while a leak's growth keeps adding to it.
pub const NOISE_SCALES: f64 = 2.0;

use super::steps::STEP_NOISE_SCALES;

/// A last half whose last quarter rises at under this fraction of its third quarter's rate is
/// dying away: a cache filling towards its bound (exponential approach) drops to a quarter within
/// the last half of a run at least eight times its time constant, while a leak that slowed to a
/// persistent rate, or one that grows as the square root of the work, keeps most of its rate from
/// one quarter to the next (the square root keeps 86% at iterations 110-200).
pub(crate) const DECAY_FRACTION: f64 = 0.25;

/// What one gauge's series looks like to the detector.
#[derive(Debug, Clone, PartialEq)]
pub struct Judgement {
    pub status: Status,
    pub reason: String,
    pub slope: f64,
    pub mk: MannKendall,
    pub tail_slope: f64,
    pub tail_p: f64,
    /// Growth over the judged series (slope times its span).
    pub growth: f64,
    pub noise: f64,
    /// For an undecided staircase: the run length that would show whether its next step comes.
    pub needs_iterations: Option<u64>,
}

/// The series of one gauge after warm-up: iterations `x`, values `y`, and how it is judged.
pub struct Series<'a> {
    pub x: &'a [f64],
    pub y: &'a [f64],
    pub unit: &'a str,
    pub quantum: f64,
    pub tolerance_per_iter: f64,
}

/// Judges a series with at least `cfg.min_points` points (the caller says inconclusive below).
/// A series that falls back to a floor at intervals is judged on its floors too (`release.rs`):
/// floors that rise fail; floors that rise but not yet significantly leave it undecided unless
/// the series fails on its own; level floors pass it, whatever its teeth.
pub fn judge(s: &Series, cfg: &DetectorConfig) -> Judgement {
    let plain = judge_series(s, cfg);
    match releases(s.x, s.y, s.quantum) {
        Some(r) => judge_released(&r, s, cfg, plain),
        None => plain,
    }
}

/// The trend layer on the series as it is (the module's rules).
fn judge_series(s: &Series, cfg: &DetectorConfig) -> Judgement {
    let (x, y) = (s.x, s.y);
    let n = x.len();
    assert!(n >= cfg.min_points && n == y.len(), "judge needs at least min_points points");
    let q = s.quantum;
    let slope = theil_sen(x, y);
    let mk = mann_kendall(x, y, slope);
    let resid: Vec<f64> = x.iter().zip(y).map(|(a, b)| b - slope * a).collect();
    let noise = mad_scale(&resid);
    let half = n / 2;
    let (tx, ty) = (&x[half..], &y[half..]);
    let tail_slope = theil_sen(tx, ty);
    let tail_mk = mann_kendall(tx, ty, tail_slope);
    let growth = slope * (x[n - 1] - x[0]);
    let tail_growth = tail_slope * (x[n - 1] - x[half]);
    let unit = s.unit;
    let v = |a: f64| fmt_value(a, unit);
    let rate = format!("{}/iteration", v(slope));
    let j = |status, reason| Judgement {
        status,
        reason,
        slope,
        mk,
        tail_slope,
        tail_p: tail_mk.p_increase,
        growth,
        noise,
        needs_iterations: None,
    };
    // A staircase counts when it rises by more than noise on the series' own terms too (its steps
    // clear the noise of successive points by construction; two series interleaved, such as
    // levels sampled alternately purged and not, can still cut into steps that do not clear the
    // spread around the line), and when the rate its steps imply is past the tolerance.
    let cut = staircase(x, y, q);
    // A rise that came in separated jumps is a staircase: its own rule (the next step overdue)
    // says whether it stopped, never a slowing last half, whose quarters a step may fall between.
    let jumps = cut.as_ref().is_some_and(|st| st.ups.len() >= 2);
    let stairs = cut.filter(|st| {
        st.climbs()
            && st.rise() >= MIN_QUANTA * q
            && st.rise() >= NOISE_SCALES * noise
            && st.implied_rate() > s.tolerance_per_iter
    });
    let climbing = stairs.as_ref().filter(|st| !st.levelled_off());
    if !(slope > 0.0 && mk.p_increase < cfg.p_value) {
        if let Some(st) = climbing {
            return Judgement {
                needs_iterations: Some(st.length_needed()),
                ..j(Status::Inconclusive, undecided_steps(st, unit))
            };
        }
        let what = if slope.abs() * (x[n - 1] - x[0]) < q { "flat" } else { "no significant rise" };
        return j(Status::Pass, format!("{what}: {rate}, p = {:.2}", mk.p_increase));
    }
    // Steps are judged by the rate they imply, before the slope's tolerance: a fitted line over
    // the whole run flattens steps that came late, and the next one adds as much again.
    if let Some(st) = climbing {
        return j(
            Status::Fail,
            format!(
                "grows in steps that have not stopped: {}, {} in all, {}/iteration between them, {rate} overall (p = {:.1e}); the next {} due by iteration {}",
                st.describe(),
                v(st.rise()),
                v(st.implied_rate()),
                mk.p_increase,
                if st.due_at() as f64 > st.end { "is" } else { "was" },
                st.due_at()
            ),
        );
    }
    if slope <= s.tolerance_per_iter {
        return j(
            Status::Pass,
            format!(
                "grows {rate} (p = {:.1e}), within the tolerance of {}/iteration",
                mk.p_increase,
                v(s.tolerance_per_iter)
            ),
        );
    }
    if growth < MIN_QUANTA * q {
        return j(
            Status::Pass,
            format!(
                "rose by {} over {n} points (p = {:.1e}): under {MIN_QUANTA} steps of {}, too little to call a trend",
                v(growth),
                mk.p_increase,
                v(q)
            ),
        );
    }
    if growth < NOISE_SCALES * noise {
        return j(
            Status::Pass,
            format!(
                "rose by {} over {n} points (p = {:.1e}), under {NOISE_SCALES} times its own noise ({}): a drift, not yet a trend",
                v(growth),
                mk.p_increase,
                v(noise)
            ),
        );
    }
    let tail_significant = tail_slope > 0.0 && tail_mk.p_increase < cfg.tail_p_value;
    let tail_rate = format!("{}/iteration", v(tail_slope));
    // Evidence that the rate fell: the first half rose at least four times as fast as the last
    // (a fill that approaches its bound), by more than the noise could explain.
    let head_slope = theil_sen(&x[..half], &y[..half]);
    let head_span = x[half.max(1) - 1] - x[0];
    let fell = head_slope > 0.0
        && tail_slope <= DECAY_FRACTION * head_slope
        && (head_slope - tail_slope.max(0.0)) * head_span >= NOISE_SCALES * noise;
    let fall = format!("the rate fell from {}/iteration to {tail_rate}", v(head_slope));
    // The last half's noise: the spread of its levels around its line, which slow wander
    // (autocorrelated noise) widens as it should, but never more than twice the spread of
    // successive differences, which a periodic shape riding on a leak (a rising sawtooth) does
    // not widen.
    let tail_resid: Vec<f64> = tx.iter().zip(ty).map(|(a, b)| b - tail_slope * a).collect();
    let tail_noise = mad_scale(&tail_resid).min(2.0 * step_noise(ty, q));
    if !tail_significant {
        // Levelled off, with evidence: the last half does not rise, or rises by less than the
        // metric's step, or the rate fell by more than the noise explains. A last half still
        // rising (inside its noise or past it) at a rate that did not fall is undecided.
        if tail_slope <= 0.0 || tail_growth < MIN_TAIL_QUANTA * q || (fell && tail_growth < NOISE_SCALES * tail_noise) {
            let why = if tail_slope > 0.0 && tail_growth >= MIN_TAIL_QUANTA * q {
                format!(
                    "{fall}, and the last half's rise of {} is within {NOISE_SCALES} times its noise ({})",
                    v(tail_growth),
                    v(tail_noise)
                )
            } else {
                format!("the last half moves {tail_rate} (p = {:.2}), {} in all", tail_mk.p_increase, v(tail_growth))
            };
            return j(Status::Pass, format!("grew by {} after warm-up ({rate}), then levelled off: {why}", v(growth)));
        }
        return Judgement {
            needs_iterations: Some(longer(x[n - 1])),
            ..j(
                Status::Inconclusive,
                format!(
                    "grows {rate} overall (p = {:.1e}) and the last half still rises by {} ({tail_rate}, its noise {}), not significantly (p = {:.2}) and at a rate that has not fallen: whether it levels off is undecided; a longer run would tell",
                    mk.p_increase,
                    v(tail_growth),
                    v(tail_noise),
                    tail_mk.p_increase
                ),
            )
        };
    }
    // The last half's rise as its two quarters' medians see it (twice their difference: the
    // whole half's rise for a steady rate), against the noise of successive points: a fill that
    // ended long ago leaves a remainder that a slope fitted over the half overstates.
    let h = ty.len() / 2;
    let quarters_rise = 2.0 * (median(&mut ty[h..].to_vec()) - median(&mut ty[..h].to_vec()));
    if quarters_rise < NOISE_SCALES * tail_noise && fell {
        // What is left of the rise in the last half is under what this run resolves there, and
        // the rate fell by more than the noise explains: levelled off, with that evidence.
        return j(
            Status::Pass,
            format!(
                "grew by {} ({rate}) and levelled off: {fall}, and the last half's quarters differ by {} only, within {NOISE_SCALES} times its noise ({})",
                v(growth),
                v(quarters_rise / 2.0),
                v(tail_noise)
            ),
        );
    }
    if let Some((third, fourth)) = (!jumps).then(|| dying_away(tx, ty).or_else(|| halving(x, y))).flatten() {
        return j(
            Status::Pass,
            format!(
                "grew by {} ({rate}) and is levelling off: the rate fell from {}/iteration to {}/iteration in the last two quarters (under a quarter of it, or halving quarter after quarter): a fill approaching its bound",
                v(growth),
                v(third),
                v(fourth)
            ),
        );
    }
    if tail_slope <= s.tolerance_per_iter {
        return j(
            Status::Pass,
            format!(
                "grew by {} ({rate}); the last half rises {tail_rate}, within the tolerance of {}/iteration",
                v(growth),
                v(s.tolerance_per_iter)
            ),
        );
    }
    if tail_growth < MIN_TAIL_QUANTA * q {
        return j(
            Status::Pass,
            format!(
                "grew by {} ({rate}); the last half rises by {} only, under {MIN_TAIL_QUANTA} steps of {}: levelled off to within the metric's own step",
                v(growth),
                v(tail_growth),
                v(q)
            ),
        );
    }
    if let Some(step) = one_step(tx, ty, tail_slope, q, cfg) {
        return if step.after < MIN_SIDE_AFTER_STEP {
            // The points after it are too few to tell a step from the start of a leak: a run
            // long enough to have them would.
            let spacing = (x[n - 1] - x[0]) / (n - 1).max(1) as f64;
            let needed = step.at_iter + MIN_SIDE_AFTER_STEP as f64 * spacing;
            Judgement { needs_iterations: Some(round_up_50(needed)), ..j(Status::Inconclusive, step.describe(unit)) }
        } else {
            j(Status::Pass, step.describe(unit))
        };
    }
    j(
        Status::Fail,
        format!(
            "grows without levelling off: {rate} (p = {:.1e}); the last half still {tail_rate} (p = {:.1e})",
            mk.p_increase, tail_mk.p_increase
        ),
    )
}

/// Iterations an undecided trend asks for when nothing in it says how many: half again as many
/// as it has (rounded up to 50), so that its last half alone has as many points as the whole had.
pub(crate) fn longer(last_iter: f64) -> u64 {
    round_up_50(last_iter * 1.5)
}

/// A run length rounded up to a multiple of 50 iterations.
pub(crate) fn round_up_50(iterations: f64) -> u64 {
    ((iterations / 50.0).ceil() * 50.0) as u64
}

/// The reason for a staircase that is not yet significant and not yet levelled.
fn undecided_steps(st: &Staircase, unit: &str) -> String {
    format!(
        "{}, {} in all, no release: not yet significant, and the next step is due by iteration {}; run {} iterations to see whether it comes",
        st.describe(),
        fmt_value(st.rise(), unit),
        st.due_at(),
        st.length_needed()
    )
}

/// The third and fourth quarters' rates of a last half whose rate is dying away (the fourth under
/// [`DECAY_FRACTION`] of a rising third), else None. A leak that keeps its rate keeps both
/// quarters alike.
fn dying_away(x: &[f64], y: &[f64]) -> Option<(f64, f64)> {
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
fn halving(x: &[f64], y: &[f64]) -> Option<(f64, f64)> {
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
struct Step {
    at_iter: f64,
    height: f64,
    /// Points after the step: too few and it cannot be told from the start of a leak.
    after: usize,
}

impl Step {
    fn describe(&self, unit: &str) -> String {
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

fn one_step(x: &[f64], y: &[f64], tail_slope: f64, q: f64, cfg: &DetectorConfig) -> Option<Step> {
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
