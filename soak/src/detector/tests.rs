use std::collections::BTreeMap;

use plateau_reports::{Header, Kind, MetricSpec, Row, Samples, Status, SAMPLES_SCHEMA};

use super::{analyze, DetectorConfig};

/// Samples of one gauge `g` (bytes) over `n` quiescent iterations, one per 0.05 s.
fn gauge(n: u64, f: impl Fn(u64) -> f64) -> Samples {
    let mut metrics = BTreeMap::new();
    metrics.insert("g".to_string(), MetricSpec { kind: Kind::Gauge, unit: "bytes".into(), capacity: None });
    Samples {
        header: Header {
            schema: SAMPLES_SCHEMA.into(),
            scenario: "t".into(),
            seed: 0,
            backend: "cpu".into(),
            metrics,
            warmup_iterations: None,
            injections: vec![],
        },
        names: vec!["g".into()],
        rows: (1..=n).map(|i| Row { t: i as f64 * 0.05, iter: i, quiescent: true, values: vec![Some(f(i))] }).collect(),
        truncated_tail: false,
    }
}

/// Deterministic jitter in [-amp, amp].
fn jitter(i: u64, amp: f64) -> f64 {
    (((i * 2_654_435_761) % 1000) as f64 / 999.0 * 2.0 - 1.0) * amp
}

fn status(s: &Samples) -> Status {
    analyze(s, &DetectorConfig::default(), false).metrics[0].status
}

const BASE: f64 = 50.0 * 1024.0 * 1024.0;

#[test]
fn flat_noisy_heap_passes() {
    assert_eq!(status(&gauge(300, |i| BASE + jitter(i, 8192.0))), Status::Pass);
}

#[test]
fn one_kib_per_iteration_fails_within_500() {
    let v = analyze(&gauge(500, |i| BASE + 1024.0 * i as f64 + jitter(i, 4096.0)), &DetectorConfig::default(), false);
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

#[test]
fn one_page_is_not_a_leak() {
    // 4 KiB over the whole run: significant, but negligible.
    let s = gauge(300, |i| BASE + (i as f64 / 300.0 * 4096.0).floor());
    assert_eq!(status(&s), Status::Pass);
}

#[test]
fn per_request_fails_at_the_first_leaked_entry() {
    let mut s = gauge(50, |_| BASE);
    s.header
        .metrics
        .insert("registry.r".into(), MetricSpec { kind: Kind::PerRequest, unit: "count".into(), capacity: None });
    s.names = s.header.metrics.keys().cloned().collect();
    for r in &mut s.rows {
        let leaked = if r.iter >= 7 { 1.0 } else { 0.0 };
        r.values = vec![r.values[0], Some(leaked)];
    }
    // Non-quiescent samples may hold requests in flight.
    s.rows[2].quiescent = false;
    s.rows[2].values[1] = Some(40.0);
    let v = analyze(&s, &DetectorConfig::default(), false);
    let m = v.metrics.iter().find(|m| m.name == "registry.r").unwrap();
    assert_eq!((m.status, m.first_iter), (Status::Fail, Some(7)));
    assert!(v.attribution.iter().any(|a| a.contains("registry.r")));
}

#[test]
fn bounded_fails_above_capacity() {
    let mut s = gauge(30, |_| BASE);
    s.header
        .metrics
        .insert("registry.b".into(), MetricSpec { kind: Kind::Bounded, unit: "count".into(), capacity: Some(4) });
    s.names = s.header.metrics.keys().cloned().collect();
    for r in &mut s.rows {
        r.values = vec![r.values[0], Some(if r.iter == 12 { 5.0 } else { 4.0 })];
    }
    let v = analyze(&s, &DetectorConfig::default(), false);
    let m = v.metrics.iter().find(|m| m.name == "registry.b").unwrap();
    assert_eq!((m.status, m.first_iter), (Status::Fail, Some(12)));
}
