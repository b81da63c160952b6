//! The growth detector, in two layers (DESIGN.md, "How detection should work"):
//! 1. exact accounting: every `per_request` metric is 0 at every quiescent point, every `bounded`
//!    one within its capacity at every sample; one leaked entry fails at the iteration it appears;
//! 2. trends on `gauge` metrics after warm-up: a Theil–Sen slope, a Mann–Kendall test corrected
//!    for autocorrelation, a practical threshold, and a plateau test on the last half, so that a
//!    cache that fills and stops, a sawtooth or a one-off step passes.
//!
//! It decides by kind, never by name. Names only serve attribution afterwards: heap (jemalloc)
//! versus outside the heap (the kernel's view), and which registries moved with a growing gauge.

pub mod stats;

use plateau_engine::{Metric, MetricKind};
use plateau_reports::{Kind, MetricSpec, MetricVerdict, Samples, Status, Trend, Verdict, VERDICT_SCHEMA};

use stats::{mann_kendall, median, theil_sen};

#[derive(Debug, Clone, PartialEq)]
pub struct DetectorConfig {
    /// Quiescent iterations the trend test skips.
    pub warmup_iterations: u64,
    /// Significance of the trend over the whole series after warm-up.
    pub p_value: f64,
    /// Significance of the trend over its last half: below it, still growing.
    pub tail_p_value: f64,
    /// Practical threshold for byte gauges: growth over the series...
    pub min_growth_bytes: f64,
    /// ...and rate, so that one page is never a leak but a night's growth is.
    pub min_bytes_per_hour: f64,
    /// Practical threshold for count gauges (mappings, fds, threads).
    pub min_growth_count: f64,
    /// Fewer quiescent points after warm-up than this: no trend verdict (warn).
    pub min_points: usize,
}

impl Default for DetectorConfig {
    fn default() -> Self {
        DetectorConfig {
            warmup_iterations: 20,
            p_value: 0.01,
            tail_p_value: 0.05,
            min_growth_bytes: 128.0 * 1024.0,
            min_bytes_per_hour: 1024.0 * 1024.0,
            min_growth_count: 16.0,
            min_points: 12,
        }
    }
}

/// The samples-file spec of an engine metric: its kind (what the detector judges it by), unit and
/// capacity. The soak's probes and the simulator's quiescent samples both describe metrics this way.
pub fn spec_of(m: &Metric) -> MetricSpec {
    let (kind, capacity) = match m.kind {
        MetricKind::Gauge => (Kind::Gauge, None),
        MetricKind::PerRequest => (Kind::PerRequest, None),
        MetricKind::Bounded { capacity } => (Kind::Bounded, Some(capacity)),
        MetricKind::Counter => (Kind::Counter, None),
    };
    MetricSpec { kind, unit: m.unit.to_string(), capacity }
}

/// The verdict of one gauge series.
struct Judged {
    status: Status,
    reason: String,
    trend: Option<Trend>,
}

fn fmt_value(v: f64, unit: &str) -> String {
    if unit == "bytes" {
        let a = v.abs();
        if a >= 1024.0 * 1024.0 {
            format!("{:.2} MiB", v / 1024.0 / 1024.0)
        } else if a >= 1024.0 {
            format!("{:.1} KiB", v / 1024.0)
        } else {
            format!("{v:.0} B")
        }
    } else {
        format!("{v:.1}")
    }
}

/// Judges a gauge's quiescent series after warm-up: (iteration, seconds, value) points.
fn judge(points: &[(f64, f64, f64)], unit: &str, cfg: &DetectorConfig) -> Judged {
    let n = points.len();
    if n < cfg.min_points {
        return Judged {
            status: Status::Warn,
            reason: format!("only {n} quiescent points after warm-up (need {}): no trend verdict", cfg.min_points),
            trend: None,
        };
    }
    let x: Vec<f64> = points.iter().map(|p| p.0).collect();
    let y: Vec<f64> = points.iter().map(|p| p.2).collect();
    let slope = theil_sen(&x, &y);
    let mk = mann_kendall(&x, &y);
    let half = n / 2;
    let tail_slope = theil_sen(&x[half..], &y[half..]);
    let tail_mk = mann_kendall(&x[half..], &y[half..]);
    let tenth = (n / 10).max(3).min(n);
    let growth = median(&mut y[n - tenth..].to_vec()) - median(&mut y[..tenth].to_vec());
    let span_iters = x[n - 1] - x[0];
    let span_hours = (points[n - 1].1 - points[0].1) / 3600.0;
    let slope_per_hour = if span_hours > 0.0 { slope * span_iters / span_hours } else { 0.0 };
    let trend = Trend {
        slope_per_iter: slope,
        slope_per_hour,
        growth_after_warmup: growth,
        tail_slope_per_iter: tail_slope,
        test: "mann-kendall/hamed-rao".into(),
        z: mk.z,
        p_value: mk.p_increase,
        tail_p_value: tail_mk.p_increase,
        points: n,
    };
    let projected = slope * span_iters;
    let floor = if unit == "bytes" { cfg.min_growth_bytes } else { cfg.min_growth_count };
    let practical = projected >= floor && (unit != "bytes" || slope_per_hour >= cfg.min_bytes_per_hour);
    let significant = slope > 0.0 && mk.p_increase < cfg.p_value;
    // Still growing: the last half alone shows a significant rise, at a good part of the overall
    // rate, and by more than the practical floor. A creep of a page every few iterations that is
    // settling, or one step, does not pass this; a leak does.
    let tail_growth = tail_slope * (x[n - 1] - x[half]);
    let still_growing =
        tail_slope > 0.0 && tail_mk.p_increase < cfg.tail_p_value && tail_slope >= 0.25 * slope && tail_growth >= floor;
    let rate = format!("{}/iteration, {}/hour", fmt_value(slope, unit), fmt_value(slope_per_hour, unit));
    let (status, reason) = if significant && practical && still_growing {
        (
            Status::Fail,
            format!(
                "grows without levelling off: {rate} (p = {:.1e}; last half still {}/iteration, p = {:.1e})",
                mk.p_increase,
                fmt_value(tail_slope, unit),
                tail_mk.p_increase
            ),
        )
    } else if significant && practical {
        (
            Status::Warn,
            format!(
                "grew by {} after warm-up, then levelled off (last half {}/iteration)",
                fmt_value(growth, unit),
                fmt_value(tail_slope, unit)
            ),
        )
    } else if significant {
        (Status::Pass, format!("a significant but negligible trend: {rate}, below the practical threshold"))
    } else {
        (Status::Pass, format!("flat: {rate}, p = {:.2}", mk.p_increase))
    };
    Judged { status, reason, trend: Some(trend) }
}

/// Runs both layers over a samples file and returns the verdict.
pub fn analyze(s: &Samples, cfg: &DetectorConfig, incomplete: bool) -> Verdict {
    let quiescent: Vec<&plateau_reports::Row> = s.rows.iter().filter(|r| r.quiescent).collect();
    let iterations = s.rows.iter().map(|r| r.iter).max().unwrap_or(0);
    let mut metrics = Vec::new();
    for (i, name) in s.names.iter().enumerate() {
        let spec = &s.header.metrics[name];
        let base = |status, reason: String| MetricVerdict {
            name: name.clone(),
            kind: spec.kind.as_str().into(),
            unit: spec.unit.clone(),
            status,
            reason,
            first_iter: None,
            trend: None,
            capacity: spec.capacity,
            max_value: None,
            location: None,
        };
        match spec.kind {
            Kind::Counter => {}
            Kind::PerRequest => {
                let vals: Vec<(u64, f64)> = quiescent.iter().filter_map(|r| r.values[i].map(|v| (r.iter, v))).collect();
                let max = vals.iter().map(|v| v.1).fold(0.0, f64::max);
                let mut m = match vals.iter().find(|v| v.1 > 0.0) {
                    Some(&(it, v)) => {
                        let mut m = base(
                            Status::Fail,
                            format!(
                                "{v} entries left with nothing in flight at iteration {it}; up to {max} by the end: per-request state never released"
                            ),
                        );
                        m.first_iter = Some(it);
                        m.location = Some(format!("registry {name}"));
                        m
                    }
                    None => base(Status::Pass, format!("0 at all {} quiescent points", vals.len())),
                };
                m.max_value = Some(max);
                metrics.push(m);
            }
            Kind::Bounded => {
                let cap = spec.capacity.unwrap_or(u64::MAX) as f64;
                let max = s.rows.iter().filter_map(|r| r.values[i]).fold(0.0, f64::max);
                let mut m = match s.rows.iter().find(|r| r.values[i].is_some_and(|v| v > cap)) {
                    Some(r) => {
                        let mut m = base(
                            Status::Fail,
                            format!(
                                "{} entries at iteration {}, above its capacity {cap}",
                                r.values[i].unwrap_or(0.0),
                                r.iter
                            ),
                        );
                        m.first_iter = Some(r.iter);
                        m.location = Some(format!("registry {name}"));
                        m
                    }
                    None => base(Status::Pass, format!("at most {max} of {cap}")),
                };
                m.max_value = Some(max);
                metrics.push(m);
            }
            Kind::Gauge => {
                let pts: Vec<(f64, f64, f64)> = quiescent
                    .iter()
                    .filter(|r| r.iter > cfg.warmup_iterations)
                    .filter_map(|r| r.values[i].map(|v| (r.iter as f64, r.t, v)))
                    .collect();
                let j = judge(&pts, &spec.unit, cfg);
                let mut m = base(j.status, j.reason);
                m.trend = j.trend;
                m.max_value = pts.iter().map(|p| p.2).reduce(f64::max);
                if m.status == Status::Fail {
                    m.first_iter = first_conclusive(&pts, &spec.unit, cfg);
                }
                metrics.push(m);
            }
        }
    }
    let attribution = attribute(s, &mut metrics, cfg);
    // Failures first, earliest evidence first; then warnings; then passes by name.
    metrics.sort_by(|a, b| {
        b.status
            .cmp(&a.status)
            .then(a.first_iter.unwrap_or(u64::MAX).cmp(&b.first_iter.unwrap_or(u64::MAX)))
            .then(a.name.cmp(&b.name))
    });
    let failed: Vec<&MetricVerdict> = metrics.iter().filter(|m| m.status == Status::Fail).collect();
    let verdict = if failed.is_empty() { Status::Pass } else { Status::Fail };
    let summary = if failed.is_empty() {
        let warns = metrics.iter().filter(|m| m.status == Status::Warn).count();
        format!(
            "pass: {} metrics judged over {} quiescent points ({} warm-up), {warns} warnings",
            metrics.len(),
            quiescent.len(),
            cfg.warmup_iterations
        )
    } else {
        let first = failed.iter().filter_map(|m| m.first_iter).min();
        format!(
            "fail: {}{}",
            failed.iter().map(|m| m.name.as_str()).collect::<Vec<_>>().join(", "),
            first.map(|f| format!(" (conclusive at iteration {f})")).unwrap_or_default()
        )
    };
    Verdict {
        schema: VERDICT_SCHEMA.into(),
        verdict,
        incomplete: incomplete || s.truncated_tail,
        scenario: s.header.scenario.clone(),
        seed: s.header.seed,
        backend: s.header.backend.clone(),
        injections: s.header.injections.clone(),
        iterations,
        warmup_iterations: cfg.warmup_iterations,
        samples: s.rows.len(),
        summary,
        attribution,
        metrics,
    }
}

/// The first iteration at which the series up to it already fails (checked at up to 40 points).
fn first_conclusive(pts: &[(f64, f64, f64)], unit: &str, cfg: &DetectorConfig) -> Option<u64> {
    let n = pts.len();
    let step = (n / 40).max(1);
    let mut k = cfg.min_points;
    while k <= n {
        if judge(&pts[..k], unit, cfg).status == Status::Fail {
            return Some(pts[k - 1].0 as u64);
        }
        k += step;
    }
    Some(pts[n - 1].0 as u64)
}

/// Says where growth is: heap or outside it, and which registries moved with a failing gauge.
fn attribute(s: &Samples, metrics: &mut [MetricVerdict], cfg: &DetectorConfig) -> Vec<String> {
    let status = |ms: &[MetricVerdict], name: &str| ms.iter().find(|m| m.name == name).map(|m| m.status);
    let slope = |ms: &[MetricVerdict], name: &str| {
        ms.iter().find(|m| m.name == name).and_then(|m| m.trend.as_ref()).map(|t| t.slope_per_iter)
    };
    let mut out = Vec::new();
    let regs: Vec<String> = metrics
        .iter()
        .filter(|m| m.status == Status::Fail && (m.kind == "per_request" || m.kind == "bounded"))
        .map(|m| m.name.clone())
        .collect();
    if !regs.is_empty() {
        out.push(format!("registry: {} kept entries past their requests", regs.join(", ")));
    }
    let heap_fail = status(metrics, "jemalloc.allocated") == Some(Status::Fail);
    let heap_slope = slope(metrics, "jemalloc.allocated").unwrap_or(0.0);
    // Registries whose own series rose along with a failing gauge.
    let moved_slopes: Vec<(String, f64)> = s
        .names
        .iter()
        .enumerate()
        .filter(|(_, n)| {
            // Families after any role prefix (`decode.registry.pd.pulls`).
            let family = ["registry.", "engine."].iter().find_map(|f| n.find(f).map(|i| &n[i..])).unwrap_or("");
            family.starts_with("registry.") || family.starts_with("engine.") && family.ends_with("_bytes")
        })
        .filter(|(_, n)| s.header.metrics[*n].kind != Kind::Counter)
        .filter_map(|(i, n)| {
            let pts: Vec<(u64, f64)> =
                s.quiescent_series(i).into_iter().filter(|p| p.0 > cfg.warmup_iterations).collect();
            if pts.len() < cfg.min_points {
                return None;
            }
            let x: Vec<f64> = pts.iter().map(|p| p.0 as f64).collect();
            let y: Vec<f64> = pts.iter().map(|p| p.1).collect();
            let sl = theil_sen(&x, &y);
            (sl > 0.0 && mann_kendall(&x, &y).p_increase < cfg.p_value).then(|| (n.clone(), sl))
        })
        .collect();
    let moved: Vec<String> = moved_slopes.iter().map(|(n, sl)| format!("{n} (+{sl:.1}/iteration)")).collect();
    let failed_heaps: Vec<String> = metrics
        .iter()
        .filter(|m| m.status == Status::Fail && m.name.ends_with("jemalloc.allocated"))
        .map(|m| m.name.clone())
        .collect();
    for m in metrics.iter_mut().filter(|m| m.status == Status::Fail && m.kind == "gauge") {
        let outside_family = m.name.contains("proc.rss") || m.name.contains("proc.anon");
        // The heap of the same process (a role prefix such as `decode.` names another process).
        let process = m.name.split("proc.").next().unwrap_or("");
        let heap_fail = failed_heaps.contains(&format!("{process}jemalloc.allocated"));
        m.location = Some(if m.name.contains("jemalloc.") {
            "heap (jemalloc)".to_string()
        } else if outside_family && !heap_fail {
            "outside the heap: anonymous mappings not made by the allocator".to_string()
        } else if outside_family {
            "process memory (the heap grows too)".to_string()
        } else if m.name.contains("gpu.") {
            "device memory".to_string()
        } else {
            "engine".to_string()
        });
        if !moved.is_empty() {
            m.reason.push_str(&format!("; moved with it: {}", moved.join(", ")));
        }
    }
    let outside: Vec<&MetricVerdict> = metrics
        .iter()
        .filter(|m| m.status == Status::Fail && (m.name.contains("proc.rss") || m.name.contains("proc.anon")))
        .collect();
    if heap_fail {
        // Bytes per leaked entry, against each per-request registry that grew with the heap.
        let per_entry: Vec<String> = moved_slopes
            .iter()
            .filter(|(n, sl)| *sl >= 1.0 && s.header.metrics[n].kind == Kind::PerRequest)
            .map(|(n, sl)| format!("about {} per entry of {n}", fmt_value(heap_slope / sl, "bytes")))
            .collect();
        let per_entry = if per_entry.is_empty() { String::new() } else { format!(" ({})", per_entry.join(", ")) };
        out.push(format!("heap: jemalloc.allocated grows {}/iteration{per_entry}", fmt_value(heap_slope, "bytes")));
    }
    // Outside the heap: growth of a process's anonymous memory while that process's heap is flat.
    let outside: Vec<&MetricVerdict> = outside
        .into_iter()
        .filter(|m| {
            !failed_heaps.contains(&format!("{}jemalloc.allocated", m.name.split("proc.").next().unwrap_or("")))
        })
        .collect();
    if let Some(first) = outside.first() {
        let process = first.name.split("proc.").next().unwrap_or("");
        let heap_name = format!("{process}jemalloc.allocated");
        let heap = slope(metrics, &heap_name).unwrap_or(0.0);
        let rate = first.trend.as_ref().map(|t| fmt_value(t.slope_per_iter, "bytes")).unwrap_or_default();
        out.push(format!(
            "outside the heap: {} grow ({} {rate}/iteration) while {heap_name} stays flat ({}/iteration): anonymous mappings made outside the allocator",
            outside.iter().map(|m| m.name.as_str()).collect::<Vec<_>>().join(", "),
            first.name,
            fmt_value(heap, "bytes")
        ));
    }
    if !moved.is_empty() && metrics.iter().any(|m| m.status == Status::Fail && m.kind == "gauge") {
        out.push(format!("moved with the growth: {}", moved.join(", ")));
    }
    out
}

#[cfg(test)]
mod tests;
