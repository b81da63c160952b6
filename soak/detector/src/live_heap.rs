//! A process's memory weighed against the live heap its profiler saw. A server's process memory
//! (RSS, anonymous pages) holds its program's objects and also what its allocator keeps around
//! them: under churn (a cache at its bound replacing its oldest entries, a thread per connection
//! with an arena each) the allocator's footprint grows in steps while the objects do not. The
//! samples cannot tell the two apart; a profiled replay can: memray (a Python server) or jemalloc's
//! heap dumps (a native one) give the whole live heap's change over the same iterations, frees of
//! older objects included.
//!
//! Lifecycle: the run's replay writes the figure beside the samples (growth.json); the one judge
//! passes it in as evidence ([`LiveHeap`]); for a gauge that failed on its own, when the live heap
//! grew at under [`FLAT_SHARE`] of the rate the gauge failed at (or of its rate over the replay's
//! window, whichever is larger), the growth is the allocator's, and [`apply`] decides it: a pass when it slows by thirds of the judged run (each
//! third adds less than the one before), else undecided with a longer run to ask for. A live heap
//! that grew keeps the failure: that is the program's.

use plateau_reports::{MetricVerdict, Samples, Status};

use super::series::{fmt_value, longer};
use super::stats::median;
use super::DetectorConfig;

/// A live heap that grew at under this share of the process memory's rate over the same window
/// did not take the growth: a tenth leaves room for the profiler's own rounding and for objects
/// alive at one dump and not the next, while a leak of the program's objects shows at its full
/// rate (a Python server keeping 4 KiB a request: the live heap at the process memory's rate).
pub const FLAT_SHARE: f64 = 0.1;

/// What a profiled replay showed of a process's live heap beside one of its memory gauges.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveHeap {
    /// The gauge of process memory the replay explains.
    pub metric: String,
    pub start_iter: u64,
    pub end_iter: u64,
    /// The whole live heap's change per iteration over the window.
    pub live_bytes_per_iter: f64,
    /// Which profiler saw it ("memray").
    pub source: String,
}

/// A gauge's net rate over the quiescent points of [start, end], if two points are there: what a
/// profiled replay's window is compared with. The net change (the median of the window's last
/// fifth less that of its first fifth, five points at most, over the iterations between their
/// middles: a staircase's window keeps five points beyond each of its steps), not a fitted
/// slope: a staircase's steps are most of its rise, and a line through its level ground misses
/// them (a doubling id set's window of 40 iterations rose 1.4 KiB an iteration in two steps, and
/// its Theil–Sen slope said 752 B).
pub fn window_rate(s: &Samples, name: &str, start: u64, end: u64) -> Option<f64> {
    let i = s.index(name)?;
    let pts: Vec<(u64, f64)> = s.quiescent_series(i).into_iter().filter(|(it, _)| (start..=end).contains(it)).collect();
    (pts.len() >= 2).then(|| {
        let k = (pts.len() / 5).clamp(1, 5);
        let mid = |part: &[(u64, f64)]| {
            let mut x: Vec<f64> = part.iter().map(|p| p.0 as f64).collect();
            let mut y: Vec<f64> = part.iter().map(|p| p.1).collect();
            (median(&mut x), median(&mut y))
        };
        let ((x0, y0), (x1, y1)) = (mid(&pts[..k]), mid(&pts[pts.len() - k..]));
        (y1 - y0) / (x1 - x0).max(1.0)
    })
}

/// The rise of each third of the judged series, each third's ends seen by the median of its
/// first and last fifth (a point or two of noise at an edge does not decide).
fn thirds(s: &Samples, name: &str, warmup: u64) -> Option<[f64; 3]> {
    let i = s.index(name)?;
    let y: Vec<f64> = s.quiescent_series(i).into_iter().filter(|(it, _)| *it > warmup).map(|p| p.1).collect();
    if y.len() < 15 {
        return None;
    }
    let n = y.len();
    let rise = |part: &[f64]| {
        let k = (part.len() / 5).max(1);
        median(&mut part[part.len() - k..].to_vec()) - median(&mut part[..k].to_vec())
    };
    Some([rise(&y[..n / 3]), rise(&y[n / 3..2 * n / 3]), rise(&y[2 * n / 3..])])
}

/// Decides the failing gauges whose growth the live heap did not take (the module's lifecycle).
pub fn apply(s: &Samples, metrics: &mut [MetricVerdict], evidence: &[LiveHeap], cfg: &DetectorConfig) {
    for e in evidence {
        let Some(m) = metrics.iter_mut().find(|m| m.name == e.metric && m.kind == "gauge") else { continue };
        if m.status != Status::Fail {
            continue;
        }
        let failed_at = m.trend.as_ref().map_or(0.0, |t| t.slope_per_iter);
        let rate = window_rate(s, &e.metric, e.start_iter, e.end_iter).unwrap_or(0.0).max(failed_at);
        if rate <= 0.0 || e.live_bytes_per_iter > FLAT_SHARE * rate {
            continue;
        }
        let Some([r1, r2, r3]) = thirds(s, &e.metric, cfg.warmup_iterations) else { continue };
        let v = |a: f64| fmt_value(a, &m.unit);
        let seen = format!(
            "{} grew {}/iteration, but the live heap ({}, a replay of iterations {}..{}) changed {}/iteration: the growth is the allocator's (fragmentation or caching under churn), not the program's objects",
            e.metric,
            v(rate),
            e.source,
            e.start_iter,
            e.end_iter,
            v(e.live_bytes_per_iter)
        );
        let by_thirds = format!("{}, {}, {} by thirds of the run", v(r1), v(r2), v(r3));
        m.first_iter = None;
        m.projected = None;
        m.location = Some("the allocator's footprint around a live heap that did not grow".into());
        if r2 < r1 && r3 < r2 {
            m.status = Status::Pass;
            m.needs_iterations = None;
            m.reason = format!("{seen}; it slows ({by_thirds}): levelling off");
        } else {
            m.status = Status::Inconclusive;
            let last = s.last_iter() as f64;
            m.needs_iterations = Some(longer(last));
            m.reason = format!(
                "{seen}; it has not yet slowed ({by_thirds}): whether it levels off is undecided; a longer run would tell"
            );
        }
    }
}
