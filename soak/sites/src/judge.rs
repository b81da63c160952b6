//! Each site's series judged by the one judge. A site's live bytes at the run's quiescent points
//! are a gauge like any other: they go through the detector with the run's own warm-up,
//! tolerance (per request, from the run's request counter) and end, so a site is judged by the
//! same rules as the gauges (levelling, steps, releases, the tolerance), never by rules of its own.
//!
//! What a site is follows from that judgement:
//! - a **leak** when the judge fails its series: its live bytes grow with the work and do not
//!   level off;
//! - a **fill** when the judge passes a series that rose: its live bytes levelled off or turn over
//!   (a cache that filled and evicts, a pool made once), or when a series the judge fails by its
//!   trend alone (not by steps) slows as a fill approaching its bound does: the rise of its last
//!   half is at most [`DYING_HALF_RATIO`] of its first half's and its last quarter rises no faster
//!   than its third (new keys of a bounded set met ever more rarely). Such a fill is undecided:
//!   its bound is estimated from the rate's decay, and the length at which the judge's own rule
//!   for a rate dying away would see it levelled is what the verdict asks for;
//! - **undecided** when the judge cannot tell yet.

use plateau_detector::series::round_up_50;
use plateau_detector::stats::{median, theil_sen};
use plateau_detector::Overrides;
use plateau_reports::{Header, Kind as MetricKind, MetricSpec, Row, Samples, Status, ROLE_REQUESTS};

use super::read::SiteLog;

/// What a site is, as its series was judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SiteKind {
    Leak,
    Fill,
    Undecided,
}

impl SiteKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SiteKind::Leak => "leak",
            SiteKind::Fill => "fill",
            SiteKind::Undecided => "undecided",
        }
    }
}

/// One site's judgement over the run's judged window.
#[derive(Debug, Clone)]
pub struct SiteJudgement {
    pub id: usize,
    pub kind: SiteKind,
    /// The judge's status for the site as a gauge (a dying fill is inconclusive).
    pub status: Status,
    pub reason: String,
    pub slope_per_iter: f64,
    pub per_request: Option<f64>,
    /// Live bytes at the end of the run.
    pub size: f64,
    /// Where a fill levels off: its level for one that did, the estimate for one dying away.
    pub bound: Option<f64>,
    /// The run length that would decide an undecided site or fill.
    pub needs_iterations: Option<u64>,
}

/// A last half rising at this share of the first half's rise or less slows as a fill does. A
/// fill of keys drawn from a bounded set (a new key's chance falls as keys are met: `e^(-k/K)`)
/// keeps `e^(-h/tau)` of its rate from half to half: 0.47 for 4,000 keys met by 20 requests an
/// iteration over halves of 150 iterations. A leak keeps 1; growth like the square root of the
/// work (unbounded) keeps 0.84 and like its logarithm 0.71 over iterations 300-600, so neither
/// is taken for a fill.
pub const DYING_HALF_RATIO: f64 = 0.6;

/// Fewer judged points than this give no halves or quarters to compare.
const MIN_DYING_POINTS: usize = 20;

/// The detector's own rule for a rate dying away calls a fill levelled when its rate halves from
/// quarter to quarter: the length at which that holds is what an undecided fill asks for.
const HALVING: f64 = 0.5;

/// A fill dying away: its half ratio, estimated bound and the length that decides it.
#[derive(Debug, Clone, PartialEq)]
pub struct DyingFill {
    pub half_ratio: f64,
    pub bound: f64,
    pub needs_iterations: u64,
}

/// The rise of `y` over a stretch as the medians of its first and last fifth see it.
fn rise(y: &[f64]) -> f64 {
    let k = (y.len() / 5).max(1);
    median(&mut y[y.len() - k..].to_vec()) - median(&mut y[..k].to_vec())
}

/// Whether the judged points `(x, y)` of a site rise as a fill approaching its bound does (see
/// [`DYING_HALF_RATIO`]), with what that implies.
pub fn dying_fill(x: &[f64], y: &[f64]) -> Option<DyingFill> {
    let n = x.len();
    if n < MIN_DYING_POINTS {
        return None;
    }
    let h = n / 2;
    let (first, second) = (rise(&y[..h]), rise(&y[h..]));
    let q = h / 2;
    let (third, fourth) = (theil_sen(&x[h..h + q], &y[h..h + q]), theil_sen(&x[h + q..], &y[h + q..]));
    if first <= 0.0 || second <= 0.0 || second > DYING_HALF_RATIO * first || fourth > third {
        return None;
    }
    let ratio = second / first;
    let half_len = (x[n - 1] - x[0]) / 2.0;
    // The rate falls as e^(-x/tau): by `ratio` over a half.
    let tau = half_len / -ratio.ln();
    let bound = y[n - 1] + fourth.max(0.0) * tau;
    // The halving rule sees quarters of (L - start) / 4 each lose half their rate.
    let needed = x[0] + 4.0 * tau * -HALVING.ln();
    let needs_iterations = round_up_50(needed.max(x[n - 1] * 1.5));
    Some(DyingFill { half_ratio: ratio, bound, needs_iterations })
}

/// The name a site's series has inside the judge.
fn metric_name(id: usize) -> String {
    format!("site.{id:06}")
}

/// Judges sites `ids` of `log` over the run `run` (its quiescent points, warm-up, tolerance,
/// request counter and end), with `overrides` where the run's verdict was judged with them.
pub fn judge_sites(
    log: &SiteLog,
    ids: &[usize],
    run: &Samples,
    overrides: &Overrides,
) -> Result<Vec<SiteJudgement>, String> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let s = as_samples(log, ids, run);
    let v = plateau_detector::judge_with(&s, overrides)?;
    let warmup = v.warmup_iterations;
    let mut out = Vec::with_capacity(ids.len());
    for &id in ids {
        let Some(m) = v.metrics.iter().find(|m| m.name == metric_name(id)) else { continue };
        let judged: Vec<(u64, f64)> = log.series(id).into_iter().filter(|(it, _)| *it > warmup).collect();
        let x: Vec<f64> = judged.iter().map(|p| p.0 as f64).collect();
        let y: Vec<f64> = judged.iter().map(|p| p.1).collect();
        let size = log.series(id).last().map_or(0.0, |p| p.1);
        let slope = m.trend.as_ref().map_or(0.0, |t| t.slope_per_iter);
        let mut j = SiteJudgement {
            id,
            kind: SiteKind::Undecided,
            status: m.status,
            reason: m.reason.clone(),
            slope_per_iter: slope,
            per_request: v.requests_per_iter.filter(|r| *r > 0.0).map(|r| slope / r),
            size,
            bound: None,
            needs_iterations: m.needs_iterations,
        };
        let climbing = plateau_detector::steps::staircase(&x, &y, 1.0).is_some_and(|st| st.climbs());
        match (m.status, (!climbing).then(|| dying_fill(&x, &y)).flatten()) {
            (Status::Fail | Status::Inconclusive, Some(d)) => {
                j.kind = SiteKind::Fill;
                j.status = Status::Inconclusive;
                j.bound = Some(d.bound);
                j.needs_iterations = Some(d.needs_iterations);
                j.reason = format!(
                    "a fill dying away: its last half rose {:.0}% as much as its first (at most {:.0}% for a fill), toward about {} B; {} iterations would see it level",
                    100.0 * d.half_ratio,
                    100.0 * DYING_HALF_RATIO,
                    d.bound.round(),
                    d.needs_iterations
                );
            }
            (Status::Fail, None) => j.kind = SiteKind::Leak,
            (Status::Pass, _) => {
                j.kind = SiteKind::Fill;
                j.bound = y.iter().copied().reduce(f64::max);
            }
            (Status::Inconclusive, None) => {}
        }
        out.push(j);
    }
    Ok(out)
}

/// The sites `ids` as the gauges of a samples file the judge reads: the run's header (warm-up,
/// tolerance, planned length), its request counters, its quiescent points where the sites were
/// read, and its end.
fn as_samples(log: &SiteLog, ids: &[usize], run: &Samples) -> Samples {
    let counters: Vec<(usize, &String)> = run
        .names
        .iter()
        .enumerate()
        .filter(|(_, n)| {
            let spec = &run.header.metrics[*n];
            spec.kind == MetricKind::Counter && spec.role.as_deref() == Some(ROLE_REQUESTS)
        })
        .collect();
    let mut metrics = std::collections::BTreeMap::new();
    for (_, name) in &counters {
        metrics.insert((*name).clone(), run.header.metrics[*name].clone());
    }
    for &id in ids {
        metrics
            .insert(metric_name(id), MetricSpec { quantum: Some(1.0), ..MetricSpec::new(MetricKind::Gauge, "bytes") });
    }
    let header = Header { metrics, ..run.header.clone() };
    let names: Vec<String> = header.metrics.keys().cloned().collect();
    let series: Vec<std::collections::BTreeMap<u64, f64>> =
        ids.iter().map(|&id| log.series(id).into_iter().collect()).collect();
    let rows: Vec<Row> = run
        .rows
        .iter()
        .filter(|r| r.quiescent)
        .map(|r| {
            let values = names
                .iter()
                .map(|n| match counters.iter().find(|(_, c)| *c == n) {
                    Some((i, _)) => r.values[*i],
                    None => {
                        let k = ids.iter().position(|&id| metric_name(id) == *n).expect("a site's column");
                        series[k].get(&r.iter).copied()
                    }
                })
                .collect();
            Row::new(r.t, r.iter, true, values)
        })
        .collect();
    let mut s = Samples::in_memory(header, rows);
    s.end = run.end.clone();
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xs(from: u64, to: u64) -> Vec<f64> {
        (from..=to).map(|i| i as f64).collect()
    }

    #[test]
    fn a_fill_of_keys_dying_away_is_told_from_a_leak_and_from_unbounded_slowing() {
        // 4,000 keys drawn by 20 requests an iteration: what is met by iteration i.
        let x = xs(301, 600);
        let fill: Vec<f64> = x.iter().map(|i| 4096.0 * 4000.0 * (1.0 - (-20.0 * i / 4000.0).exp())).collect();
        let d = dying_fill(&x, &fill).expect("a fill dying away");
        assert!((0.4..0.55).contains(&d.half_ratio), "{d:?}");
        let full = 4096.0 * 4000.0;
        assert!((d.bound - full).abs() < 0.05 * full, "{d:?}");
        assert!((800..=1000).contains(&d.needs_iterations), "{d:?}");
        let leak: Vec<f64> = x.iter().map(|i| 512.0 * 20.0 * i).collect();
        assert_eq!(dying_fill(&x, &leak), None);
        let sqrt: Vec<f64> = x.iter().map(|i| 1e5 * i.sqrt()).collect();
        assert_eq!(dying_fill(&x, &sqrt), None, "the square root of the work has no bound");
        let log: Vec<f64> = x.iter().map(|i| 1e5 * i.ln()).collect();
        assert_eq!(dying_fill(&x, &log), None, "nor has its logarithm");
        // A fill whose last quarter sped up again is not dying away.
        let mut late = fill.clone();
        for (k, v) in late.iter_mut().enumerate().skip(280) {
            *v += 3e6 * (k - 280) as f64;
        }
        assert_eq!(dying_fill(&x, &late), None);
    }
}
