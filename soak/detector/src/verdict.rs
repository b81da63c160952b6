//! Both layers over one samples file, into a verdict: each metric judged by its kind (the exact
//! layer for counters, per-request and bounded registries; the trend layer for gauges), the
//! passes over them that weigh relations the header declares, then the overall status and its
//! summary. Only [`crate::judge`] calls it: it takes the settings it judges with from the file.

use plateau_reports::{Kind, MetricVerdict, Row, Samples, Status, Verdict, VERDICT_SCHEMA};

use super::gauge::{judge_gauge, pace, Pace};
use super::series::fmt_value;
use super::{attribution, bounds, exact, live_heap, overhead, DetectorConfig, GaugeEvidence};

/// Runs both layers over a samples file with `cfg` and returns the verdict; `unfinished` says why
/// the run did not finish, if it did not (an unfinished run is never a pass). Commands judge
/// through [`crate::judge`], which takes both from the file.
pub(crate) fn analyze(
    s: &Samples,
    cfg: &DetectorConfig,
    unfinished: Option<&str>,
    evidence: Option<&dyn GaugeEvidence>,
) -> Verdict {
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
    let (metrics, observed, attribution) = judge_metrics(s, cfg, &quiescent, &pace, evidence);
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
    let summary = summary(verdict, &metrics, memory_judged, unfinished, quiescent.len(), cfg.warmup_iterations);
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
        known: Vec::new(),
        metrics,
    }
}

/// Every metric judged by its kind, then the passes that weigh what the header declares
/// (bounds, overheads on the live heap, replays' live heaps, the exact self-checks), and where
/// growth is; failures first, earliest evidence first, then what could not be judged, then passes
/// by name. Also the names of the metrics only shown (observed).
fn judge_metrics<'s>(
    s: &'s Samples,
    cfg: &DetectorConfig,
    quiescent: &[&Row],
    pace: &Pace,
    evidence: Option<&dyn GaugeEvidence>,
) -> (Vec<MetricVerdict>, Vec<&'s str>, Vec<String>) {
    let mut metrics = Vec::new();
    let mut observed = Vec::new();
    for (i, name) in s.names.iter().enumerate() {
        let spec = &s.header.metrics[name];
        match spec.kind {
            Kind::Observed => observed.push(name.as_str()),
            Kind::Counter => metrics.push(exact::counter(name, spec, s, i)),
            Kind::PerRequest => metrics.push(exact::per_request(name, spec, quiescent, i, cfg.min_points)),
            Kind::Bounded => metrics.push(exact::bounded(name, spec, s, i)),
            Kind::Gauge => metrics.push(judge_gauge(name, spec, s, i, cfg, pace)),
        }
    }
    bounds::apply(s, &mut metrics);
    overhead::apply(s, &mut metrics, cfg);
    live_heap::apply(s, &mut metrics, &cfg.live_heap, cfg);
    let sites = evidence.map(|e| e.amend(s, &mut metrics, cfg, pace.requests_per_iter)).unwrap_or_default();
    metrics.extend(exact::checks(quiescent, &metrics));
    let mut attribution = attribution::attribute(s, &mut metrics, cfg);
    attribution.extend(sites);
    // Failures first, earliest evidence first; then what could not be judged; then warnings;
    // then passes by name.
    metrics.sort_by(|a, b| {
        b.status
            .cmp(&a.status)
            .then(a.first_iter.unwrap_or(u64::MAX).cmp(&b.first_iter.unwrap_or(u64::MAX)))
            .then(a.name.cmp(&b.name))
    });
    (metrics, observed, attribution)
}

/// The verdict's one-line summary: what failed and when it was first conclusive, why nothing
/// could be said, or what a pass judged (with the heap's resolution where there is a heap).
fn summary(
    verdict: Status,
    metrics: &[MetricVerdict],
    memory_judged: bool,
    unfinished: Option<&str>,
    quiescent: usize,
    warmup: u64,
) -> String {
    let count = |st: Status| metrics.iter().filter(|m| m.status == st).count();
    match verdict {
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
            "pass: {} metrics judged over {} quiescent points ({} warm-up){}",
            metrics.len(),
            quiescent,
            warmup,
            heap_line(metrics)
        ),
    }
}

/// The heap's resolution for a pass's summary, where the samples have a jemalloc heap.
fn heap_line(metrics: &[MetricVerdict]) -> String {
    metrics
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
        .unwrap_or_default()
}
