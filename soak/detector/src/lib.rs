//! plateau-detector: the growth detector over samples.jsonl v1, which depends on the samples
//! model (plateau-reports) only. It judges in two layers:
//! 1. exact accounting, free of statistics: every `per_request` metric is 0 at every quiescent
//!    point, every `bounded` one within its capacity at every sample, every `counter` never
//!    decreases, and every idle self-check the engine ran at a quiescent point held. One leaked
//!    entry fails, at the iteration it first appears (`exact.rs`);
//! 2. trends on `gauge` metrics after warm-up, judged in units of the work (per iteration, per
//!    request), at any rate the run resolves (`trend.rs`).
//!
//! It decides by kind and by the relations the samples header declares (a bound, an overhead on
//! the live heap, an address space the allocator reserves: `bounds.rs`, `overhead.rs`), never by
//! name. Names only serve the figures a person reads afterwards: which gauge is the heap, and
//! where growth is (`attribution.rs`).
//!
//! One judge: [`judge`] is the verdict of a samples file as a function of what the file recorded
//! (the warm-up, the tolerance and the planned length in its header; how the run ended in its
//! last line). Every command that shows or stores a verdict gets it from there; [`judge_with`]
//! judges with other settings, and says which.
//!
//! Nothing unjudged passes: a gauge with too few points after warm-up, a `per_request` metric with
//! too few quiescent values, growth whose end this run cannot tell, an unfinished run, or a
//! header with no metrics makes the verdict `inconclusive`.

pub mod attribution;
mod bounds;
pub mod corpus;
pub mod evidence;
mod exact;
mod facts;
mod gauge;
mod judge;
mod levelling;
mod live_heap;
mod overhead;
pub mod power;
pub mod release;
pub mod series;
mod staircase;
pub mod stats;
pub mod steps;
pub use plateau_reports::tolerance;
mod trend;
mod verdict;

use plateau_reports::{MetricSpec, MetricVerdict, Samples, Status};

pub use judge::{
    judge, judge_with, judge_with_evidence, judge_with_sites, unfinished, Overrides, STOPPED_ON_EXACT_FAILURE,
};
pub use live_heap::{window_rate, LiveHeap};
pub use plateau_reports::tolerance::{Per, Tolerance, DEFAULT_WARMUP_ITERATIONS};

/// The one warm-up rule of the soak, `plateau analyze` and the simulator: the user's `--warmup`, else what
/// the scenario or the samples header declares, else [`DEFAULT_WARMUP_ITERATIONS`]. An explicit
/// warm-up at or past the run's length (when known) is an input error: nothing would be judged.
pub fn warmup_rule(explicit: Option<u64>, declared: Option<u64>, iterations: Option<u64>) -> Result<u64, String> {
    if let (Some(w), Some(n)) = (explicit, iterations) {
        if w >= n {
            return Err(format!(
                "--warmup {w} is at or past the run's length ({n} iterations): nothing would be judged"
            ));
        }
    }
    Ok(explicit.or(declared).unwrap_or(DEFAULT_WARMUP_ITERATIONS))
}

#[derive(Debug, Clone, PartialEq)]
pub struct DetectorConfig {
    /// Quiescent iterations the trend test skips (see [`warmup_rule`]).
    pub warmup_iterations: u64,
    /// Significance of the trend over the whole series after warm-up. 1% keeps false alarms rare
    /// over the dozens of gauges a run judges, and a real leak reaches it within a few dozen points.
    pub p_value: f64,
    /// Significance of the trend over its last half: below it, still growing. Looser, since the
    /// whole series has already shown a trend at `p_value`.
    pub tail_p_value: f64,
    /// Fewer quiescent points after warm-up than this: no trend verdict (inconclusive). A steady
    /// rise is significant at twelve already (p < 1e-5, and p < 0.005 in its last half of six),
    /// but a fresh process settles for its first few dozen iterations (code pages faulted in, a
    /// page of RssAnon every few iterations until about the 40th, a slab or two more as
    /// allocations spread): at twelve such settling passed for a trend in 4 of 70 clean
    /// 70-iteration runs. Twenty leaves a last half of ten, long enough to show a step with level
    /// ground on both sides.
    pub min_points: usize,
    /// Byte growth accepted per request or per iteration.
    pub tolerance: Tolerance,
    /// What profiled replays showed of live heaps beside process-memory gauges (`live_heap.rs`).
    pub live_heap: Vec<LiveHeap>,
}

impl Default for DetectorConfig {
    fn default() -> Self {
        DetectorConfig {
            warmup_iterations: DEFAULT_WARMUP_ITERATIONS,
            p_value: 0.01,
            tail_p_value: 0.05,
            min_points: 20,
            tolerance: Tolerance::default(),
            live_heap: Vec::new(),
        }
    }
}

/// Evidence beyond the samples that decides gauges, weighed once by the one judge after the
/// trend layer and the relations the header declares, before where growth is said: the live
/// bytes of each allocation site (plateau-sites), whose judgement names what a failing gauge's
/// growth is made of, and can find it all fills.
pub trait GaugeEvidence {
    /// Amends the gauges of `metrics` (judged over `s` with `cfg`; `requests_per_iter` from the
    /// run's request counter) and returns the lines the verdict's attribution gains.
    fn amend(
        &self,
        s: &Samples,
        metrics: &mut [MetricVerdict],
        cfg: &DetectorConfig,
        requests_per_iter: Option<f64>,
    ) -> Vec<String>;
}

/// A metric's verdict with nothing decided yet.
pub(crate) fn blank(name: &str, spec: &MetricSpec, status: Status, reason: String) -> MetricVerdict {
    MetricVerdict {
        name: name.to_string(),
        kind: spec.kind.as_str().into(),
        unit: spec.unit.clone(),
        status,
        reason,
        first_iter: None,
        trend: None,
        capacity: spec.capacity,
        max_value: None,
        location: None,
        projected: None,
        sites: Vec::new(),
        needs_iterations: None,
        explained_share: None,
    }
}

#[cfg(test)]
mod overhead_tests;
#[cfg(test)]
mod test_noise;
#[cfg(test)]
mod tests;
