//! One gauge's verdict: its quiescent points after warm-up judged by the trend judge
//! (`trend.rs`), the run's power for it (`power.rs`), and for a failure the first conclusive
//! iteration and what the growth costs per request, per million requests and per day.

use plateau_reports::{Kind, MetricSpec, MetricVerdict, Projection, Row, Samples, Status, Trend, ROLE_REQUESTS};

use super::series::{fmt_value, Series};
use super::{blank, power, stats, trend, DetectorConfig};

/// What the run's work and pace were: requests per iteration and seconds per iteration.
pub(crate) struct Pace {
    pub(crate) requests_per_iter: Option<f64>,
    pub(crate) seconds_per_iter: Option<f64>,
}

/// Requests per iteration from the counters the header declares with the role `requests` (the
/// largest: in a P/D run the prefill side's, which sees every request), and the median seconds
/// per iteration.
pub(crate) fn pace(s: &Samples, quiescent: &[&Row], warmup: u64) -> Pace {
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
pub(crate) fn judge_gauge(
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
    let j = trend::judge(&series, cfg);
    let failed = j.status == Status::Fail;
    let passed = j.status == Status::Pass;
    let resolution = power::resolution(&series, j.slope, passed, cfg);
    // The same search with no tolerance: what the noise alone resolves. The two differ where the
    // tolerance, not the noise, sets the bar (a quiet heap in a run of many requests).
    let noise_resolution = if tolerance_per_iter > 0.0 {
        power::resolution(&Series { tolerance_per_iter: 0.0, ..series }, j.slope, passed, cfg)
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
        m.first_iter = Some(power::first_conclusive(&series, cfg));
        let p = projection(j.slope, pace);
        let cost = cost_line(&p, &spec.unit);
        if !cost.is_empty() {
            m.reason.push_str(&format!("; that is {cost}"));
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

/// What a steady growth of `slope` per iteration costs at this run's work and pace.
fn projection(slope: f64, pace: &Pace) -> Projection {
    let per_request = pace.requests_per_iter.map(|r| slope / r);
    Projection {
        per_request,
        per_million_requests: per_request.map(|v| v * 1e6),
        per_day: pace.seconds_per_iter.filter(|s| *s > 0.0).map(|s| slope * 86_400.0 / s),
    }
}

/// A projection for people: "1.2 KiB per request, 1.1 GiB per million requests, ..." (empty
/// where the run counted no requests and kept no time).
fn cost_line(p: &Projection, unit: &str) -> String {
    let mut cost = Vec::new();
    if let Some(v) = p.per_request {
        cost.push(format!("{} per request", fmt_value(v, unit)));
    }
    if let Some(v) = p.per_million_requests {
        cost.push(format!("{} per million requests", fmt_value(v, unit)));
    }
    if let Some(v) = p.per_day {
        cost.push(format!("{} per day at this run's pace", fmt_value(v, unit)));
    }
    cost.join(", ")
}
