//! The exact layer through the whole judge: a counter that goes down, a failed idle check, a
//! `per_request` entry left at a quiescent point and a `bounded` one past its capacity each fail
//! at the iteration they first show, whatever the trends say.

use plateau_reports::{Kind, MetricSpec, Status};

use super::super::verdict::analyze;
use super::super::DetectorConfig;
use super::{gauge, BASE};

#[test]
fn a_counter_that_goes_down_fails() {
    let mut s = gauge(40, |i| i as f64);
    s.header.metrics.insert("g".into(), MetricSpec::new(Kind::Counter, "count"));
    s.rows[30].values[0] = Some(3.0);
    let v = analyze(&s, &DetectorConfig::default(), None, None);
    assert_eq!((v.metrics[0].status, v.metrics[0].first_iter), (Status::Fail, Some(31)));
}

#[test]
fn failed_idle_checks_are_exact_failures_with_their_first_iteration() {
    let mut s = gauge(50, |_| BASE);
    s.rows[9].checks.insert("check.kv_accounting".into(), "free + cached + used != total".into());
    s.rows[12].checks.insert("check.kv_accounting".into(), "free + cached + used != total".into());
    let v = analyze(&s, &DetectorConfig::default(), None, None);
    let m = v.metrics.iter().find(|m| m.name == "check.kv_accounting").unwrap();
    assert_eq!((m.status, m.first_iter, m.kind.as_str()), (Status::Fail, Some(10), "check"));
}

#[test]
fn per_request_fails_at_the_first_leaked_entry() {
    let mut s = gauge(50, |_| BASE);
    s.header.metrics.insert("registry.r".into(), MetricSpec::new(Kind::PerRequest, "count"));
    s.names = s.header.metrics.keys().cloned().collect();
    for r in &mut s.rows {
        let leaked = if r.iter >= 7 { 1.0 } else { 0.0 };
        r.values = vec![r.values[0], Some(leaked)];
    }
    // Non-quiescent samples may hold requests in flight.
    s.rows[2].quiescent = false;
    s.rows[2].values[1] = Some(40.0);
    let v = analyze(&s, &DetectorConfig::default(), None, None);
    let m = v.metrics.iter().find(|m| m.name == "registry.r").unwrap();
    assert_eq!((m.status, m.first_iter), (Status::Fail, Some(7)));
    assert!(v.attribution.iter().any(|a| a.contains("registry.r")));
}

#[test]
fn bounded_fails_above_capacity() {
    let mut s = gauge(30, |_| BASE);
    s.header
        .metrics
        .insert("registry.b".into(), MetricSpec { capacity: Some(4), ..MetricSpec::new(Kind::Bounded, "count") });
    s.names = s.header.metrics.keys().cloned().collect();
    for r in &mut s.rows {
        r.values = vec![r.values[0], Some(if r.iter == 12 { 5.0 } else { 4.0 })];
    }
    let v = analyze(&s, &DetectorConfig::default(), None, None);
    let m = v.metrics.iter().find(|m| m.name == "registry.b").unwrap();
    assert_eq!((m.status, m.first_iter), (Status::Fail, Some(12)));
}
