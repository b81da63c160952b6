//! plateau-detector: the growth detector over samples.jsonl v1, which depends on the samples
//! model (plateau-reports) only. It judges in two layers:
//! 1. exact accounting, free of statistics: every `per_request` metric is 0 at every quiescent
//!    point, every `bounded` one within its capacity at every sample, every `counter` never
//!    decreases, and every idle self-check the engine ran at a quiescent point held. One leaked
//!    entry fails, at the iteration it first appears (`exact.rs`);
//! 2. trends on `gauge` metrics after warm-up, judged in units of the work (per iteration, per
//!    request), at any rate the run resolves (`gauge.rs`).
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
pub mod gauge;
mod judge;
mod live_heap;
mod overhead;
pub mod power;
pub mod release;
pub mod stats;
pub mod steps;
pub mod tolerance;

use plateau_reports::{
    Kind, MetricSpec, MetricVerdict, Projection, Row, Samples, Status, Trend, Verdict, ROLE_REQUESTS, VERDICT_SCHEMA,
};

use gauge::{fmt_value, Series};
pub use judge::{judge, judge_with, judge_with_evidence, unfinished, Overrides, STOPPED_ON_EXACT_FAILURE};
pub use live_heap::{window_rate, LiveHeap};
pub use tolerance::{Per, Tolerance};

/// Warm-up when neither the user nor the scenario or samples header says: the engine's caches
/// (prefix cache, encoder cache, allocator size classes) fill within the first few iterations of
/// every shipped scenario, and 20 leaves 180 judged points in a default 200-iteration run.
pub const DEFAULT_WARMUP_ITERATIONS: u64 = 20;

/// The one warm-up rule of the soak, `analyze` and the simulator: the user's `--warmup`, else what
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
    }
}

/// What the run's work and pace were: requests per iteration and seconds per iteration.
struct Pace {
    requests_per_iter: Option<f64>,
    seconds_per_iter: Option<f64>,
}

/// Requests per iteration from the counters the header declares with the role `requests` (the
/// largest: in a P/D run the prefill side's, which sees every request), and the median seconds
/// per iteration.
fn pace(s: &Samples, quiescent: &[&Row], warmup: u64) -> Pace {
    let judged: Vec<&&Row> = quiescent.iter().filter(|r| r.iter >= warmup).collect();
    let requests_per_iter = s
        .names
        .iter()
        .enumerate()
        .filter(|(_, n)| {
            let spec = &s.header.metrics[*n];
            spec.kind == Kind::Counter && spec.role.as_deref() == Some(ROLE_REQUESTS)
        })
        .filter_map(|(i, _)| {
            let pts: Vec<(u64, f64)> = judged.iter().filter_map(|r| r.values[i].map(|v| (r.iter, v))).collect();
            let (first, last) = (pts.first()?, pts.last()?);
            (last.0 > first.0).then(|| (last.1 - first.1) / (last.0 - first.0) as f64)
        })
        .fold(None, |best: Option<f64>, r| Some(best.map_or(r, |b| b.max(r))))
        .filter(|r| *r > 0.0);
    let mut per_iter: Vec<f64> = judged
        .windows(2)
        .filter(|w| w[1].iter > w[0].iter)
        .map(|w| (w[1].t - w[0].t) / (w[1].iter - w[0].iter) as f64)
        .collect();
    let seconds_per_iter = (!per_iter.is_empty()).then(|| stats::median(&mut per_iter));
    Pace { requests_per_iter, seconds_per_iter }
}

/// Judges one gauge: inconclusive below `min_points`, else the trend, its resolution and, for a
/// failure, the first conclusive iteration and what the growth costs.
fn judge_gauge(
    name: &str,
    spec: &MetricSpec,
    s: &Samples,
    i: usize,
    cfg: &DetectorConfig,
    pace: &Pace,
) -> MetricVerdict {
    let pts: Vec<(f64, f64)> = s
        .rows
        .iter()
        .filter(|r| r.quiescent && r.iter > cfg.warmup_iterations)
        .filter_map(|r| r.values[i].map(|v| (r.iter as f64, v)))
        .collect();
    if pts.len() < cfg.min_points {
        return blank(
            name,
            spec,
            Status::Inconclusive,
            format!(
                "only {} quiescent points after a warm-up of {} iterations (need {}): no trend verdict",
                pts.len(),
                cfg.warmup_iterations,
                cfg.min_points
            ),
        );
    }
    let x: Vec<f64> = pts.iter().map(|p| p.0).collect();
    let y: Vec<f64> = pts.iter().map(|p| p.1).collect();
    let bytes = spec.unit == "bytes";
    // What the writer declared (a page, one entry), else one unit: a reader cannot tell a
    // coarser grid from values that happen to be round.
    let quantum = spec.quantum.unwrap_or(1.0).max(1.0);
    let tolerance_per_iter =
        if bytes { cfg.tolerance.per_iteration(pace.requests_per_iter).unwrap_or(0.0) } else { 0.0 };
    let series = Series { x: &x, y: &y, unit: &spec.unit, quantum, tolerance_per_iter };
    let j = gauge::judge(&series, cfg);
    let failed = j.status == Status::Fail;
    let passed = j.status == Status::Pass;
    let resolution = gauge::resolution(&series, j.slope, passed, cfg);
    // The same search with no tolerance: what the noise alone resolves. The two differ where the
    // tolerance, not the noise, sets the bar (a quiet heap in a run of many requests).
    let noise_resolution = if tolerance_per_iter > 0.0 {
        gauge::resolution(&Series { tolerance_per_iter: 0.0, ..series }, j.slope, passed, cfg)
    } else {
        resolution
    };
    let per_request = |v: f64| pace.requests_per_iter.map(|r| v / r);
    let mut m = blank(name, spec, j.status, j.reason);
    m.needs_iterations = j.needs_iterations;
    m.max_value = y.iter().copied().reduce(f64::max);
    m.trend = Some(Trend {
        slope_per_iter: j.slope,
        slope_per_hour: pace.seconds_per_iter.filter(|s| *s > 0.0).map_or(0.0, |s| j.slope * 3600.0 / s),
        growth_after_warmup: j.growth,
        tail_slope_per_iter: j.tail_slope,
        test: "mann-kendall/hamed-rao".into(),
        z: j.mk.z,
        p_value: j.mk.p_increase,
        tail_p_value: j.tail_p,
        points: pts.len(),
        quantum,
        noise: j.noise,
        // An infinite resolution (no rate the search tried failed the series) is recorded as
        // none: JSON has no infinity, and a verdict must read back as it was written.
        resolution_per_iter: resolution.is_finite().then_some(resolution),
        resolution_per_request: per_request(resolution).filter(|r| r.is_finite()),
        tolerance_per_iter,
        noise_resolution_per_iter: noise_resolution.is_finite().then_some(noise_resolution),
    });
    if failed {
        m.first_iter = Some(gauge::first_conclusive(&series, cfg));
        let p = Projection {
            per_request: per_request(j.slope),
            per_million_requests: per_request(j.slope).map(|v| v * 1e6),
            per_day: pace.seconds_per_iter.filter(|s| *s > 0.0).map(|s| j.slope * 86_400.0 / s),
        };
        let mut cost = Vec::new();
        if let Some(v) = p.per_request {
            cost.push(format!("{} per request", fmt_value(v, &spec.unit)));
        }
        if let Some(v) = p.per_million_requests {
            cost.push(format!("{} per million requests", fmt_value(v, &spec.unit)));
        }
        if let Some(v) = p.per_day {
            cost.push(format!("{} per day at this run's pace", fmt_value(v, &spec.unit)));
        }
        if !cost.is_empty() {
            m.reason.push_str(&format!("; that is {}", cost.join(", ")));
        }
        m.projected = Some(p);
    } else if j.status == Status::Pass && resolution.is_finite() {
        m.reason.push_str(&format!("; resolves {}/iteration", fmt_value(resolution, &spec.unit)));
        if tolerance_per_iter > 0.0 && noise_resolution.is_finite() {
            m.reason.push_str(&format!(
                " (its noise alone {}, the tolerance accepts {})",
                fmt_value(noise_resolution, &spec.unit),
                fmt_value(tolerance_per_iter, &spec.unit)
            ));
        }
    }
    m
}

/// Runs both layers over a samples file with `cfg` and returns the verdict; `unfinished` says why
/// the run did not finish, if it did not (an unfinished run is never a pass). Commands judge
/// through [`judge`], which takes both from the file.
pub fn analyze(s: &Samples, cfg: &DetectorConfig, unfinished: Option<&str>) -> Verdict {
    let quiescent: Vec<&Row> = s.rows.iter().filter(|r| r.quiescent).collect();
    let iterations = s.rows.iter().map(|r| r.iter).max().unwrap_or(0);
    let pace = pace(s, &quiescent, cfg.warmup_iterations);
    let mut warnings = s.warnings.clone();
    let tolerance_known = cfg.tolerance.per_iteration(pace.requests_per_iter).is_some();
    if !tolerance_known {
        warnings.push(format!(
            "tolerance {}: the samples count no requests, so byte gauges are judged with no tolerance",
            cfg.tolerance
        ));
    }
    let mut metrics = Vec::new();
    let mut observed = Vec::new();
    for (i, name) in s.names.iter().enumerate() {
        let spec = &s.header.metrics[name];
        match spec.kind {
            Kind::Observed => observed.push(name.as_str()),
            Kind::Counter => metrics.push(exact::counter(name, spec, s, i)),
            Kind::PerRequest => metrics.push(exact::per_request(name, spec, &quiescent, i, cfg.min_points)),
            Kind::Bounded => metrics.push(exact::bounded(name, spec, s, i)),
            Kind::Gauge => metrics.push(judge_gauge(name, spec, s, i, cfg, &pace)),
        }
    }
    bounds::apply(s, &mut metrics);
    overhead::apply(s, &mut metrics, cfg);
    live_heap::apply(s, &mut metrics, &cfg.live_heap, cfg);
    metrics.extend(exact::checks(&quiescent, &metrics));
    let attribution = attribution::attribute(s, &mut metrics, cfg);
    // Failures first, earliest evidence first; then what could not be judged; then warnings;
    // then passes by name.
    metrics.sort_by(|a, b| {
        b.status
            .cmp(&a.status)
            .then(a.first_iter.unwrap_or(u64::MAX).cmp(&b.first_iter.unwrap_or(u64::MAX)))
            .then(a.name.cmp(&b.name))
    });
    let count = |st: Status| metrics.iter().filter(|m| m.status == st).count();
    // Memory was judged when a gauge got a trend verdict or a per-request registry was checked at
    // quiescent points: counters and bounded registries alone say nothing about growth.
    let memory_judged =
        metrics.iter().any(|m| matches!(m.kind.as_str(), "gauge" | "per_request") && m.status != Status::Inconclusive);
    let verdict = if count(Status::Fail) > 0 {
        Status::Fail
    } else if count(Status::Inconclusive) > 0 || !memory_judged || unfinished.is_some() {
        Status::Inconclusive
    } else {
        Status::Pass
    };
    let heap = metrics
        .iter()
        .filter(|m| m.name.ends_with("jemalloc.allocated"))
        .filter_map(|m| m.trend.as_ref())
        .map(|t| {
            let per_req = t
                .resolution_per_request
                .map(|r| format!(", {} per request", fmt_value(r, "bytes")))
                .unwrap_or_default();
            let split = match t.noise_resolution_per_iter {
                Some(n) if t.tolerance_per_iter > 0.0 && n.is_finite() => format!(
                    " (its noise alone resolves {}/iteration; the tolerance accepts {}/iteration)",
                    fmt_value(n, "bytes"),
                    fmt_value(t.tolerance_per_iter, "bytes")
                ),
                _ => String::new(),
            };
            match t.resolution_per_iter {
                Some(r) => format!("; the heap resolves {}/iteration{per_req}{split}", fmt_value(r, "bytes")),
                None => "; the heap's noise resolves no steady rate the search tried".to_string(),
            }
        })
        .next()
        .unwrap_or_default();
    let summary = match verdict {
        Status::Fail => {
            let failed: Vec<&str> =
                metrics.iter().filter(|m| m.status == Status::Fail).map(|m| m.name.as_str()).collect();
            let first = metrics.iter().filter(|m| m.status == Status::Fail).filter_map(|m| m.first_iter).min();
            format!(
                "fail: {}{}",
                failed.join(", "),
                first.map(|f| format!(" (conclusive at iteration {f})")).unwrap_or_default()
            )
        }
        Status::Inconclusive if metrics.is_empty() => "inconclusive: the samples name no metric to judge".to_string(),
        Status::Inconclusive if count(Status::Inconclusive) == 0 && !memory_judged => format!(
            "inconclusive: no memory gauge or per-request registry was judged ({} metrics, all counters or bounded registries): nothing here says whether memory levelled off",
            metrics.len()
        ),
        Status::Inconclusive if count(Status::Inconclusive) == 0 => format!(
            "inconclusive: the run did not finish ({}); what it sampled shows no failure, but an unfinished run is never a pass",
            unfinished.unwrap_or("")
        ),
        Status::Inconclusive => {
            let why =
                metrics.iter().find(|m| m.status == Status::Inconclusive).map(|m| m.reason.clone()).unwrap_or_default();
            format!(
                "inconclusive: {} of {} metrics could not be judged ({}: {why}); nothing failed",
                count(Status::Inconclusive),
                metrics.len(),
                metrics.iter().find(|m| m.status == Status::Inconclusive).map(|m| m.name.as_str()).unwrap_or("")
            )
        }
        _ => format!(
            "pass: {} metrics judged over {} quiescent points ({} warm-up){heap}",
            metrics.len(),
            quiescent.len(),
            cfg.warmup_iterations,
        ),
    };
    if !observed.is_empty() {
        warnings.push(format!("shown, not judged (observed): {}", observed.join(", ")));
    }
    Verdict {
        schema: VERDICT_SCHEMA.into(),
        verdict,
        incomplete: unfinished.is_some(),
        scenario: s.header.scenario.clone(),
        seed: s.header.seed,
        backend: s.header.backend.clone(),
        injections: s.header.injections.clone(),
        iterations,
        warmup_iterations: cfg.warmup_iterations,
        samples: s.rows.len(),
        summary,
        attribution,
        requests_per_iter: pace.requests_per_iter,
        seconds_per_iter: pace.seconds_per_iter,
        tolerance: cfg.tolerance.to_string(),
        planned_iterations: None,
        overrides: Vec::new(),
        warnings,
        target_exit: None,
        settle_timeouts: 0,
        control: None,
        evidence: None,
        metrics,
    }
}

#[cfg(test)]
mod overhead_tests;
#[cfg(test)]
mod tests;
