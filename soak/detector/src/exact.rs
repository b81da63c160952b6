//! The exact layer: accounting that needs no statistics. A deterministic engine at a quiescent
//! point has nothing in flight, so every per-request structure must be empty, every bounded one
//! within its capacity, every counter at least where it was, and every idle self-check must hold.
//! One violation fails, at the iteration it first appears.

use plateau_reports::{Kind, MetricSpec, MetricVerdict, Row, Samples, Status};

use super::blank;

/// `per_request`: zero at every quiescent point. One entry left fails, at the first point it
/// shows; a pass needs `min_points` quiescent points after the first iteration (the baseline
/// sample at iteration 0, before any request, proves nothing). That is the trend layer's bar: a
/// leak on a path a scenario takes once in a few iterations (an abort at one stage, a sleep
/// phase) shows within that many, while a registry seen empty once or twice says nothing about
/// whether it empties run after run.
pub fn per_request(name: &str, spec: &MetricSpec, quiescent: &[&Row], i: usize, min_points: usize) -> MetricVerdict {
    let vals: Vec<(u64, f64)> = quiescent.iter().filter_map(|r| r.values[i].map(|v| (r.iter, v))).collect();
    if vals.is_empty() {
        return blank(
            name,
            spec,
            Status::Inconclusive,
            "no value at any quiescent point: whether it returns to zero cannot be judged".into(),
        );
    }
    let after_start = vals.iter().filter(|v| v.0 > 0).count();
    let max = vals.iter().map(|v| v.1).fold(0.0, f64::max);
    let mut m = match vals.iter().find(|v| v.1 != 0.0) {
        Some(&(it, v)) => {
            let mut m = blank(
                name,
                spec,
                Status::Fail,
                format!(
                    "{v} entries left with nothing in flight at iteration {it}; up to {max} by the end: per-request state never released"
                ),
            );
            m.first_iter = Some(it);
            m.location = Some(format!("registry {name}"));
            m
        }
        None if after_start < min_points => blank(
            name,
            spec,
            Status::Inconclusive,
            format!(
                "0 at all {} quiescent points, but only {after_start} after the first iteration (need {min_points}): too few to show it returns to zero run after run",
                vals.len()
            ),
        ),
        None => blank(name, spec, Status::Pass, format!("0 at all {} quiescent points", vals.len())),
    };
    m.max_value = Some(max);
    m
}

/// `bounded`: within its capacity at every sample, quiescent or not.
pub fn bounded(name: &str, spec: &MetricSpec, s: &Samples, i: usize) -> MetricVerdict {
    let cap = spec.capacity.unwrap_or(u64::MAX) as f64;
    let vals: Vec<(u64, f64)> = s.rows.iter().filter_map(|r| r.values[i].map(|v| (r.iter, v))).collect();
    if vals.is_empty() {
        return blank(name, spec, Status::Inconclusive, "no value in any sample".into());
    }
    let max = vals.iter().map(|v| v.1).fold(0.0, f64::max);
    let mut m = match vals.iter().find(|v| v.1 > cap) {
        Some(&(it, v)) => {
            let mut m =
                blank(name, spec, Status::Fail, format!("{v} entries at iteration {it}, above its capacity {cap}"));
            m.first_iter = Some(it);
            m.location = Some(format!("registry {name}"));
            m
        }
        None => blank(name, spec, Status::Pass, format!("at most {max} of {cap}")),
    };
    m.max_value = Some(max);
    m
}

/// `counter`: monotonic and cumulative; a decrease means the count was lost or reset.
pub fn counter(name: &str, spec: &MetricSpec, s: &Samples, i: usize) -> MetricVerdict {
    let vals: Vec<(u64, f64)> = s.rows.iter().filter_map(|r| r.values[i].map(|v| (r.iter, v))).collect();
    let drop = vals.windows(2).find(|w| w[1].1 < w[0].1);
    let mut m = match (drop, vals.first(), vals.last()) {
        (Some(w), _, _) => {
            let mut m = blank(
                name,
                spec,
                Status::Fail,
                format!(
                    "went down from {} to {} at iteration {}: a counter must never decrease (lost or reset state)",
                    w[0].1, w[1].1, w[1].0
                ),
            );
            m.first_iter = Some(w[1].0);
            m
        }
        (None, Some(a), Some(b)) => {
            blank(name, spec, Status::Pass, format!("monotonic: +{} over {} samples", b.1 - a.1, vals.len()))
        }
        _ => blank(name, spec, Status::Inconclusive, "no value in any sample: nothing to check".into()),
    };
    m.max_value = vals.last().map(|v| v.1);
    m
}

/// The engine's idle self-checks, as recorded at quiescent points: a failed check that no metric
/// above already fails on is a failure of its own (the KV pool's accounting, request counts).
pub fn checks(quiescent: &[&Row], judged: &[MetricVerdict]) -> Vec<MetricVerdict> {
    let already = |name: &str| judged.iter().any(|m| m.name == name && m.status == Status::Fail);
    let mut out: Vec<MetricVerdict> = Vec::new();
    for r in quiescent {
        for (name, detail) in &r.checks {
            if already(name) || out.iter().any(|m| &m.name == name) {
                continue;
            }
            let spec = MetricSpec::new(Kind::PerRequest, "count");
            let mut m =
                blank(name, &spec, Status::Fail, format!("idle self-check failed at iteration {}: {detail}", r.iter));
            m.kind = "check".into();
            m.first_iter = Some(r.iter);
            m.location = Some("the engine's idle self-check (check_idle)".into());
            out.push(m);
        }
    }
    out
}
