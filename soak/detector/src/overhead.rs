//! Gauges judged against the live heap they serve. The allocator's bookkeeping
//! (`jemalloc.metadata`), the pages it keeps for the heap (`active`, `resident`, `mapped`), the
//! kernel's page tables (`proc.pte`) and the process's anonymous pages (`proc.rss_anon`, `proc.rss`)
//! are overheads on the heap: they move with what the program holds, and also with how it holds it.
//!
//! A workload that churns a bounded cache keeps the live heap (`jemalloc.allocated`) level while it
//! frees and allocates entries of other sizes in other places. The allocator's extents spread over
//! more of the address space, so its bookkeeping and the page tables grow, fast at first and then
//! slower as freed space is reused. Measured on `soak/detector/evidence/cache-churn.toml` (the encoder cache full
//! at 16 MiB and evicting its oldest entries; see soak/README.md for the figures): bookkeeping rose
//! by 41, 19, 9, then 1-4 KiB per hundred iterations, and over 1,000 iterations by about 0.1% of the
//! live heap. That is fragmentation that levels off relative to the heap, not memory taken.
//!
//! Which gauge is an overhead on which heap is a relation the samples header declares
//! (`overhead_of`, with `overhead_with` for the other levels it holds; the reader fills in the v1
//! families' own where a writer declared none). So an overhead gauge that the trend layer did not
//! pass, on enough points for a trend of its own, is decided here by that evidence: it passes, with
//! its rates, when all of these hold (and otherwise keeps its verdict):
//! 1. the live heap it is an overhead on was judged a pass: overhead on a growing heap, or on one
//!    that could not be judged, is judged with the heap, never excused;
//! 2. the other levels it holds (for the process's anonymous pages, its memory outside the heap;
//!    for RSS the file and shared pages too) were judged a pass as well: otherwise the growth may be
//!    a mapping of its own;
//! 3. its growth is slowing: from the iteration where the heap settled into its final level (a
//!    cache that fills first is past its fill), the rate over the last half of the points is
//!    under [`SLOWING_RATIO`] of the rate over the first half, each rate seen from the medians of
//!    the half's first and last quarters (a rise of under [`MIN_RATIO_QUANTA`] quanta is too
//!    coarse for a ratio, and only rule 4 decides);
//! 4. at its last-half rate it would add at most [`HEAP_BUDGET`] of the live heap over
//!    [`HORIZON_RUNS`] times this run's judged length.
//!
//! A bookkeeping leak (a steady rate, whatever the heap does) fails 3; a fast one fails 4 as well.
//! A steady rise failing 3 that is as small as the allocator's bookkeeping filling in after a fill
//! ([`FILL_SHARE`] of the live heap) is undecided instead, with the length that would show it slow.
//!
//! The address space is judged apart from memory. jemalloc keeps the address space it has mapped
//! (`retained`, never returned) and grows it geometrically when it needs a fresh extent, so under
//! churn the process's anonymous address space (`proc.anon_bytes`) climbs in steps at widening
//! spacing, like a table that doubles, while no page more is resident. For a gauge whose header
//! declares what reserves address space inside it (`reserved_by`: jemalloc's `mapped` and
//! `retained`), when the rest of it (`proc.anon_bytes` less those) stays level, judged by the
//! trend layer with no tolerance, the growth is the allocator's own reservation: a pass naming it,
//! the memory behind it judged by the gauges above. A mapping the program makes itself grows that
//! outside part and keeps the failure.
//!
//! No metric is excused by name: only the relations its header declares are weighed.

use plateau_reports::{MetricVerdict, Samples, Status};

use super::series::{fmt_value, round_up_50, Series};
use super::stats::median;
use super::trend::judge;
use super::DetectorConfig;

/// Since the heap settled, a second half that rises at under this fraction of the first half's
/// rate is slowing. Fragmentation after a fill converges like a logarithm: in the measured runs
/// the bookkeeping added 41, 19, 9, then 1-4 KiB per hundred iterations. In the 12 of 20 seeds of
/// the cache-churn evidence scenario at 200 iterations where the trend layer alone did not pass an
/// overhead, its second half ran at 0.26 to 0.75 of the first (median 0.42; the highest, seed 14,
/// added 10 KiB of bookkeeping over its last 100 iterations in small steps).
/// A steady rate (a bookkeeping leak) keeps a ratio of 1 where the gauge is exact, as jemalloc's
/// bookkeeping is; 0.9 leaves the clean runs' worst a margin of 0.15. A page-quantized steady
/// rate can dip under it by chance, and a leak riding on converging fragmentation lowers the
/// ratio while the fragmentation dominates: both pass as warnings with their rates only while
/// within the budget (rule 4), until a longer run shows the steady rate.
pub const SLOWING_RATIO: f64 = 0.9;

/// Fewer points than this on either side of the split after the heap settled: too little to see
/// a rate fall, so the trend layer's verdict stands.
pub(crate) const MIN_HALF_POINTS: usize = 10;

/// A rise since the heap settled of fewer quanta than this is too coarse for a ratio of halves:
/// page tables grow a page (4 KiB) at a time, and the page-table growth of a churning cache at
/// 200 iterations is 2-4 pages after its fill (measured: seeds 100-115 of the cache-churn
/// evidence scenario), which made halves of 1 and 2 pages read as "not slowing" in 6 of 16 runs.
/// A steady rate of a page every ten iterations rises by ten pages in a default run and is
/// judged by its ratio (and by the budget).
pub(crate) const MIN_RATIO_QUANTA: f64 = 8.0;

/// The overhead may add at most this fraction of the live heap over the horizon. Page tables cost
/// 1/512 of the memory they map and jemalloc's bookkeeping about 1-2% of what it manages at steady
/// state; 2% over ten runs' length is a ceiling fragmentation stays under (the measured cache-churn
/// runs project 0.4-1.0%, from their last halves, which overstate a slowing rate), while an
/// overhead growing by 2% of the heap every ten runs would be worth a look even if it slowed.
pub const HEAP_BUDGET: f64 = 0.02;

/// A steady rise, at most this share of the live heap per [`FILL_ITERATIONS`] and at most this
/// share in all since the heap levelled off, is as small as the allocator's bookkeeping filling
/// in after a fill, which can keep a steady rate for longer than a default run. Measured: a 64 MiB
/// bounded cache churning in `prefill-only` (seed 2, 1,500 iterations) had its heap level from
/// iteration 10 while `jemalloc.metadata` rose a steady 30-40 B an iteration (0.05% of the heap
/// per 1,000) until iteration 250 and not at all after; the cache-churn evidence added about 0.1%
/// of its heap over 1,000 iterations in all. Such a rise is undecided, never passed or failed,
/// until the run is long enough to see it slow (a pass by rule 3) or to outgrow this share (a
/// failure). The corpus's bookkeeping leak, 256 B an iteration on 80 MiB, is three times the rate.
pub(crate) const FILL_SHARE: f64 = 0.001;

/// The iterations over which [`FILL_SHARE`] of the live heap is the most a fill adds.
pub(crate) const FILL_ITERATIONS: f64 = 1000.0;

/// Whether a steady rise (`rate` per iteration, `rise` since the heap levelled) on a live heap of
/// `live` is as small as a fill of the allocator's bookkeeping (see [`FILL_SHARE`]).
fn could_still_be_filling(rate: f64, rise: f64, live: f64) -> bool {
    live > 0.0 && rate * FILL_ITERATIONS <= FILL_SHARE * live && rise <= FILL_SHARE * live
}

/// How far ahead the last-half rate is projected, in judged lengths of this run.
pub const HORIZON_RUNS: f64 = 10.0;

/// The live heap and the other levels of `name`, if its header declares it an overhead.
fn overhead_of(s: &Samples, name: &str) -> Option<(String, Vec<String>)> {
    let spec = s.header.metrics.get(name)?;
    spec.overhead_of.clone().map(|heap| (heap, spec.overhead_with.clone()))
}

/// Quiescent points of `name` after `warmup`.
fn judged_points(s: &Samples, name: &str, warmup: u64) -> Vec<(f64, f64)> {
    let Some(i) = s.names.iter().position(|n| n == name) else { return Vec::new() };
    s.quiescent_series(i).into_iter().filter(|(it, _)| *it > warmup).map(|(it, v)| (it as f64, v)).collect()
}

/// The first iteration from which the heap stays inside the range its last half spans: where a
/// filling cache reached its bound, or the first judged point of a heap level from the start.
fn settled_at(heap: &[(f64, f64)]) -> Option<f64> {
    let tail = &heap[heap.len() / 2..];
    let lo = tail.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let hi = tail.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
    let outside = heap.iter().rposition(|p| p.1 < lo || p.1 > hi);
    heap.get(outside.map_or(0, |k| k + 1)).map(|p| p.0)
}

/// The rate of a stretch as its ends see it: the median of its last quarter minus that of its
/// first, over the iterations between their middles. Unlike a fitted slope it counts a step
/// anywhere in the stretch (an overhead that grows a page or an extent at a time), and the medians
/// keep one odd sample from deciding.
fn rise_rate(x: &[f64], y: &[f64]) -> f64 {
    let k = (x.len() / 4).max(1);
    let n = x.len();
    let span = (x[n - k..].iter().sum::<f64>() - x[..k].iter().sum::<f64>()) / k as f64;
    let rise = median(&mut y[n - k..].to_vec()) - median(&mut y[..k].to_vec());
    if span > 0.0 {
        rise / span
    } else {
        0.0
    }
}

/// Whether `name` was judged a pass.
fn levelled(metrics: &[(String, Status)], name: &str) -> Option<Status> {
    metrics.iter().find(|m| m.0 == name).map(|m| m.1).filter(|st| *st == Status::Pass)
}

/// Decides an overhead gauge that did not pass alone: a pass when it is fragmentation or
/// bookkeeping of a heap that levelled off (the module's rules 1-4).
pub fn apply(s: &Samples, metrics: &mut [MetricVerdict], cfg: &DetectorConfig) {
    let warmup = cfg.warmup_iterations;
    address_space(s, metrics, cfg);
    let status: Vec<(String, Status)> = metrics.iter().map(|m| (m.name.clone(), m.status)).collect();
    for m in metrics.iter_mut().filter(|m| m.kind == "gauge" && matches!(m.status, Status::Fail | Status::Inconclusive))
    {
        let Some((heap, companions)) = overhead_of(s, &m.name) else { continue };
        let Some(heap_status) = levelled(&status, &heap) else { continue };
        if companions.iter().any(|c| levelled(&status, c).is_none()) {
            continue;
        }
        let Some(trend) = m.trend.as_ref() else { continue };
        let heap_pts = judged_points(s, &heap, warmup);
        let Some(settled) = settled_at(&heap_pts) else { continue };
        let pts: Vec<(f64, f64)> = judged_points(s, &m.name, warmup).into_iter().filter(|p| p.0 >= settled).collect();
        let half = pts.len() / 2;
        if half < MIN_HALF_POINTS {
            continue;
        }
        let (x, y): (Vec<f64>, Vec<f64>) = pts.iter().copied().unzip();
        let first_rate = rise_rate(&x[..half], &y[..half]);
        let last_rate = rise_rate(&x[half..], &y[half..]);
        let ratio = if last_rate <= 0.0 {
            0.0
        } else if first_rate > 0.0 {
            last_rate / first_rate
        } else {
            f64::INFINITY
        };
        // A rise of a few quanta since the heap settled (page tables a page at a time) gives two
        // halves of one or two pages each: their ratio says nothing, and the budget alone decides.
        let rise_quanta = (y[y.len() - 1] - y[0]) / trend.quantum.max(1.0);
        let slowing = ratio < SLOWING_RATIO || rise_quanta < MIN_RATIO_QUANTA;
        let mut heap_level: Vec<f64> = heap_pts.iter().filter(|p| p.0 >= settled).map(|p| p.1).collect();
        let live = median(&mut heap_level);
        let span = trend.points.max(1) as f64;
        let projected = last_rate.max(0.0) * span * HORIZON_RUNS;
        let within_budget = live > 0.0 && projected <= HEAP_BUDGET * live;
        let unit = m.unit.clone();
        let v = |a: f64| fmt_value(a, &unit);
        let share = if live > 0.0 { 100.0 * projected / live } else { f64::INFINITY };
        let rise = y[y.len() - 1] - y[0];
        let location = format!(
            "allocator overhead: fragmentation or bookkeeping of a heap that levelled off ({heap} at {})",
            v(live)
        );
        if !slowing && within_budget && could_still_be_filling(last_rate, rise, live) {
            let last = x[x.len() - 1];
            let needs = round_up_50(last + (last - settled));
            m.status = Status::Inconclusive;
            m.first_iter = None;
            m.projected = None;
            m.needs_iterations = Some(needs);
            m.location = Some(location);
            m.reason.push_str(&format!(
                "; the heap levelled off from iteration {settled}, and since then this overhead rose by {} at a steady {}/iteration, then {}/iteration: under {}% of the live heap per {FILL_ITERATIONS} iterations, the size of the allocator's own bookkeeping filling in after a fill, which this run is too short to tell from a leak: undecided; {needs} iterations show whether it slows",
                v(rise),
                v(first_rate),
                v(last_rate),
                100.0 * FILL_SHARE
            ));
            continue;
        }
        if !(slowing && within_budget) {
            // Growth that has not levelled off relative to the heap keeps its failure, and says
            // what it is rather than blaming mappings of the program's own.
            let why = if slowing {
                format!(
                    "it would add {} over {HORIZON_RUNS} times this run, {share:.2}% of the live heap (at most {}%)",
                    v(projected),
                    100.0 * HEAP_BUDGET
                )
            } else {
                format!("not slowing: {}/iteration, then {}/iteration", v(first_rate), v(last_rate))
            };
            m.location = Some(location);
            m.reason.push_str(&format!(
                "; the heap levelled off from iteration {settled}, so this is the allocator's bookkeeping or fragmentation, and since then {why}"
            ));
            continue;
        }
        pass(
            m,
            format!(
            "fragmentation or bookkeeping of a heap that levelled off ({heap} {} at {} from iteration {settled}): rose by {} ({}/iteration); since the heap levelled, slowing from {}/iteration to {}/iteration (a ratio of {ratio:.2}, under {SLOWING_RATIO}); at that rate {} more over {} times this run, {:.2}% of the live heap (at most {}%): levelling off against the heap",
            heap_status.as_str(),
            v(live),
            v(trend.growth_after_warmup),
            v(trend.slope_per_iter),
            v(first_rate),
            v(last_rate.max(0.0)),
            v(projected),
            HORIZON_RUNS,
            share,
            100.0 * HEAP_BUDGET
        ),
        );
    }
}

/// Decides a growing address space as a pass when all of its growth is what the header says
/// reserves address space inside it (see the module's last rule).
fn address_space(s: &Samples, metrics: &mut [MetricVerdict], cfg: &DetectorConfig) {
    for m in metrics
        .iter_mut()
        .filter(|m| m.kind == "gauge" && matches!(m.status, Status::Fail | Status::Inconclusive) && m.trend.is_some())
    {
        let parts = s.header.metrics.get(&m.name).map(|spec| spec.reserved_by.clone()).unwrap_or_default();
        if parts.is_empty() {
            continue;
        }
        let columns: Vec<Option<usize>> = std::iter::once(m.name.clone())
            .chain(parts.iter().cloned())
            .map(|n| s.names.iter().position(|x| *x == n))
            .collect();
        let Some(columns) = columns.into_iter().collect::<Option<Vec<usize>>>() else { continue };
        let (x, outside): (Vec<f64>, Vec<f64>) = s
            .rows
            .iter()
            .filter(|r| r.quiescent && r.iter > cfg.warmup_iterations)
            .filter_map(|r| {
                let v: Option<Vec<f64>> = columns.iter().map(|c| r.values[*c]).collect();
                v.map(|v| (r.iter as f64, v[0] - v[1..].iter().sum::<f64>()))
            })
            .unzip();
        if x.len() < cfg.min_points {
            continue;
        }
        let quantum = m.trend.as_ref().map_or(1.0, |t| t.quantum);
        let series = Series { x: &x, y: &outside, unit: &m.unit, quantum, tolerance_per_iter: 0.0 };
        let j = judge(&series, cfg);
        if j.status != Status::Pass {
            continue;
        }
        let own = judged_points(s, &m.name, cfg.warmup_iterations);
        let rose = own.last().map_or(0.0, |l| l.1) - own.first().map_or(0.0, |f| f.1);
        let v = |a: f64| fmt_value(a, &m.unit);
        let level = v(outside[outside.len() - 1]);
        let was = m.reason.split("; that is").next().unwrap_or_default().to_string();
        let reason = format!(
            "address space reserved inside it: rose by {} ({was}), all of it {}, while the rest stayed level at {level}: addresses kept for reuse, not memory (the pages behind them are judged as resident memory)",
            v(rose),
            parts.join(" and ")
        );
        pass(m, reason);
    }
}

/// A gauge the trend layer did not pass alone, decided a pass by its relation: the reason says
/// what it is.
fn pass(m: &mut MetricVerdict, reason: String) {
    m.status = Status::Pass;
    m.first_iter = None;
    m.projected = None;
    m.needs_iterations = None;
    m.reason = reason;
}
