//! The detector's vocabulary, below every rule: one gauge's series as the trend judge sees it, the
//! judgement it gets, the quanta a rise must clear to be more than noise, and the run lengths an
//! undecided judgement asks for. Steps, releases, the trend judge and the resolution search all
//! build on these; nothing here judges.

pub use plateau_reports::figures::fmt_value;
use plateau_reports::Status;

use super::stats::MannKendall;

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

/// What one gauge's series looks like to the detector.
#[derive(Debug, Clone, PartialEq)]
pub struct Judgement {
    pub status: Status,
    pub reason: String,
    /// The rule that decided (the trend judge's `RULES` by name, or the floors' judge).
    pub rule: &'static str,
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

/// Iterations an undecided trend asks for when nothing in it says how many: half again as many
/// as it has (rounded up to 50), so that its last half alone has as many points as the whole had.
pub fn longer(last_iter: f64) -> u64 {
    round_up_50(last_iter * 1.5)
}

/// A run length rounded up to a multiple of 50 iterations.
pub fn round_up_50(iterations: f64) -> u64 {
    ((iterations / 50.0).ceil() * 50.0) as u64
}
