//! Growth that comes in steps: a gauge's series cut into level segments (change points), and what
//! the steps between them say.
//!
//! Unbounded collections grow in steps, not lines: a Rust `Vec` or `HashMap`, a Python dict or
//! list, an arena that takes a chunk when the last one is full. Between steps the level is flat, so
//! a trend test over the last half sees one step with level ground on both sides and calls it a
//! one-off. The staircase view asks the question a person would ask of the plot: were there two or
//! more rises with no release after warm-up, and has the run gone on past the point where the next
//! one was due? Its lifecycle in the detector:
//! 1. [`staircase`] cuts the series by binary segmentation over a running median (a single-sample
//!    blip cannot make a segment), keeping a cut only where the medians on its two sides differ by
//!    [`STEP_NOISE_SCALES`] noise scales, and only when every segment is level within itself (a
//!    ramp or a fill is judged as a trend, never as stairs);
//! 2. [`Staircase::levelled_off`] predicts the next step from the spacing of the last ones
//!    (equal spacing repeats, widening spacing widens by the same ratio, two steps alone are
//!    given a doubling's ratio) and calls the series
//!    levelled only when the level ground after the last step is [`OVERDUE`] times that spacing.
//!    Steps that come close together are one event ([`CLUSTER_FRACTION`]): several staircases
//!    summed (a table in each of two engines, doubling at nearly the same count of requests) are
//!    spaced as one staircase, not by the few iterations between their near-simultaneous steps;
//! 3. the gauge judge (`gauge.rs`) fails a staircase whose rate is significant and that has not
//!    levelled off, and calls one that is not yet significant inconclusive, with the run length
//!    that would show the next step ([`Staircase::length_needed`]).

use super::stats::{best_split, mad_scale, median, theil_sen};

pub(crate) use super::staircase::MAX_RATIO;
pub use super::staircase::{Staircase, CLUSTER_FRACTION, OVERDUE, TWO_STEP_RATIO};

/// A step must be this many noise scales high to be told apart from the noise around it.
pub const STEP_NOISE_SCALES: f64 = 4.0;

/// Points on each side of a cut: fewer cannot show level ground, and a level of five points keeps
/// its median through a blip two samples long. Steps closer than this are a ramp.
pub(crate) const MIN_SIDE: usize = 5;

/// At most this many cuts per series: bounds the segmentation's cost (each cut is one linear scan
/// of its segment) and is far more steps than any run shows of a real staircase.
pub(crate) const MAX_CUTS: usize = 128;

/// Half-width of the running median the cuts are searched on: a blip of up to two samples (a
/// transient object alive at the moment of a sample) cannot pull a cut towards it.
pub(crate) const SMOOTH_HALF_WIDTH: usize = 2;

/// Within each of its levels a staircase rises by under this fraction of its smallest step: a
/// ramp or a fill cut into pieces rises inside every piece by about as much as between pieces,
/// while the noise of a level (its Theil–Sen rise over five points or more) stays near one noise
/// scale, a quarter of the smallest step a cut accepts.
pub(crate) const LEVEL_FRACTION: f64 = 0.5;

/// A cut whose jump is at most this many times the median release of the series is the level's
/// own back and forth, no step and no release. A heap at quiescent points wanders between levels
/// about 1 KiB apart in a busy engine (measured in `mixed`), out and back in excursions of a few
/// samples, so its releases and its rises are alike in size; a staircase's steps only rise, and
/// each doubling step is twice the last. Twice the median release also covers the jump from an
/// excursion below straight to one above.
pub(crate) const WOBBLE_FACTOR: f64 = 2.0;

/// A cut whose jump is at most this many times the level spread (the upper quartile of the
/// points' distances from their own segment's level) is the level's back and forth. Successive
/// differences say nothing of a level that holds still for most samples and then wanders by 1 KiB
/// for a few (most differences are exactly 0), the spread around the level does: a heap that
/// wanders spends about 40% of its samples away from its level (`mixed`; excursions of 1-12
/// samples), so the upper quartile is the wander's size, and a one-sample blip (under a tenth of
/// the samples) does not move it. For Gaussian noise the upper quartile is 0.67 standard
/// deviations: the band (1.7) is far under the [`STEP_NOISE_SCALES`] threshold.
pub(crate) const LEVEL_SPREAD_FACTOR: f64 = 2.5;

/// A cut under this fraction of the series' largest jump is no step and no release. A doubling
/// table's steps within one run span at most 1:16 (steps at 28, 55, 109, 218 and 436 iterations
/// of a 450-iteration run); the heap's wobble in `mixed` beside a doubling id set's third step
/// is a fortieth of it (1.8 KiB beside 71 KiB), and read as a release it vetoed the staircase.
pub(crate) const SMALL_STEP_FRACTION: f64 = 1.0 / 20.0;

/// The band of the level's own back and forth among `jumps` (between levels): [`WOBBLE_FACTOR`]
/// times the median release where there are two or more (one release is an event, not a
/// wobble), and [`SMALL_STEP_FRACTION`] of the largest jump.
fn wobble_band(jumps: &[f64]) -> f64 {
    let mut downs: Vec<f64> = jumps.iter().filter(|j| **j < 0.0).map(|j| -j).collect();
    let largest = jumps.iter().fold(0.0f64, |m, j| m.max(j.abs()));
    let released = if downs.len() >= 2 { WOBBLE_FACTOR * median(&mut downs) } else { 0.0 };
    released.max(SMALL_STEP_FRACTION * largest)
}

/// [`LEVEL_SPREAD_FACTOR`] times the level spread: the median over the segments of
/// [`MIN_SIDE`] points or more (`bounds`) of the upper quartile of their points' distances from
/// the segment's median. The median over segments keeps a segment that still holds a step too
/// small to cut (two tables doubling a few iterations apart) from widening the band to the size of
/// the steps; 0 when no segment is long enough.
fn level_spread_band(y: &[f64], bounds: &[usize]) -> f64 {
    let mut spreads: Vec<f64> = bounds
        .windows(2)
        .filter(|w| w[1] - w[0] >= MIN_SIDE)
        .map(|w| {
            let level = median(&mut y[w[0]..w[1]].to_vec());
            let mut d: Vec<f64> = y[w[0]..w[1]].iter().map(|v| (v - level).abs()).collect();
            d.sort_by(f64::total_cmp);
            d[((d.len() - 1) as f64 * 0.75).round() as usize]
        })
        .collect();
    if spreads.is_empty() {
        return 0.0;
    }
    LEVEL_SPREAD_FACTOR * median(&mut spreads)
}

/// Drops excursions: an inner segment too short for a cut inside it (under two sides of
/// [`MIN_SIDE`]) that the series enters by a jump one way and leaves by a jump the other, back to
/// within half the way out of the level before. The level went out and came back (a transient object alive at a few samples); its jumps are neither
/// steps nor releases, and counted as releases they set the wobble band above the real steps.
fn drop_excursions(y: &[f64], bounds: &[usize]) -> Vec<usize> {
    let level = |a: usize, b: usize| median(&mut y[a..b].to_vec());
    let mut b = bounds.to_vec();
    let mut k = 1;
    // Each pass removes two bounds or moves on: at most `bounds.len()` rounds.
    while k + 1 < b.len() - 1 {
        let (lo, a, z, hi) = (b[k - 1], b[k], b[k + 1], b[k + 2]);
        let (before, inside, after) = (level(lo, a), level(a, z), level(z, hi));
        let back = (after - before).abs() < 0.5 * (inside - before).abs();
        if z - a < 2 * MIN_SIDE && (inside - before).signum() != (after - inside).signum() && back {
            b.drain(k..k + 2);
            k = k.saturating_sub(1).max(1);
        } else {
            k += 1;
        }
    }
    b
}

/// Drops the inner bounds whose jump (between the medians of the segments either side) is within
/// `band`: the segments either side become one.
fn drop_within(y: &[f64], bounds: &[usize], band: f64) -> Vec<usize> {
    let n = bounds[bounds.len() - 1];
    let mut kept = vec![0];
    for k in 1..bounds.len() - 1 {
        let (a, b, c) = (kept[kept.len() - 1], bounds[k], bounds[k + 1]);
        let jump = median(&mut y[b..c].to_vec()) - median(&mut y[a..b].to_vec());
        if jump.abs() > band {
            kept.push(b);
        }
    }
    kept.push(n);
    kept
}

/// A running median of half-width [`SMOOTH_HALF_WIDTH`] (shrinking at the ends).
fn smooth(y: &[f64]) -> Vec<f64> {
    let n = y.len();
    (0..n)
        .map(|i| {
            let (a, b) = (i.saturating_sub(SMOOTH_HALF_WIDTH), (i + SMOOTH_HALF_WIDTH + 1).min(n));
            median(&mut y[a..b].to_vec())
        })
        .collect()
}

/// The noise a step must clear: the robust spread of successive differences (a difference of
/// two noisy points has sqrt(2) times their spread), never less than one quantum. Unlike the
/// spread around a fitted line, a periodic shape (a sawtooth riding on a leak) does not inflate it.
pub fn step_noise(y: &[f64], quantum: f64) -> f64 {
    successive_noise(y).max(quantum)
}

/// The robust spread of one point as successive differences see it: zero for a series that holds
/// still between its moves.
fn successive_noise(y: &[f64]) -> f64 {
    let d: Vec<f64> = y.windows(2).map(|w| w[1] - w[0]).collect();
    mad_scale(&d) / std::f64::consts::SQRT_2
}

/// Cuts `y[lo..hi]` recursively where the medians on both sides differ by `threshold`.
fn cut(y: &[f64], smoothed: &[f64], lo: usize, hi: usize, threshold: f64, cuts: &mut Vec<usize>) {
    if cuts.len() >= MAX_CUTS {
        return;
    }
    let Some(k) = best_split(&smoothed[lo..hi], MIN_SIDE).map(|k| k + lo) else { return };
    let jump = median(&mut y[k..hi].to_vec()) - median(&mut y[lo..k].to_vec());
    if jump.abs() < threshold {
        return;
    }
    cut(y, smoothed, lo, k, threshold, cuts);
    cuts.push(k);
    cut(y, smoothed, k, hi, threshold, cuts);
}

/// The rise within each level: its Theil–Sen slope over its span, as (the first level's, the
/// largest of the others). A level at either end of the series shorter than two sides may hold the
/// part of a step that came too close to the end for a cut (a cut needs `MIN_SIDE` points each
/// side), so it rises by 0 here.
fn rises_within(x: &[f64], y: &[f64], bounds: &[usize]) -> (f64, f64) {
    let last = bounds.len() - 2;
    let rises: Vec<f64> = bounds
        .windows(2)
        .enumerate()
        .map(|(k, w)| {
            let short_end = (k == 0 || k == last) && w[1] - w[0] < 2 * MIN_SIDE;
            if short_end {
                0.0
            } else {
                theil_sen(&x[w[0]..w[1]], &y[w[0]..w[1]]) * (x[w[1] - 1] - x[w[0]])
            }
        })
        .collect();
    (rises[0], rises[1..].iter().copied().fold(0.0, f64::max))
}

/// Splits each inner segment too short for a cut inside it (under two sides of [`MIN_SIDE`]) where
/// it holds two level parts: two steps closer than a side's length (two engines' tables doubling
/// three iterations apart) leave such a segment between their cuts, and without the split it
/// rises within itself and the whole series reads as a ramp. A split needs a jump that clears the
/// step threshold with each part level to within [`LEVEL_FRACTION`] of that jump; a short piece of
/// a ramp rises within both its parts about as much as between them and stays whole.
fn split_close_steps(y: &[f64], threshold: f64, bounds: &mut Vec<usize>) {
    let last = bounds.len() - 2;
    let mut splits = Vec::new();
    for (k, w) in bounds.windows(2).enumerate() {
        let (a, b) = (w[0], w[1]);
        if k == 0 || k == last || b - a >= 2 * MIN_SIDE {
            continue;
        }
        let range = |v: &[f64]| {
            v.iter().fold(f64::NEG_INFINITY, |m, x| m.max(*x)) - v.iter().fold(f64::INFINITY, |m, x| m.min(*x))
        };
        let best = (a + 1..b)
            .map(|j| (j, median(&mut y[j..b].to_vec()) - median(&mut y[a..j].to_vec())))
            .filter(|(j, jump)| {
                jump.abs() >= threshold
                    && range(&y[a..*j]) < LEVEL_FRACTION * jump.abs()
                    && range(&y[*j..b]) < LEVEL_FRACTION * jump.abs()
            })
            .max_by(|p, q| p.1.abs().total_cmp(&q.1.abs()));
        if let Some((j, _)) = best {
            splits.push(j);
        }
    }
    bounds.extend(splits);
    bounds.sort_unstable();
}

/// The staircase of a series, or None when it is not one: no step up, or levels that rise within
/// themselves (a ramp, a fill), which the trend test judges instead.
pub fn staircase(x: &[f64], y: &[f64], quantum: f64) -> Option<Staircase> {
    assert_eq!(x.len(), y.len());
    let n = y.len();
    if n < 2 * MIN_SIDE {
        return None;
    }
    // A step must clear the noise of successive points, and be at least one quantum: a count that
    // moves by whole units and holds still between them (threads started and never joined, one
    // more descriptor) steps by one unit, which no noise hides.
    let threshold = (STEP_NOISE_SCALES * successive_noise(y)).max(quantum);
    let smoothed = smooth(y);
    let mut cuts = Vec::new();
    cut(y, &smoothed, 0, n, threshold, &mut cuts);
    if cuts.is_empty() {
        return None;
    }
    let mut bounds: Vec<usize> = std::iter::once(0).chain(cuts.iter().copied()).chain(std::iter::once(n)).collect();
    split_close_steps(y, threshold, &mut bounds);
    let level_of = |b: &[usize]| -> Vec<f64> { b.windows(2).map(|w| median(&mut y[w[0]..w[1]].to_vec())).collect() };
    // The level's own back and forth is no step and no release: cuts within its band go, and the
    // levels either side of each are one. The band from the jumps first (small beside the
    // largest, or like the releases), then from the spread around the levels that remain.
    bounds = drop_excursions(y, &bounds);
    let jumps: Vec<f64> = level_of(&bounds).windows(2).map(|l| l[1] - l[0]).collect();
    bounds = drop_within(y, &bounds, wobble_band(&jumps));
    let spread = level_spread_band(y, &bounds);
    bounds = drop_within(y, &bounds, spread);
    let jumps: Vec<f64> = level_of(&bounds).windows(2).map(|l| l[1] - l[0]).collect();
    let band = wobble_band(&jumps).max(spread);
    let cuts: Vec<usize> = bounds[1..bounds.len() - 1].to_vec();
    let levels = level_of(&bounds);
    let mut ups = Vec::new();
    let mut downs = 0;
    for (k, l) in cuts.iter().zip(levels.windows(2)) {
        let h = l[1] - l[0];
        if h >= threshold && h > band {
            ups.push((x[*k], h));
        } else if h <= -threshold && -h > band {
            downs += 1;
        }
    }
    let smallest = ups.iter().map(|u| u.1).fold(f64::INFINITY, f64::min);
    let largest = ups.iter().map(|u| u.1).fold(0.0, f64::max);
    // Every level is level to within a fraction of the smallest step, except the first, which
    // may hold the steps too small to cut of a container that doubles (together under the first
    // one cut: 1 + 2 < 4), and is asked to be level to within a fraction of the largest step. A
    // ramp or a fill cut into pieces rises in its first piece about as much as its largest jump.
    let (first_rise, rise) = rises_within(x, y, &bounds);
    let level = rise < LEVEL_FRACTION * smallest && first_rise < LEVEL_FRACTION * largest;
    (level && !ups.is_empty()).then_some(Staircase { ups, downs, end: x[n - 1] })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xs(n: usize) -> Vec<f64> {
        (21..21 + n).map(|i| i as f64).collect()
    }

    #[test]
    fn equal_steps_are_a_climbing_staircase_not_yet_levelled() {
        let x = xs(180);
        let y: Vec<f64> = x.iter().map(|i| 1e6 * (i / 50.0).floor()).collect();
        let s = staircase(&x, &y, 1.0).unwrap();
        assert_eq!(s.ups.iter().map(|u| u.0).collect::<Vec<_>>(), vec![50.0, 100.0, 150.0]);
        assert!(s.climbs() && !s.levelled_off());
        assert_eq!(s.length_needed(), 250);
        let later = Staircase { end: 230.0, ..s };
        assert!(later.levelled_off());
    }

    #[test]
    fn two_early_steps_then_level_ground_levelled_off() {
        let x = xs(180);
        let y: Vec<f64> = x
            .iter()
            .map(|&i| {
                if i >= 36.0 {
                    2.0
                } else if i >= 28.0 {
                    1.0
                } else {
                    0.0
                }
            })
            .collect();
        let s = staircase(&x, &y, 0.1).unwrap();
        assert!(s.climbs() && s.levelled_off(), "{s:?}");
    }

    #[test]
    fn two_steps_of_a_doubling_set_are_not_levelled_before_its_third_was_due() {
        // A table of ids that doubles: steps at 24 and 46, the third at 91. At 80 iterations
        // equal spacing would call it levelled (overdue from 79); a doubled gap waits to 112.
        let x = xs(60);
        let y: Vec<f64> =
            x.iter().map(|&i| [24.0, 46.0, 91.0].iter().filter(|s| i >= **s).count() as f64 * 4608.0).collect();
        let s = staircase(&x, &y, 1.0).unwrap();
        assert_eq!(s.ups.len(), 2, "{s:?}");
        assert!(!s.levelled_off(), "{s:?}");
        assert_eq!(s.length_needed(), 150);
        assert!(Staircase { end: 115.0, ..s }.levelled_off());
    }

    #[test]
    fn doubling_spacing_predicts_a_doubled_gap() {
        let x = xs(180);
        let y: Vec<f64> =
            x.iter().map(|&i| [45.0, 90.0, 180.0].iter().filter(|s| i >= **s).count() as f64 * 1000.0).collect();
        let s = staircase(&x, &y, 1.0).unwrap();
        assert_eq!(s.ups.len(), 3);
        assert!(!s.levelled_off());
        assert_eq!(s.length_needed(), 450);
    }

    #[test]
    fn a_ramp_and_a_sawtooth_are_not_stairs() {
        let x = xs(180);
        let ramp: Vec<f64> = x.iter().map(|i| 64.0 * i).collect();
        assert!(staircase(&x, &ramp, 1.0).is_none());
        let saw: Vec<f64> = x.iter().map(|i| 1e5 * (((*i as u64) / 10) % 3) as f64).collect();
        assert!(!staircase(&x, &saw, 1.0).is_some_and(|s| s.climbs()));
    }

    #[test]
    fn a_step_too_near_the_start_for_a_cut_does_not_hide_the_stairs() {
        // Steps at 24, 46, 91, 181 (a table doubling): the first is 3 points from the start.
        let x = xs(180);
        let y: Vec<f64> =
            x.iter().map(|&i| [24.0, 46.0, 91.0, 181.0].iter().filter(|s| i >= **s).count() as f64 * 4608.0).collect();
        let s = staircase(&x, &y, 1.0).unwrap();
        assert!(s.climbs() && !s.levelled_off(), "{s:?}");
    }

    #[test]
    fn a_count_that_rises_one_unit_at_intervals_is_a_staircase() {
        // A thread started every 20 iterations and never joined.
        let x = xs(180);
        let y: Vec<f64> = x.iter().map(|i| 4.0 + (i / 20.0).floor()).collect();
        let s = staircase(&x, &y, 1.0).expect("stairs");
        assert!(s.climbs() && !s.levelled_off() && s.ups.len() >= 8, "{s:?}");
    }

    #[test]
    fn two_tables_doubling_together_are_spaced_as_one_staircase() {
        // Prefill's and decode's tables in one process: steps at 28 and 29, 54 and 57, 110 and
        // 116 (the second engine a few iterations behind), flat to 200. Spaced as steps of their
        // own, the next was due 6 iterations after 116 and the series levelled at 125.
        let x = xs(180);
        let at = [28.0, 29.0, 54.0, 57.0, 110.0, 116.0];
        let y: Vec<f64> = x
            .iter()
            .map(|&i| {
                at.iter().enumerate().filter(|(_, s)| i >= **s).map(|(k, _)| 11264.0 * 2f64.powi(k as i32 / 2)).sum()
            })
            .collect();
        let s = staircase(&x, &y, 1.0).unwrap();
        assert!(s.ups.len() >= 4, "{s:?}");
        assert!(s.climbs() && !s.levelled_off(), "{s:?}");
        assert!(s.due_at() >= 200, "{s:?}");
        // Out of phase, two tables keep their own gaps: nothing is joined.
        let apart =
            Staircase { ups: [30.0, 45.0, 60.0, 90.0].iter().map(|&i| (i, 1.0)).collect(), downs: 0, end: 100.0 };
        assert_eq!(apart.events().len(), 4);
    }

    #[test]
    fn blips_make_no_step() {
        let x = xs(180);
        let y: Vec<f64> = x.iter().map(|&i| if (i as u64) % 37 == 0 { 12288.0 } else { 0.0 }).collect();
        assert!(staircase(&x, &y, 1.0).is_none());
    }

    /// A heap that wanders between levels about 1 KiB apart (most successive differences 0),
    /// under the steps of a table that doubles: deterministic excursions of 2-9 samples.
    fn wobble(n: usize) -> Vec<f64> {
        (0..n)
            .map(|i| {
                if (i * 7) % 23 < 5 {
                    if i % 2 == 0 {
                        1024.0
                    } else {
                        -960.0
                    }
                } else {
                    0.0
                }
            })
            .collect()
    }

    #[test]
    fn a_wobbling_level_makes_no_step_and_no_release() {
        let x = xs(180);
        let y = wobble(180);
        assert!(
            staircase(&x, &y, 1.0).is_none_or(|s| s.ups.is_empty() && s.downs == 0),
            "{:?}",
            staircase(&x, &y, 1.0)
        );
    }

    #[test]
    fn a_doubling_table_under_the_wobble_climbs() {
        let x = xs(180);
        let y: Vec<f64> = x
            .iter()
            .zip(wobble(180))
            .map(|(i, w)| {
                w + [(28.0, 18_432.0), (55.0, 36_864.0), (109.0, 73_728.0)]
                    .iter()
                    .filter(|s| *i >= s.0)
                    .map(|s| s.1)
                    .sum::<f64>()
            })
            .collect();
        let s = staircase(&x, &y, 1.0).expect("a staircase");
        assert_eq!(s.ups.iter().map(|u| u.0).collect::<Vec<_>>(), vec![28.0, 55.0, 109.0], "{s:?}");
        assert!(s.climbs() && !s.levelled_off());
    }
}
