use std::collections::BTreeMap;

use plateau_reports::{Header, Kind, MetricSpec, Row, Samples, Status, SAMPLES_SCHEMA};

use super::test_noise::noise;
use super::verdict::analyze;
use super::DetectorConfig;

// The exact layer's cases: one leaked entry, one count that went down, one failed check.
mod exact;

/// Samples of the gauges in `metrics`, a quiescent row per iteration 1..=n, one per 0.05 s, with
/// `value(name, iteration)` for each.
pub(super) fn samples_of(metrics: BTreeMap<String, MetricSpec>, n: u64, value: impl Fn(&str, u64) -> f64) -> Samples {
    let names: Vec<String> = metrics.keys().cloned().collect();
    let rows = (1..=n)
        .map(|i| Row::new(i as f64 * 0.05, i, true, names.iter().map(|m| Some(value(m, i))).collect()))
        .collect();
    let header = Header {
        schema: SAMPLES_SCHEMA.into(),
        scenario: "t".into(),
        backend: "cpu".into(),
        metrics,
        ..Header::default()
    };
    Samples::in_memory(header, rows)
}

/// `s` with an `engine.requests_added` counter beside its one gauge: `per_iter` requests an
/// iteration.
fn with_requests(mut s: Samples, per_iter: f64) -> Samples {
    s.header.metrics.insert(
        "engine.requests_added".into(),
        MetricSpec { role: Some("requests".into()), ..MetricSpec::new(Kind::Counter, "count") },
    );
    s.names = s.header.metrics.keys().cloned().collect();
    for r in &mut s.rows {
        // Names sort: engine.requests_added before the gauge.
        r.values = vec![Some(per_iter * r.iter as f64), r.values[0]];
    }
    s
}

/// Samples of one gauge `g` (bytes) over `n` quiescent iterations.
fn gauge(n: u64, f: impl Fn(u64) -> f64) -> Samples {
    let mut metrics = BTreeMap::new();
    metrics.insert("g".to_string(), MetricSpec::new(Kind::Gauge, "bytes"));
    samples_of(metrics, n, |_, i| f(i))
}

/// Deterministic jitter in [-amp, amp].
fn jitter(i: u64, amp: f64) -> f64 {
    (((i * 2_654_435_761) % 1000) as f64 / 999.0 * 2.0 - 1.0) * amp
}

fn status(s: &Samples) -> Status {
    analyze(s, &DetectorConfig::default(), None, None).metrics[0].status
}

const BASE: f64 = 50.0 * 1024.0 * 1024.0;

#[test]
fn flat_noisy_heap_passes() {
    assert_eq!(status(&gauge(300, |i| BASE + jitter(i, 8192.0))), Status::Pass);
}

#[test]
fn one_kib_per_iteration_fails_within_500() {
    let v =
        analyze(&gauge(500, |i| BASE + 1024.0 * i as f64 + jitter(i, 4096.0)), &DetectorConfig::default(), None, None);
    let m = &v.metrics[0];
    assert_eq!(m.status, Status::Fail, "{}", m.reason);
    assert!(m.first_iter.unwrap() < 500);
    assert!(v.failed());
}

#[test]
fn a_cache_that_fills_and_stops_passes() {
    let s = gauge(300, |i| BASE + (i.min(120) as f64) * 20_000.0 + jitter(i, 2048.0));
    assert_ne!(status(&s), Status::Fail);
}

#[test]
fn a_sawtooth_passes() {
    let s = gauge(300, |i| BASE + (i % 25) as f64 * 40_000.0);
    assert_ne!(status(&s), Status::Fail);
}

#[test]
fn a_one_off_step_passes() {
    let s = gauge(300, |i| BASE + if i > 100 { 8.0 * 1024.0 * 1024.0 } else { 0.0 } + jitter(i, 4096.0));
    assert_ne!(status(&s), Status::Fail);
}

/// Default run length: 200 iterations, warm-up 20 (the thresholds are tested at it).
const N: u64 = 200;

fn with_spec(mut s: Samples, unit: &str, quantum: f64) -> Samples {
    s.header.metrics.insert("g".into(), MetricSpec { quantum: Some(quantum), ..MetricSpec::new(Kind::Gauge, unit) });
    s
}

#[test]
fn one_page_more_is_not_a_trend_three_spread_pages_are() {
    // MIN_QUANTA: RSS moves in pages; two pages over the run are what settling does once...
    let two = with_spec(gauge(N, |i| BASE + 4096.0 * ((i >= 90) as u64 + (i >= 150) as u64) as f64), "bytes", 4096.0);
    assert_eq!(status(&two), Status::Pass);
    // ...a page every 20 iterations, never returned, is growth.
    let many = with_spec(gauge(N, |i| BASE + 4096.0 * (i / 20) as f64), "bytes", 4096.0);
    assert_eq!(status(&many), Status::Fail);
}

#[test]
fn counts_fail_on_a_few_descriptors_that_never_return() {
    // MIN_TAIL_QUANTA: one descriptor leaked every 25 iterations: 7 after warm-up, 3-4 in the
    // last half, with no floor of 16.
    let fds = with_spec(gauge(N, |i| 11.0 + (i / 25) as f64), "count", 1.0);
    let v = analyze(&fds, &DetectorConfig::default(), None, None);
    assert_eq!(v.metrics[0].status, Status::Fail, "{}", v.metrics[0].reason);
    // One thread started once and kept: a step, not a leak.
    let once = with_spec(gauge(N, |i| 2.0 + (i >= 100) as u64 as f64), "count", 1.0);
    assert_ne!(status(&once), Status::Fail);
}

#[test]
fn a_drift_within_the_noise_is_not_a_trend_and_twice_beyond_is() {
    // NOISE_SCALES: a series that wanders by +-400 B drifting by 200 B over the run passes...
    let drift = gauge(N, |i| BASE + jitter(i, 700.0) + i as f64);
    assert_eq!(status(&drift), Status::Pass);
    // ...and 64 B/iteration over the same noise fails.
    let leak = gauge(N, |i| BASE + jitter(i, 700.0) + 64.0 * i as f64);
    assert_eq!(status(&leak), Status::Fail);
}

#[test]
fn a_rise_that_slows_to_a_persistent_rate_fails_and_a_fill_that_dies_away_passes() {
    // DECAY_FRACTION: 4 KiB/iteration until iteration 110, then 200 B/iteration for good (10 B
    // per request at 20 requests an iteration): the last half still rises, so it fails, however
    // much faster the first half rose.
    let s = gauge(N, |i| BASE + 4096.0 * i.min(110) as f64 + 200.0 * i.saturating_sub(110) as f64);
    let v = analyze(&s, &DetectorConfig::default(), None, None);
    assert_eq!(v.metrics[0].status, Status::Fail, "{}", v.metrics[0].reason);
    // A cache filling towards 4 MiB with a time constant of 24 iterations still rises in the last
    // half, but its rate dies away quarter by quarter: levelling off, not failed.
    let fill = gauge(N, |i| BASE + 4.0 * 1024.0 * 1024.0 * (1.0 - (-(i as f64) / 24.0).exp()) + jitter(i, 300.0));
    let v = analyze(&fill, &DetectorConfig::default(), None, None);
    assert_ne!(v.metrics[0].status, Status::Fail, "{}", v.metrics[0].reason);
}

#[test]
fn growth_in_steps_never_passes() {
    // 1 MiB kept every 50 iterations: three steps after warm-up, equal spacing, no release.
    let chunks = gauge(N, |i| BASE + 1024.0 * 1024.0 * (i / 50) as f64);
    let v = analyze(&chunks, &DetectorConfig::default(), None, None);
    assert_eq!(v.metrics[0].status, Status::Fail, "{}", v.metrics[0].reason);
    assert!(v.metrics[0].reason.contains("steps"), "{}", v.metrics[0].reason);
    // A set of ids never drained (a table doubling at 7/8 full, 9 bytes a bucket): steps at
    // doubling intervals. Never a pass, at 200 iterations or at 500.
    let table = |entries: u64| {
        let mut b = 64u64;
        while entries > b * 7 / 8 {
            b *= 2;
        }
        9.0 * b as f64
    };
    for n in [N, 500] {
        let v = analyze(&gauge(n, |i| BASE + table(20 * i)), &DetectorConfig::default(), None, None);
        assert_ne!(v.metrics[0].status, Status::Pass, "n={n}: {}", v.metrics[0].reason);
    }
    // Two early steps (a scratch buffer grown to the peak batch twice), then level for good.
    let peak = gauge(N, |i| BASE + 262_144.0 * ((i >= 23) as u64 + (i >= 31) as u64) as f64);
    assert_eq!(status(&peak), Status::Pass);
}

#[test]
fn two_steps_not_yet_significant_are_inconclusive_with_the_length_needed() {
    // Steps at 60 and 150 in 200 iterations (a set doubling): not significant over the run, and
    // the next is not due until 240: undecided, and the reason says how long to run.
    let s = gauge(N, |i| BASE + 65536.0 * ((i >= 60) as u64 + 2 * (i >= 150) as u64) as f64 + noise(i, 3000.0));
    let v = analyze(&s, &DetectorConfig::default(), None, None);
    let m = &v.metrics[0];
    assert_ne!(m.status, Status::Pass, "{}", m.reason);
    if m.status == Status::Inconclusive {
        assert!(m.reason.contains("run ") && m.reason.contains("iterations"), "{}", m.reason);
        assert_eq!(m.needs_iterations, Some(450), "{}", m.reason);
    }
}

#[test]
fn a_late_step_passes_and_a_step_that_keeps_climbing_fails() {
    // STEP_NOISE_SCALES, LEVEL_FRACTION: a one-off step at 80% of the run...
    let step = gauge(N, |i| BASE + jitter(i, 500.0) + if i >= 160 { 8.0 * 1024.0 * 1024.0 } else { 0.0 });
    let v = analyze(&step, &DetectorConfig::default(), None, None);
    assert_ne!(v.metrics[0].status, Status::Fail, "{}", v.metrics[0].reason);
    // ...and a step at half-way followed by steady growth.
    let climb = gauge(N, |i| {
        BASE + jitter(i, 500.0) + if i >= 100 { 8.0 * 1024.0 * 1024.0 + 4096.0 * (i - 100) as f64 } else { 0.0 }
    });
    let v = analyze(&climb, &DetectorConfig::default(), None, None);
    assert_eq!(v.metrics[0].status, Status::Fail, "{}", v.metrics[0].reason);
    // A staircase of large chunks is not one step.
    let stairs = gauge(N, |i| BASE + jitter(i, 500.0) + 65536.0 * (i / 15) as f64);
    assert_eq!(status(&stairs), Status::Fail);
}

#[test]
fn too_few_points_are_inconclusive() {
    // min_points: 19 judged points are not enough, 20 are.
    let cfg = DetectorConfig { warmup_iterations: 20, ..DetectorConfig::default() };
    let v = analyze(&gauge(39, |i| BASE + 4096.0 * i as f64), &cfg, None, None);
    assert_eq!((v.verdict, v.metrics[0].status), (Status::Inconclusive, Status::Inconclusive));
    let v = analyze(&gauge(40, |i| BASE + 4096.0 * i as f64), &cfg, None, None);
    assert_eq!(v.verdict, Status::Fail);
}

#[test]
fn the_verdict_does_not_depend_on_the_machine_speed() {
    let leak = |dt: f64| {
        let mut s = gauge(N, |i| BASE + jitter(i, 300.0) + 48.0 * i as f64);
        for r in &mut s.rows {
            r.t = r.iter as f64 * dt;
        }
        let v = analyze(&s, &DetectorConfig::default(), None, None);
        (v.verdict, v.metrics[0].first_iter)
    };
    assert_eq!(leak(0.03), leak(10.0));
    assert_eq!(leak(0.03).0, Status::Fail);
}

#[test]
fn the_tolerance_is_per_iteration_or_per_request() {
    let s = with_requests(gauge(N, |i| BASE + 48.0 * i as f64), 20.0);
    let judge = |t: &str| {
        let cfg = DetectorConfig { tolerance: t.parse().unwrap(), ..DetectorConfig::default() };
        let v = analyze(&s, &cfg, None, None);
        assert_eq!(v.requests_per_iter, Some(20.0));
        v.metrics.iter().find(|m| m.name == "g").unwrap().status
    };
    // 48 B/iteration at 20 requests per iteration is 2.4 B/request.
    assert_eq!(judge("1B/request"), Status::Fail);
    assert_eq!(judge("3B/request"), Status::Pass);
    assert_eq!(judge("64B/iteration"), Status::Pass);
    assert_eq!(judge("0"), Status::Fail);
}

#[test]
fn every_judged_gauge_states_its_resolution_and_a_failure_its_cost() {
    let v = analyze(&gauge(N, |i| BASE + jitter(i, 300.0) + 256.0 * i as f64), &DetectorConfig::default(), None, None);
    let m = &v.metrics[0];
    let t = m.trend.as_ref().unwrap();
    assert!(t.resolution_per_iter.is_some_and(|r| r > 0.0 && r < 256.0), "{t:?}");
    let p = m.projected.as_ref().unwrap();
    assert!((p.per_day.unwrap() - 256.0 * 86_400.0 / 0.05).abs() < 256.0 * 86_400.0 / 0.05 * 0.01, "{p:?}");
}

#[test]
fn the_resolution_of_the_noise_and_what_the_tolerance_accepts_are_reported_apart() {
    // A quiet heap (noise 8 B) at 20 requests per iteration: a tolerance of 3 B/request accepts
    // 60 B/iteration, far above what the noise alone resolves.
    let s = with_requests(gauge(N, |i| BASE + jitter(i, 8.0)), 20.0);
    let cfg = DetectorConfig { tolerance: "3B/request".parse().unwrap(), ..DetectorConfig::default() };
    let v = analyze(&s, &cfg, None, None);
    let m = v.metrics.iter().find(|m| m.name == "g").unwrap();
    let t = m.trend.as_ref().unwrap();
    let noise = t.noise_resolution_per_iter.unwrap();
    assert_eq!((m.status, t.tolerance_per_iter), (Status::Pass, 60.0));
    assert!(noise < 30.0 && t.resolution_per_iter.is_some_and(|r| r >= 60.0), "{t:?}");
    assert!(m.reason.contains("noise alone") && m.reason.contains("tolerance accepts 60 B"), "{}", m.reason);
    // With no tolerance the two figures are one.
    let v = analyze(&s, &DetectorConfig { tolerance: "0".parse().unwrap(), ..DetectorConfig::default() }, None, None);
    let t = v.metrics.iter().find(|m| m.name == "g").unwrap().trend.clone().unwrap();
    assert_eq!(t.noise_resolution_per_iter, t.resolution_per_iter);
}

#[test]
fn the_judge_takes_its_settings_and_the_run_s_end_from_the_samples() {
    let mut s = gauge(120, |i| BASE + jitter(i, 64.0));
    s.header.warmup_iterations = Some(30);
    s.header.tolerance = Some("2KiB/iteration".into());
    let v = crate::judge(&s).unwrap();
    assert_eq!((v.warmup_iterations, v.tolerance.as_str(), v.verdict), (30, "2KiB/iteration", Status::Pass));
    // Planned for 200, sampled to 120, no end recorded: cut short, never a pass.
    s.header.planned_iterations = Some(200);
    let v = crate::judge(&s).unwrap();
    assert!(v.incomplete && v.verdict == Status::Inconclusive, "{}", v.summary);
    assert!(v.summary.contains("stop at iteration 120 of the 200 it planned"), "{}", v.summary);
    // The end recorded: stopped by the user, then completed.
    s.end = Some(plateau_reports::RunEnd::new(plateau_reports::EndState::Interrupted, 120));
    assert_eq!(crate::judge(&s).unwrap().verdict, Status::Inconclusive);
    // An end record that contradicts the plan: "completed" (or "decided", "stopped", which end
    // early only on a failure) at 120 of 200 with nothing failed is never a complete pass.
    for (state, why) in [
        (plateau_reports::EndState::Completed, "completed at iteration 120 of the 200 it planned"),
        (plateau_reports::EndState::Decided, "once its failure was decided at iteration 120 of the 200"),
        (plateau_reports::EndState::Stopped, "exact-layer failure at iteration 120 of the 200"),
    ] {
        s.end = Some(plateau_reports::RunEnd::new(state, 120));
        let v = crate::judge(&s).unwrap();
        assert!(v.incomplete && v.verdict == Status::Inconclusive, "{state:?}: {}", v.summary);
        assert!(v.summary.contains(why), "{}", v.summary);
    }
    s.header.planned_iterations = Some(120);
    s.end = Some(plateau_reports::RunEnd::new(plateau_reports::EndState::Completed, 120));
    assert_eq!(crate::judge(&s).unwrap().verdict, Status::Pass);
    // Other settings are named in the verdict.
    let o = crate::Overrides { warmup: Some(40), tolerance: None };
    assert_eq!(crate::judge_with(&s, &o).unwrap().overrides, vec!["--warmup 40"]);
    // A recorded tolerance that cannot be read is the file's error.
    s.header.tolerance = Some("1MiB/hour".into());
    assert!(crate::judge(&s).unwrap_err().starts_with("header: tolerance:"));
}

#[test]
fn two_late_steps_are_weighed_by_the_rate_they_imply_not_the_run_s_average() {
    // 25 requests an iteration at 1 B/request: the tolerance accepts 25 B/iteration. Steps of
    // 2 KiB at 120 and 170 average 23 B/iteration over the run and imply 41.
    let mut metrics = BTreeMap::new();
    metrics.insert("g".to_string(), MetricSpec::new(Kind::Gauge, "bytes"));
    metrics.insert(
        "requests".to_string(),
        MetricSpec { role: Some(plateau_reports::ROLE_REQUESTS.into()), ..MetricSpec::new(Kind::Counter, "count") },
    );
    let s = samples_of(metrics, N, |name, i| match name {
        "requests" => 25.0 * i as f64,
        _ => BASE + if i >= 120 { 2048.0 } else { 0.0 } + if i >= 170 { 2048.0 } else { 0.0 },
    });
    let v = analyze(&s, &DetectorConfig::default(), None, None);
    let m = v.metrics.iter().find(|m| m.name == "g").unwrap();
    assert_ne!(m.status, Status::Pass, "{}", m.reason);
    assert_ne!(v.verdict, Status::Pass);
}

#[test]
fn a_rise_whose_last_half_still_climbs_but_not_significantly_is_undecided_and_a_level_one_passes() {
    // Growth early, then a last half level within its noise: levelled off, a pass.
    let level = gauge(N, |i| BASE + 4096.0 * (i.min(110) as f64) + noise(i, 2000.0));
    let m = &analyze(&level, &DetectorConfig::default(), None, None).metrics[0];
    assert_eq!(m.status, Status::Pass, "{}", m.reason);
    assert!(m.reason.contains("levelled off"), "{}", m.reason);
    // Growth early, then a last half that still climbs 20 B/iteration under a slow wander of
    // 1.5 KiB every 60 iterations: past its noise, not significant. Undecided, with a longer run
    // to ask for.
    let wander = gauge(N, |i| {
        let i = i as f64;
        BASE + 4096.0 * i.min(100.0) + 20.0 * (i - 100.0).max(0.0) + 1500.0 * (i * std::f64::consts::TAU / 60.0).sin()
    });
    let m = &analyze(&wander, &DetectorConfig::default(), None, None).metrics[0];
    assert_eq!(m.status, Status::Inconclusive, "{}", m.reason);
    assert!(m.reason.contains("undecided") && m.needs_iterations == Some(300), "{} {:?}", m.reason, m.needs_iterations);
}

#[test]
fn the_resolution_of_an_undecided_staircase_is_its_noise_s_not_its_distance_to_significance() {
    let cfg = DetectorConfig::default();
    let x: Vec<f64> = (21..=200).map(|i| i as f64).collect();
    let flat: Vec<f64> = x.iter().map(|&i| BASE + noise(i as u64, 3000.0)).collect();
    let stairs: Vec<f64> = x
        .iter()
        .map(|&i| BASE + 1048576.0 * ((i >= 60.0) as u64 + 2 * (i >= 150.0) as u64) as f64 + noise(i as u64, 3000.0))
        .collect();
    let series = |y| crate::series::Series { x: &x, y, unit: "bytes", quantum: 1.0, tolerance_per_iter: 0.0 };
    let j = crate::trend::judge(&series(&stairs), &cfg);
    assert_ne!(j.status, Status::Pass, "{}", j.reason);
    let of_stairs = crate::power::resolution(&series(&stairs), j.slope, false, &cfg);
    let of_flat = crate::power::resolution(&series(&flat), 0.0, true, &cfg);
    assert!(of_stairs > 0.5 * of_flat && of_stairs < 2.0 * of_flat, "stairs {of_stairs}, flat {of_flat}");
}

#[test]
fn process_memory_whose_live_heap_did_not_grow_is_the_allocator_s_and_passes_only_when_it_slows() {
    let evidence = |live: f64| {
        vec![crate::LiveHeap {
            metric: "g".into(),
            start_iter: 160,
            end_iter: 200,
            live_bytes_per_iter: live,
            source: "memray".into(),
        }]
    };
    let judge = |s: &Samples, live: f64| {
        let cfg = DetectorConfig { live_heap: evidence(live), ..DetectorConfig::default() };
        analyze(s, &cfg, None, None).metrics.into_iter().find(|m| m.name == "g").unwrap()
    };
    // Fragmentation that converges: each third adds less (a square root of the churn).
    let converging = gauge(N, |i| BASE + 64.0 * 1024.0 * (i as f64).sqrt());
    assert_eq!(judge(&converging, 0.0).status, Status::Pass);
    let m = judge(&converging, 0.0);
    assert!(m.reason.contains("the allocator's") && m.reason.contains("slows"), "{}", m.reason);
    // Steady growth around a flat live heap: the allocator's, not shown to slow: undecided.
    let steady = gauge(N, |i| BASE + 2048.0 * i as f64);
    let m = judge(&steady, 0.0);
    assert_eq!(m.status, Status::Inconclusive, "{}", m.reason);
    // The same growth with the live heap growing as fast: the program's, a failure.
    assert_eq!(judge(&steady, 2048.0).status, Status::Fail);
    // No evidence: the gauge's own verdict.
    assert_eq!(analyze(&steady, &DetectorConfig::default(), None, None).metrics[0].status, Status::Fail);
}

/// A Python process's layers (plateau's hook): which layer grew says what the process does.
#[test]
fn a_python_process_says_which_of_its_layers_grew() {
    let p = "target.engine.";
    let layered = |objects_leak: bool| {
        let mut metrics = BTreeMap::new();
        for (name, quantum) in [("py.object_bytes", 16.0), ("malloc.in_use_bytes", 16.0), ("proc.rss_anon", 4096.0)] {
            metrics.insert(
                format!("{p}{name}"),
                MetricSpec { quantum: Some(quantum), ..MetricSpec::new(Kind::Gauge, "bytes") },
            );
        }
        samples_of(metrics, 200, move |name, i| {
            let grows =
                if objects_leak { name.ends_with("py.object_bytes") } else { name.ends_with("malloc.in_use_bytes") };
            let base = BASE + noise(i, 64.0).round() * 16.0;
            match name {
                n if n.ends_with("proc.rss_anon") => (BASE * 4.0 + 8192.0 * i as f64 / 4096.0).floor() * 4096.0,
                _ if grows => base + 8192.0 * i as f64,
                _ => base,
            }
        })
    };
    let v = analyze(&layered(true), &DetectorConfig::default(), None, None);
    let m = |name: &str| v.metrics.iter().find(|m| m.name == format!("{p}{name}")).unwrap();
    assert_eq!(m("py.object_bytes").status, Status::Fail);
    assert_eq!(m("py.object_bytes").location.as_deref(), Some("Python objects the program keeps (pymalloc's blocks)"));
    assert_eq!(m("proc.rss_anon").location.as_deref(), Some("process memory, with Python objects kept"));
    assert!(
        v.attribution.iter().any(|l| l.starts_with("target.engine: the program keeps Python objects")),
        "{:?}",
        v.attribution
    );
    let v = analyze(&layered(false), &DetectorConfig::default(), None, None);
    assert!(
        v.attribution.iter().any(|l| l.starts_with("target.engine: malloc's heap in use grows")),
        "{:?}",
        v.attribution
    );
    // No "no allocator statistics" line for a process whose layers are read.
    assert!(v.attribution.iter().all(|l| !l.contains("no allocator statistics")), "{:?}", v.attribution);
}

#[test]
fn a_fill_whose_rate_halves_each_quarter_passes_and_square_root_growth_does_not() {
    // HALVING_RATIO: a Python server's objects in its first 60 iterations, its interpreter's caches
    // filling (the rate falls by about 8% an iteration), against square-root growth of as much.
    let cfg = DetectorConfig::default();
    let x: Vec<f64> = (21..=60).map(|i| i as f64).collect();
    let filling: Vec<f64> =
        x.iter().map(|&i| BASE - 40_000.0 * 0.92f64.powf(i - 20.0) + noise(i as u64, 16.0)).collect();
    let root: Vec<f64> = x.iter().map(|&i| BASE + 8_000.0 * (i - 20.0).sqrt() + noise(i as u64, 16.0)).collect();
    let series = |y| crate::series::Series { x: &x, y, unit: "bytes", quantum: 16.0, tolerance_per_iter: 0.0 };
    let fill = crate::trend::judge(&series(&filling), &cfg);
    assert_eq!(fill.status, Status::Pass, "{}", fill.reason);
    assert!(fill.reason.contains("a fill approaching its bound"), "{}", fill.reason);
    let leak = crate::trend::judge(&series(&root), &cfg);
    assert_eq!(leak.status, Status::Fail, "{}", leak.reason);
}
