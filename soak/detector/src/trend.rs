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

//!
//! The rules are [`RULES`], tried in order: the first that decides gives the judgement, and a
//! series no rule lets off fails. Each rule is a small function with its reason beside it; the
//! facts they read ([`Facts`]) are fitted once per series.

use plateau_reports::Status;

use super::facts::Facts;
use super::levelling::{dying_away, halving, one_step, MIN_SIDE_AFTER_STEP};
use super::release::{judge_released, releases};
use super::series::{fmt_value, longer, round_up_50, Judgement, Series, MIN_QUANTA, MIN_TAIL_QUANTA, NOISE_SCALES};
use super::stats::median;
use super::steps::Staircase;
use super::DetectorConfig;

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

/// A rule of the trend judge: a judgement where it decides the series, else None.
type Rule = fn(&Facts) -> Option<Judgement>;

/// The trend judge's rules in the order they are tried (the module's doc gives each reason).
const RULES: [(&str, Rule); 11] = [
    ("no-significant-rise", no_significant_rise),
    ("climbing-steps", climbing_steps),
    ("within-tolerance", within_tolerance),
    ("under-quanta", under_quanta),
    ("under-noise", under_noise),
    ("last-half-not-significant", last_half_not_significant),
    ("quarters-within-noise", quarters_within_noise),
    ("dying-away", rate_dying_away),
    ("last-half-within-tolerance", last_half_within_tolerance),
    ("last-half-under-quanta", last_half_under_quanta),
    ("one-off-step", one_off_step),
];

/// The trend layer on the series as it is: the first of [`RULES`] that decides, else a failure.
fn judge_series(s: &Series, cfg: &DetectorConfig) -> Judgement {
    let f = Facts::of(s, cfg);
    for (name, rule) in RULES {
        if let Some(j) = rule(&f) {
            return Judgement { rule: name, ..j };
        }
    }
    Judgement {
        rule: "grows-without-levelling-off",
        ..f.judgement(
            Status::Fail,
            format!(
                "grows without levelling off: {} (p = {:.1e}); the last half still {} (p = {:.1e})",
                f.rate(),
                f.mk.p_increase,
                f.tail_rate(),
                f.tail_mk.p_increase
            ),
        )
    }
}

/// No significant rise over the judged series passes it, unless it climbs in steps whose next
/// one is not yet due: those are undecided, with the length that would show the next step.
fn no_significant_rise(f: &Facts) -> Option<Judgement> {
    if f.slope > 0.0 && f.mk.p_increase < f.cfg.p_value {
        return None;
    }
    if let Some(st) = f.climbing() {
        return Some(Judgement {
            needs_iterations: Some(st.length_needed()),
            ..f.judgement(Status::Inconclusive, undecided_steps(st, f.s.unit))
        });
    }
    let (x, n) = (f.s.x, f.n());
    let what = if f.slope.abs() * (x[n - 1] - x[0]) < f.s.quantum { "flat" } else { "no significant rise" };
    Some(f.judgement(Status::Pass, format!("{what}: {}, p = {:.2}", f.rate(), f.mk.p_increase)))
}

/// Steps that have not stopped fail, judged by the rate they imply and before the slope's
/// tolerance: a line fitted over the whole run flattens steps that came late, and the next one
/// adds as much again.
fn climbing_steps(f: &Facts) -> Option<Judgement> {
    let st = f.climbing()?;
    Some(f.judgement(
        Status::Fail,
        format!(
            "grows in steps that have not stopped: {}, {} in all, {}/iteration between them, {} overall (p = {:.1e}); the next {} due by iteration {}",
            st.describe(),
            f.v(st.rise()),
            f.v(st.implied_rate()),
            f.rate(),
            f.mk.p_increase,
            if st.due_at() as f64 > st.end { "is" } else { "was" },
            st.due_at()
        ),
    ))
}

/// A rise within the tolerance the user accepts passes.
fn within_tolerance(f: &Facts) -> Option<Judgement> {
    (f.slope <= f.s.tolerance_per_iter).then(|| {
        f.judgement(
            Status::Pass,
            format!(
                "grows {} (p = {:.1e}), within the tolerance of {}/iteration",
                f.rate(),
                f.mk.p_increase,
                f.v(f.s.tolerance_per_iter)
            ),
        )
    })
}

/// Growth under [`MIN_QUANTA`] of the metric's quantum is what a settling process does once.
fn under_quanta(f: &Facts) -> Option<Judgement> {
    (f.growth < MIN_QUANTA * f.s.quantum).then(|| {
        f.judgement(
            Status::Pass,
            format!(
                "rose by {} over {} points (p = {:.1e}): under {MIN_QUANTA} steps of {}, too little to call a trend",
                f.v(f.growth),
                f.n(),
                f.mk.p_increase,
                f.v(f.s.quantum)
            ),
        )
    })
}

/// Growth under [`NOISE_SCALES`] times the series' own noise is a drift, not yet a trend.
fn under_noise(f: &Facts) -> Option<Judgement> {
    (f.growth < NOISE_SCALES * f.noise).then(|| {
        f.judgement(
            Status::Pass,
            format!(
                "rose by {} over {} points (p = {:.1e}), under {NOISE_SCALES} times its own noise ({}): a drift, not yet a trend",
                f.v(f.growth),
                f.n(),
                f.mk.p_increase,
                f.v(f.noise)
            ),
        )
    })
}

/// A last half that does not rise significantly has levelled off where there is evidence of it
/// (it does not rise, or by less than [`MIN_TAIL_QUANTA`] steps, or the rate fell by more than the
/// noise explains); a last half still rising, inside its noise or past it, at a rate that did not
/// fall is undecided, with a longer run to ask for.
fn last_half_not_significant(f: &Facts) -> Option<Judgement> {
    if f.tail_slope > 0.0 && f.tail_mk.p_increase < f.cfg.tail_p_value {
        return None;
    }
    let (q, t) = (f.s.quantum, f.tail());
    if f.tail_slope <= 0.0 || f.tail_growth < MIN_TAIL_QUANTA * q || (t.fell && f.tail_growth < NOISE_SCALES * t.noise)
    {
        let why = if f.tail_slope > 0.0 && f.tail_growth >= MIN_TAIL_QUANTA * q {
            format!(
                "{}, and the last half's rise of {} is within {NOISE_SCALES} times its noise ({})",
                f.fall(),
                f.v(f.tail_growth),
                f.v(t.noise)
            )
        } else {
            format!(
                "the last half moves {} (p = {:.2}), {} in all",
                f.tail_rate(),
                f.tail_mk.p_increase,
                f.v(f.tail_growth)
            )
        };
        let reason = format!("grew by {} after warm-up ({}), then levelled off: {why}", f.v(f.growth), f.rate());
        return Some(f.judgement(Status::Pass, reason));
    }
    Some(Judgement {
        needs_iterations: Some(longer(f.s.x[f.n() - 1])),
        ..f.judgement(
            Status::Inconclusive,
            format!(
                "grows {} overall (p = {:.1e}) and the last half still rises by {} ({}, its noise {}), not significantly (p = {:.2}) and at a rate that has not fallen: whether it levels off is undecided; a longer run would tell",
                f.rate(),
                f.mk.p_increase,
                f.v(f.tail_growth),
                f.tail_rate(),
                f.v(t.noise),
                f.tail_mk.p_increase
            ),
        )
    })
}

/// The last half's rise as its two quarters' medians see it (twice their difference: the whole
/// half's rise for a steady rate), against the noise of successive points: a fill that ended long
/// ago leaves a remainder that a slope fitted over the half overstates. What is left is under
/// what this run resolves there and the rate fell by more than the noise explains: levelled off.
fn quarters_within_noise(f: &Facts) -> Option<Judgement> {
    let ty = &f.s.y[f.half..];
    let h = ty.len() / 2;
    let quarters_rise = 2.0 * (median(&mut ty[h..].to_vec()) - median(&mut ty[..h].to_vec()));
    let t = f.tail();
    (quarters_rise < NOISE_SCALES * t.noise && t.fell).then(|| {
        f.judgement(
            Status::Pass,
            format!(
                "grew by {} ({}) and levelled off: {}, and the last half's quarters differ by {} only, within {NOISE_SCALES} times its noise ({})",
                f.v(f.growth),
                f.rate(),
                f.fall(),
                f.v(quarters_rise / 2.0),
                f.v(t.noise)
            ),
        )
    })
}

/// A rate dying away in the last two quarters, or halving quarter after quarter, is a fill
/// approaching its bound; never for a rise that came in jumps (its steps say whether it stopped).
fn rate_dying_away(f: &Facts) -> Option<Judgement> {
    if f.jumps {
        return None;
    }
    let (x, y) = (f.s.x, f.s.y);
    let (third, fourth) = dying_away(&x[f.half..], &y[f.half..]).or_else(|| halving(x, y))?;
    Some(f.judgement(
        Status::Pass,
        format!(
            "grew by {} ({}) and is levelling off: the rate fell from {}/iteration to {}/iteration in the last two quarters (under a quarter of it, or halving quarter after quarter): a fill approaching its bound",
            f.v(f.growth),
            f.rate(),
            f.v(third),
            f.v(fourth)
        ),
    ))
}

/// A last half that rises within the tolerance passes.
fn last_half_within_tolerance(f: &Facts) -> Option<Judgement> {
    (f.tail_slope <= f.s.tolerance_per_iter).then(|| {
        f.judgement(
            Status::Pass,
            format!(
                "grew by {} ({}); the last half rises {}, within the tolerance of {}/iteration",
                f.v(f.growth),
                f.rate(),
                f.tail_rate(),
                f.v(f.s.tolerance_per_iter)
            ),
        )
    })
}

/// A last half that rises by under [`MIN_TAIL_QUANTA`] steps levelled off to within the metric's
/// own step.
fn last_half_under_quanta(f: &Facts) -> Option<Judgement> {
    (f.tail_growth < MIN_TAIL_QUANTA * f.s.quantum).then(|| {
        f.judgement(
            Status::Pass,
            format!(
                "grew by {} ({}); the last half rises by {} only, under {MIN_TAIL_QUANTA} steps of {}: levelled off to within the metric's own step",
                f.v(f.growth),
                f.rate(),
                f.v(f.tail_growth),
                f.v(f.s.quantum)
            ),
        )
    })
}

/// One step in the last half with level ground on both sides is not a leak; with too few points
/// after it to tell a step from the start of a leak, it is undecided, with the length that would
/// have them.
fn one_off_step(f: &Facts) -> Option<Judgement> {
    let (x, y, n) = (f.s.x, f.s.y, f.n());
    let step = one_step(&x[f.half..], &y[f.half..], f.tail_slope, f.s.quantum, f.cfg)?;
    if step.after >= MIN_SIDE_AFTER_STEP {
        return Some(f.judgement(Status::Pass, step.describe(f.s.unit)));
    }
    let spacing = (x[n - 1] - x[0]) / (n - 1).max(1) as f64;
    let needed = step.at_iter + MIN_SIDE_AFTER_STEP as f64 * spacing;
    Some(Judgement {
        needs_iterations: Some(round_up_50(needed)),
        ..f.judgement(Status::Inconclusive, step.describe(f.s.unit))
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_noise::noise;

    /// The rule that decides `f` over iterations 21..=200 (a default run after its warm-up).
    fn rule_of(f: impl Fn(f64) -> f64, quantum: f64, tolerance_per_iter: f64) -> (&'static str, Status, String) {
        let x: Vec<f64> = (21..=200).map(f64::from).collect();
        let y: Vec<f64> = x.iter().map(|&i| f(i)).collect();
        let s = Series { x: &x, y: &y, unit: "bytes", quantum, tolerance_per_iter };
        let j = judge(&s, &DetectorConfig::default());
        (j.rule, j.status, j.reason)
    }

    const BASE: f64 = 50.0 * 1024.0 * 1024.0;

    #[test]
    fn each_rule_decides_the_shape_it_is_for() {
        let n = |i: f64| noise(i as u64, 2000.0);
        // 5 KB an iteration to iteration 110, then `rate` an iteration.
        let ramp = |i: f64, rate: f64| 5000.0 * i.min(110.0) + rate * (i - 110.0).max(0.0);
        let cases: Vec<(&str, Status, (&'static str, Status, String))> = vec![
            ("no-significant-rise", Status::Pass, rule_of(|i| BASE + n(i), 1.0, 0.0)),
            ("climbing-steps", Status::Fail, rule_of(|i| BASE + 65536.0 * (i / 40.0).floor() + n(i), 1.0, 0.0)),
            ("within-tolerance", Status::Pass, rule_of(|i| BASE + 200.0 * i + n(i), 1.0, 256.0)),
            ("under-quanta", Status::Pass, rule_of(|i| BASE + 50.0 * i + noise(i as u64, 100.0), 4096.0, 0.0)),
            ("under-noise", Status::Pass, rule_of(|i| BASE + 20.0 * i + noise(i as u64, 8000.0), 1.0, 0.0)),
            (
                "last-half-not-significant",
                Status::Pass,
                rule_of(|i| BASE + 4.0e6 * (1.0 - (-(i - 21.0) / 8.0).exp()) + n(i), 1.0, 0.0),
            ),
            (
                "quarters-within-noise",
                Status::Pass,
                rule_of(|i| BASE + 4.0e6 * (1.0 - (-(i - 21.0) / 12.0).exp()) + n(i), 1.0, 0.0),
            ),
            (
                "dying-away",
                Status::Pass,
                rule_of(|i| BASE + 4.0e6 * (1.0 - (-(i - 21.0) / 20.0).exp()) + n(i), 1.0, 0.0),
            ),
            ("last-half-within-tolerance", Status::Pass, rule_of(|i| BASE + ramp(i, 100.0) + n(i), 1.0, 256.0)),
            ("last-half-under-quanta", Status::Pass, rule_of(|i| BASE + ramp(i, 50.0) + n(i), 4096.0, 0.0)),
            ("grows-without-levelling-off", Status::Fail, rule_of(|i| BASE + 1024.0 * i + n(i), 1.0, 0.0)),
            (
                "one-off-step",
                Status::Pass,
                rule_of(|i| BASE + 2.0e4 * i.min(100.0) + 5.0e5 * f64::from(i >= 170.0) + n(i), 1.0, 0.0),
            ),
        ];
        for (want, status, (got, got_status, reason)) in cases {
            assert_eq!((got, got_status), (want, status), "{want}: {reason}");
        }
    }

    #[test]
    fn rules_have_distinct_names() {
        let mut names: Vec<&str> = RULES.iter().map(|r| r.0).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), RULES.len());
    }
}
