//! A staircase found in a series (`steps.rs` cuts it) and what it predicts: the step events
//! (close steps joined into one), the gap at which the next is due, whether the run went on long
//! enough past it to call the series levelled off, and the run length that would tell.

/// The next step is overdue, and the series levelled, once the ground after the last step is this
/// many times the gap at which it was due. A container that doubles, or an arena that takes a
/// chunk every so many requests, keeps its spacing (or its ratio) within a few percent under a
/// steady workload; half a gap more than predicted is far outside that, and short enough that
/// the run it asks for stays within a few times the run that saw the steps.
pub const OVERDUE: f64 = 1.5;

/// The spacing ratio assumed when only two steps have been seen. A set that doubles its table
/// (the commonest unbounded collection: a Rust `HashMap`, a Python dict) steps at doubling
/// intervals; with equal spacing assumed, its third step (24, 46, then 91) was "overdue" by
/// iteration 79 and an 80-iteration run passed it as levelled off. A buffer grown twice to the
/// peak batch and kept still passes once the run is 1.5 doubled gaps past its second step.
pub const TWO_STEP_RATIO: f64 = 2.0;

/// Spacing ratios are clamped to this: a staircase whose spacing more than quadruples is already
/// slowing faster than any doubling container, and a wider guess would ask for endless runs.
pub(crate) const MAX_RATIO: f64 = 4.0;

/// A step that comes within this fraction of the gap before it (from the event before to the one
/// it follows) joins that event. One container's spacing holds or widens (a table doubles, an
/// arena takes a chunk every so many requests), so a step a third of a gap later cannot be its
/// next one: it is a second staircase stepping with the first. Two engines' tables of ended
/// request ids in one process (prefill and decode) double a few iterations apart, 1 to 6 after
/// gaps of 27 to 55, and spaced as steps of their own they predicted the next step within a few
/// iterations and passed the doubling as "levelled off" (pd-transfer, a table planted in a scratch
/// copy of the engine). Two staircases out of phase (steps at 30, 45, 60, 90, ...) keep gaps
/// alike and are never joined.
pub const CLUSTER_FRACTION: f64 = 1.0 / 3.0;

/// The level segments of a series: the rises and releases between them.
#[derive(Debug, Clone, PartialEq)]
pub struct Staircase {
    /// Upward steps: (first iteration at the new level, height).
    pub ups: Vec<(f64, f64)>,
    /// Downward steps (memory given back).
    pub downs: usize,
    /// The last iteration of the series.
    pub end: f64,
}

impl Staircase {
    /// Rises only, at least two of them: the shape that must never pass while it goes on.
    pub fn climbs(&self) -> bool {
        self.ups.len() >= 2 && self.downs == 0
    }

    /// The spacing and ratio the next step is expected at: equal spacing repeats, widening
    /// spacing widens by its last ratio (clamped to `1..=MAX_RATIO`). Two steps show one gap and
    /// no ratio: the next is expected as late as a doubling container's ([`TWO_STEP_RATIO`]).
    fn next_gap(&self) -> f64 {
        let at = self.events();
        let k = at.len();
        assert!(k >= 2, "a gap needs two steps");
        let last = at[k - 1] - at[k - 2];
        let ratio =
            if k >= 3 { (last / (at[k - 2] - at[k - 3]).max(1.0)).clamp(1.0, MAX_RATIO) } else { TWO_STEP_RATIO };
        last * ratio
    }

    /// The iterations at which step events began: the steps, with each step that came within
    /// [`CLUSTER_FRACTION`] of the gap before it joined to the event it follows. The first gap
    /// has none before it, so two steps are always two events.
    pub fn events(&self) -> Vec<f64> {
        let mut at: Vec<f64> = Vec::with_capacity(self.ups.len());
        let mut last_step = f64::NEG_INFINITY;
        for &(i, _) in &self.ups {
            let k = at.len();
            let joins = k >= 2 && i - last_step < CLUSTER_FRACTION * (at[k - 1] - at[k - 2]);
            if !joins {
                at.push(i);
            }
            last_step = i;
        }
        at
    }

    /// The first iteration of the last step event.
    fn last_event(&self) -> f64 {
        *self.events().last().expect("a staircase has a step")
    }

    /// True when the run went on past the next step's due point by [`OVERDUE`] times its gap.
    pub fn levelled_off(&self) -> bool {
        self.end - self.last_event() >= OVERDUE * self.next_gap()
    }

    /// The iteration by which the next step is expected (the last event plus one gap).
    pub fn due_at(&self) -> u64 {
        (self.last_event() + self.next_gap()).ceil() as u64
    }

    /// Iterations a run needs to see whether the next step comes: the last event plus
    /// [`OVERDUE`] gaps, rounded up to a multiple of 50.
    pub fn length_needed(&self) -> u64 {
        let want = self.last_event() + OVERDUE * self.next_gap();
        super::series::round_up_50(want)
    }

    /// "3 steps at 45, 90, 180 (widening spacing)".
    pub fn describe(&self) -> String {
        let at: Vec<String> = self.ups.iter().map(|u| format!("{}", u.0)).collect();
        let gaps: Vec<f64> = self.ups.windows(2).map(|w| w[1].0 - w[0].0).collect();
        let widening = gaps.windows(2).all(|g| g[1] > 1.3 * g[0]) && gaps.len() >= 2;
        let spacing = if widening { "widening spacing" } else { "no release between them" };
        format!("{} steps up at {} ({spacing})", self.ups.len(), at.join(", "))
    }

    /// Total height of the rises.
    pub fn rise(&self) -> f64 {
        self.ups.iter().map(|u| u.1).sum()
    }

    /// The rate the steps imply, per iteration: what the steps after the first added, over the
    /// iterations from the first to the last. This is what the next steps will add; the average
    /// over the whole series dilutes steps that came late (two steps of 2 KiB at iterations 120
    /// and 170 of 200 average 23 B/iteration over the run and imply 41).
    pub fn implied_rate(&self) -> f64 {
        let (first, last) = (self.ups[0].0, self.ups[self.ups.len() - 1].0);
        let added: f64 = self.ups[1..].iter().map(|u| u.1).sum();
        added / (last - first).max(1.0)
    }
}
