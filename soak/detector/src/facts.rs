//! What the trend judge's rules read of one series (`trend.rs`): the fits over the whole judged
//! series and over its last half, its staircase, and, fitted only when a later rule first asks,
//! the last half's evidence of levelling off. Fitted once per series; the rules only read them.

use std::cell::OnceCell;

use plateau_reports::Status;

use super::levelling::DECAY_FRACTION;
use super::series::{fmt_value, Judgement, Series, MIN_QUANTA, NOISE_SCALES};
use super::stats::{mad_scale, mann_kendall, theil_sen, MannKendall};
use super::steps::{staircase, step_noise, Staircase};
use super::DetectorConfig;

/// What the rules read of one series: the fits over the whole judged series and over its last
/// half, and its staircase; what only the later rules need is fitted when first asked for.
pub(crate) struct Facts<'a> {
    pub(crate) s: &'a Series<'a>,
    pub(crate) cfg: &'a DetectorConfig,
    pub(crate) slope: f64,
    pub(crate) mk: MannKendall,
    /// The robust spread of the series around its line.
    pub(crate) noise: f64,
    /// Index of the last half's first point.
    pub(crate) half: usize,
    pub(crate) tail_slope: f64,
    pub(crate) tail_mk: MannKendall,
    /// Growth over the judged series, and over its last half (slope times span).
    pub(crate) growth: f64,
    pub(crate) tail_growth: f64,
    /// The rise came in two or more separated jumps: its own rule (the next step overdue) says
    /// whether it stopped, never a slowing last half, whose quarters a step may fall between.
    pub(crate) jumps: bool,
    /// A staircase that counts: it rises by more than noise on the series' own terms too (its
    /// steps clear the noise of successive points by construction; two series interleaved, such
    /// as levels sampled alternately purged and not, can still cut into steps that do not clear
    /// the spread around the line), and the rate its steps imply is past the tolerance.
    pub(crate) stairs: Option<Staircase>,
    pub(crate) tail: OnceCell<Tail>,
}

/// The last half's evidence of levelling off, fitted when a rule first needs it.
pub(crate) struct Tail {
    /// The first half's rate, and whether the rate fell: the first half rose at least
    /// `1 / DECAY_FRACTION` times as fast as the last (a fill that approaches its bound), by more
    /// than the noise could explain.
    pub(crate) head_slope: f64,
    pub(crate) fell: bool,
    /// The last half's noise: the spread of its levels around its line, which slow wander
    /// (autocorrelated noise) widens as it should, but never more than twice the spread of
    /// successive differences, which a periodic shape riding on a leak (a rising sawtooth) does
    /// not widen.
    pub(crate) noise: f64,
}

impl<'a> Facts<'a> {
    pub(crate) fn of(s: &'a Series<'a>, cfg: &'a DetectorConfig) -> Facts<'a> {
        let (x, y) = (s.x, s.y);
        let n = x.len();
        assert!(n >= cfg.min_points && n == y.len(), "judge needs at least min_points points");
        let slope = theil_sen(x, y);
        let mk = mann_kendall(x, y, slope);
        let resid: Vec<f64> = x.iter().zip(y).map(|(a, b)| b - slope * a).collect();
        let noise = mad_scale(&resid);
        let half = n / 2;
        let tail_slope = theil_sen(&x[half..], &y[half..]);
        let tail_mk = mann_kendall(&x[half..], &y[half..], tail_slope);
        let cut = staircase(x, y, s.quantum);
        let jumps = cut.as_ref().is_some_and(|st| st.ups.len() >= 2);
        let stairs = cut.filter(|st| {
            st.climbs()
                && st.rise() >= MIN_QUANTA * s.quantum
                && st.rise() >= NOISE_SCALES * noise
                && st.implied_rate() > s.tolerance_per_iter
        });
        Facts {
            s,
            cfg,
            slope,
            mk,
            noise,
            half,
            tail_slope,
            tail_mk,
            growth: slope * (x[n - 1] - x[0]),
            tail_growth: tail_slope * (x[n - 1] - x[half]),
            jumps,
            stairs,
            tail: OnceCell::new(),
        }
    }

    pub(crate) fn tail(&self) -> &Tail {
        self.tail.get_or_init(|| {
            let (x, y, half) = (self.s.x, self.s.y, self.half);
            let (tx, ty) = (&x[half..], &y[half..]);
            let head_slope = theil_sen(&x[..half], &y[..half]);
            let head_span = x[half.max(1) - 1] - x[0];
            let fell = head_slope > 0.0
                && self.tail_slope <= DECAY_FRACTION * head_slope
                && (head_slope - self.tail_slope.max(0.0)) * head_span >= NOISE_SCALES * self.noise;
            let resid: Vec<f64> = tx.iter().zip(ty).map(|(a, b)| b - self.tail_slope * a).collect();
            let noise = mad_scale(&resid).min(2.0 * step_noise(ty, self.s.quantum));
            Tail { head_slope, fell, noise }
        })
    }

    /// A staircase still climbing: its next step not yet overdue.
    pub(crate) fn climbing(&self) -> Option<&Staircase> {
        self.stairs.as_ref().filter(|st| !st.levelled_off())
    }

    pub(crate) fn v(&self, a: f64) -> String {
        fmt_value(a, self.s.unit)
    }

    pub(crate) fn rate(&self) -> String {
        format!("{}/iteration", self.v(self.slope))
    }

    pub(crate) fn tail_rate(&self) -> String {
        format!("{}/iteration", self.v(self.tail_slope))
    }

    pub(crate) fn fall(&self) -> String {
        format!("the rate fell from {}/iteration to {}", self.v(self.tail().head_slope), self.tail_rate())
    }

    pub(crate) fn n(&self) -> usize {
        self.s.x.len()
    }

    pub(crate) fn judgement(&self, status: Status, reason: String) -> Judgement {
        Judgement {
            status,
            reason,
            rule: "",
            slope: self.slope,
            mk: self.mk,
            tail_slope: self.tail_slope,
            tail_p: self.tail_mk.p_increase,
            growth: self.growth,
            noise: self.noise,
            needs_iterations: None,
        }
    }
}
