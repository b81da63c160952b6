//! Growth under periodic release: a gauge that falls back to a floor at intervals (a cache
//! cleared in batches, a garbage collector, a prefix cache reset between RL steps, a KV pool given
//! back at each sleep). Its teeth dwarf any trend a fitted line could see, so a leak under them
//! read as noise. The floors (where it falls back to) and the peaks (where it falls from) are
//! series of their own: a steady leak raises every floor by what it kept in the cycle before,
//! while a cache that only refills leaves the floors level, whatever its teeth.
//!
//! Lifecycle in the trend layer (`gauge.rs`): [`releases`] finds, from the data alone, the falls
//! that give back most of what the series built up or held since the fall before (at least
//! [`RELEASE_SHARE`] of the series' span, and [`STEP_NOISE_SCALES`] times the noise of successive
//! points; a one-sample spike that falls back is not a release); with at least [`MIN_RELEASES`]
//! of them the gauge is also judged on its floors by [`judge_floors`]: floors that rise
//! significantly fail, floors that rise past their noise but not yet significantly leave it
//! undecided (with the length that would show two releases more) unless the series fails on its
//! own, and level floors pass.

use plateau_reports::Status;

use super::series::{fmt_value, round_up_50, Judgement, Series, MIN_QUANTA, NOISE_SCALES};
use super::stats::{mad_scale, mann_kendall, median, theil_sen};
use super::steps::{step_noise, STEP_NOISE_SCALES};
use super::DetectorConfig;

/// A fall counts as a release when it gives back at least this share of the series' span after
/// warm-up: a cache cleared, not a level wandering by an allocator block (the moves of a settled
/// heap are a few KiB in spans of tens of KiB or more, a cleared cache's teeth are most of it).
pub const RELEASE_SHARE: f64 = 0.25;

/// Releases it takes to call them periodic and judge the floors: three floors after three
/// releases are the fewest that show a direction; a rising sequence of six floors is
/// significant at 1% (Mann–Kendall, p = 0.004), so a default run with a release every 30
/// iterations decides.
pub const MIN_RELEASES: usize = 3;

/// The floors and peaks of a series that falls back at intervals.
#[derive(Debug, Clone, PartialEq)]
pub struct Releases {
    /// (iteration, value) right after each release.
    pub floors: Vec<(f64, f64)>,
    /// (iteration, value) right before each release.
    pub peaks: Vec<(f64, f64)>,
}

impl Releases {
    /// The median spacing between releases, in iterations.
    pub fn spacing(&self) -> f64 {
        let mut gaps: Vec<f64> = self.floors.windows(2).map(|w| w[1].0 - w[0].0).collect();
        if gaps.is_empty() {
            return 0.0;
        }
        median(&mut gaps)
    }
}

/// The releases of a series (see the module's lifecycle), or None with fewer than
/// [`MIN_RELEASES`].
pub fn releases(x: &[f64], y: &[f64], quantum: f64) -> Option<Releases> {
    assert_eq!(x.len(), y.len());
    if y.len() < 2 * MIN_RELEASES {
        return None;
    }
    let lo = y.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = y.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let span = hi - lo;
    let threshold = (RELEASE_SHARE * span).max(STEP_NOISE_SCALES * step_noise(y, quantum));
    if span <= 0.0 {
        return None;
    }
    let mut floors = Vec::new();
    let mut peaks = Vec::new();
    // The lowest point since the last release: a release gives back most of what was built on it.
    let mut low = y[0];
    for i in 1..y.len() {
        let fall = y[i - 1] - y[i];
        let built = y[i - 1] - low;
        // What is given back was held or built up, not a one-sample spike: the peak was not
        // itself reached by a jump (a transient object alive at one sample, a burst).
        let spike = i >= 2 && y[i - 1] - y[i - 2] >= threshold;
        // Nor a one-sample dip that comes straight back (a sample taken while a buffer was
        // swapped out): a floor holds for more than the one sample.
        let dip = i + 1 < y.len() && y[i + 1] - y[i] >= threshold;
        if fall >= threshold && fall >= 0.5 * built && !spike && !dip {
            peaks.push((x[i - 1], y[i - 1]));
            floors.push((x[i], y[i]));
            low = y[i];
        } else {
            low = low.min(y[i]);
        }
    }
    (floors.len() >= MIN_RELEASES).then_some(Releases { floors, peaks })
}

/// What the floors say.
#[derive(Debug, Clone, PartialEq)]
pub enum FloorVerdict {
    /// Floors that rise significantly, past the tolerance and their noise: (slope, rise, p).
    Rising { slope: f64, rise: f64, p: f64 },
    /// Floors that rise past their noise but not yet significantly: the iteration by which two
    /// releases more would show.
    Undecided { slope: f64, rise: f64, p: f64, needs_iterations: u64 },
    /// Level floors (or falling): (slope, rise).
    Level { slope: f64, rise: f64 },
}

/// Judges the floors of a periodically released series: `point_noise` is the noise of one point
/// of the series (a floor is one point, and a handful of floors cannot measure their own spread),
/// `tolerance_per_iter` the growth accepted, `quantum` the metric's step, `p_value` the
/// significance the trend layer uses.
pub fn judge_floors(
    r: &Releases,
    point_noise: f64,
    quantum: f64,
    tolerance_per_iter: f64,
    p_value: f64,
) -> FloorVerdict {
    let x: Vec<f64> = r.floors.iter().map(|f| f.0).collect();
    let y: Vec<f64> = r.floors.iter().map(|f| f.1).collect();
    let slope = theil_sen(&x, &y);
    let mk = mann_kendall(&x, &y, slope);
    let rise = slope * (x[x.len() - 1] - x[0]);
    let resid: Vec<f64> = x.iter().zip(&y).map(|(a, b)| b - slope * a).collect();
    let noise = mad_scale(&resid).max(point_noise).max(quantum);
    let past_noise = slope > tolerance_per_iter && rise >= MIN_QUANTA * quantum && rise >= NOISE_SCALES * noise;
    // Floors that rose and then stayed level (a cache that filled while it churned) have levelled
    // off: the later half of the floors must still rise, past the tolerance and the noise.
    let h = x.len() / 2;
    let late_slope = theil_sen(&x[h..], &y[h..]);
    let late_rise = late_slope * (x[x.len() - 1] - x[h]);
    let still_rising = late_slope > tolerance_per_iter && late_rise >= noise;
    if past_noise && !still_rising {
        return FloorVerdict::Level { slope, rise };
    }
    if past_noise && mk.p_increase < p_value {
        FloorVerdict::Rising { slope, rise, p: mk.p_increase }
    } else if past_noise {
        let next = x[x.len() - 1] + 2.0 * r.spacing();
        FloorVerdict::Undecided { slope, rise, p: mk.p_increase, needs_iterations: round_up_50(next) }
    } else {
        FloorVerdict::Level { slope, rise }
    }
}

/// A series that falls back to a floor at intervals, judged on its floors (`release.rs`); `base`
/// is the series' own judgement, whose figures are kept with the floors' slope (the rate that
/// stays) where the floors decide.
pub fn judge_released(r: &Releases, s: &Series, cfg: &DetectorConfig, base: Judgement) -> Judgement {
    let v = |a: f64| fmt_value(a, s.unit);
    let peaks = {
        let px: Vec<f64> = r.peaks.iter().map(|p| p.0).collect();
        let py: Vec<f64> = r.peaks.iter().map(|p| p.1).collect();
        theil_sen(&px, &py)
    };
    let what = format!(
        "falls back at intervals ({} releases, about every {:.0} iterations; its peaks move {}/iteration)",
        r.floors.len(),
        r.spacing(),
        v(peaks)
    );
    match judge_floors(r, step_noise(s.y, s.quantum), s.quantum, s.tolerance_per_iter, cfg.p_value) {
        FloorVerdict::Rising { slope, rise, p } => Judgement {
            slope,
            ..with(
                base,
                Status::Fail,
                format!(
                    "{what} to floors that rise: {} over them, {}/iteration (p = {p:.1e}): growth under periodic release",
                    v(rise),
                    v(slope)
                ),
            )
        },
        // The floors add power, never take it away: a series that fails on its own still fails.
        FloorVerdict::Undecided { .. } if base.status == Status::Fail => base,
        FloorVerdict::Undecided { slope, rise, p, needs_iterations } => Judgement {
            slope,
            needs_iterations: Some(needs_iterations),
            ..with(
                base,
                Status::Inconclusive,
                format!(
                    "{what} to floors that rise {} ({}/iteration), past their noise but not yet significantly (p = {p:.2}): undecided; {needs_iterations} iterations show two releases more",
                    v(rise),
                    v(slope)
                ),
            )
        },
        FloorVerdict::Level { slope, rise } => Judgement {
            slope,
            ..with(
                base,
                Status::Pass,
                format!(
                    "{what} to level floors ({} over them, {}/iteration): what it holds between releases is given back, whatever its teeth",
                    v(rise),
                    v(slope)
                ),
            )
        },
    }
}

/// `j` with another status and reason, decided by the floors.
fn with(j: Judgement, status: Status, reason: String) -> Judgement {
    Judgement { status, reason, rule: "released-floors", ..j }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn saw(n: u64, period: u64, leak: f64) -> (Vec<f64>, Vec<f64>) {
        let x: Vec<f64> = (21..21 + n).map(|i| i as f64).collect();
        let y: Vec<f64> =
            x.iter().map(|&i| 6e6 + 3e6 * ((i as u64 % period) as f64 / period as f64) + leak * i).collect();
        (x, y)
    }

    #[test]
    fn a_sawtooth_over_a_leak_has_rising_floors_and_one_without_level_floors() {
        let (x, y) = saw(180, 30, 2048.0);
        let r = releases(&x, &y, 1.0).expect("releases");
        assert_eq!(r.floors.len(), 6, "{r:?}");
        assert!(matches!(judge_floors(&r, step_noise(&y, 1.0), 1.0, 0.0, 0.01), FloorVerdict::Rising { .. }));
        let (x, y) = saw(180, 30, 0.0);
        let r = releases(&x, &y, 1.0).expect("releases");
        assert!(matches!(judge_floors(&r, step_noise(&y, 1.0), 1.0, 0.0, 0.01), FloorVerdict::Level { .. }));
    }

    #[test]
    fn moves_within_a_level_and_a_steady_rise_are_no_releases() {
        let x: Vec<f64> = (21..201).map(|i| i as f64).collect();
        let ramp: Vec<f64> = x.iter().map(|i| 64.0 * i).collect();
        assert!(releases(&x, &ramp, 1.0).is_none());
        // A heap that moves by 1 KiB now and then over a table that grows by 64 KiB.
        let noisy: Vec<f64> =
            x.iter().map(|&i| 65536.0 * (i / 60.0).floor() + if (i as u64) % 17 < 3 { 1024.0 } else { 0.0 }).collect();
        assert!(releases(&x, &noisy, 1.0).is_none());
    }

    #[test]
    fn floors_that_rose_while_a_cache_filled_and_then_stayed_level_are_level() {
        let x: Vec<f64> = (21..221).map(|i| i as f64).collect();
        let y: Vec<f64> =
            x.iter().map(|&i| 6e6 + 1e6 * (i / 80.0).min(1.0) + 3e6 * ((i as u64 % 20) as f64 / 20.0)).collect();
        let r = releases(&x, &y, 1.0).expect("releases");
        assert!(matches!(judge_floors(&r, 1.0, 1.0, 0.0, 0.01), FloorVerdict::Level { .. }));
    }

    #[test]
    fn too_few_floors_rising_are_undecided_with_the_length_that_shows_two_more() {
        let (x, y) = saw(120, 30, 2048.0);
        let r = releases(&x, &y, 1.0).expect("releases");
        assert_eq!(r.floors.len(), 4, "{r:?}");
        match judge_floors(&r, step_noise(&y, 1.0), 1.0, 0.0, 0.01) {
            FloorVerdict::Undecided { needs_iterations, .. } => assert_eq!(needs_iterations, 200),
            other => panic!("{other:?}"),
        }
    }
}
