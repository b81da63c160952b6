//! The overhead rules at the default run length (200 iterations, warm-up 20): allocator
//! bookkeeping and page tables on a heap that levelled off, and the address space it reserves.

use std::collections::BTreeMap;

use plateau_reports::{Kind, MetricSpec, MetricVerdict, Samples, Status};

use super::tests::samples_of;
use super::verdict::analyze;
use super::DetectorConfig;

const N: u64 = 200;
const MIB: f64 = 1024.0 * 1024.0;
const PAGE: f64 = 4096.0;

/// Samples of several gauges (bytes; quantum a page for the kernel's, none for the allocator's),
/// with the relations plateau's writer declares for them.
fn samples(gauges: &[(&str, &dyn Fn(u64) -> f64)]) -> Samples {
    let mut s = undeclared(gauges);
    plateau_reports::relations::declare_v1(&mut s.header.metrics);
    s
}

/// The same with no relation declared.
fn undeclared(gauges: &[(&str, &dyn Fn(u64) -> f64)]) -> Samples {
    let mut metrics = BTreeMap::new();
    for (name, _) in gauges {
        let quantum = name.starts_with("proc.").then_some(PAGE);
        metrics.insert(name.to_string(), MetricSpec { quantum, ..MetricSpec::new(Kind::Gauge, "bytes") });
    }
    samples_of(metrics, N, |name, i| gauges.iter().find(|g| g.0 == name).map_or(0.0, |g| (g.1)(i)))
}

fn verdict_of(s: &Samples, name: &str) -> MetricVerdict {
    let v = analyze(s, &DetectorConfig::default(), None, None);
    v.metrics.into_iter().find(|m| m.name == name).expect("judged")
}

/// A 64 MiB cache full by iteration 60, then churning: the live heap level.
fn heap(i: u64) -> f64 {
    16.0 * MIB + 64.0 * MIB * (i as f64 / 60.0).min(1.0)
}

/// Bookkeeping that grows with the heap, then by a logarithm of the churn since the fill (the
/// measured shape: 41, 19, 9 KiB per hundred iterations), on jemalloc's 16-byte grid.
fn converging(i: u64) -> f64 {
    let after = (i as f64 - 60.0).max(0.0);
    (3.0 * MIB + MIB * (i as f64 / 60.0).min(1.0) + 16.0 * 1024.0 * (1.0 + after / 10.0).ln()).div_euclid(16.0) * 16.0
}

/// Bookkeeping that grows with the heap, then by a steady 256 B an iteration.
fn leaking(i: u64) -> f64 {
    (3.0 * MIB + MIB * (i as f64 / 60.0).min(1.0)).div_euclid(16.0) * 16.0 + 256.0 * (i as f64 - 60.0).max(0.0)
}

#[test]
fn bookkeeping_that_converges_on_a_level_heap_passes_by_its_relation_with_its_rate() {
    let s = samples(&[("jemalloc.allocated", &heap), ("jemalloc.metadata", &converging)]);
    let m = verdict_of(&s, "jemalloc.metadata");
    assert_eq!(m.status, Status::Pass, "{}", m.reason);
    assert!(m.reason.contains("fragmentation or bookkeeping") && m.reason.contains("/iteration"), "{}", m.reason);
    // The same series with no relation in the header: its name alone excuses nothing.
    let alone = undeclared(&[("jemalloc.allocated", &heap), ("jemalloc.metadata", &converging)]);
    let m = verdict_of(&alone, "jemalloc.metadata");
    assert_ne!(m.status, Status::Pass, "{}", m.reason);
    assert!(!m.reason.contains("fragmentation"), "{}", m.reason);
}

#[test]
fn bookkeeping_at_a_steady_rate_fails_named_for_what_it_is() {
    let s = samples(&[("jemalloc.allocated", &heap), ("jemalloc.metadata", &leaking)]);
    let m = verdict_of(&s, "jemalloc.metadata");
    assert_eq!(m.status, Status::Fail, "{}", m.reason);
    assert!(m.reason.contains("not slowing"), "{}", m.reason);
    assert!(m.location.as_deref().unwrap_or_default().starts_with("allocator overhead"), "{:?}", m.location);
}

/// A 64 MiB cache full by iteration 10 on 8 MiB of engine, then churning: the live heap level.
fn early_full(i: u64) -> f64 {
    8.0 * MIB + 64.0 * MIB * (i as f64 / 10.0).min(1.0)
}

/// Bookkeeping that fills with the heap, then by a steady 35 B an iteration (the measured
/// bounded cache in prefill-only, which stops by iteration 250), on jemalloc's 16-byte grid.
fn filling_in(i: u64) -> f64 {
    (3.0 * MIB + MIB * (i as f64 / 10.0).min(1.0) + 35.0 * (i as f64 - 10.0).max(0.0)).div_euclid(16.0) * 16.0
}

#[test]
fn a_steady_rise_as_small_as_bookkeeping_filling_in_is_undecided_until_it_outgrows_that() {
    let s = samples(&[("jemalloc.allocated", &early_full), ("jemalloc.metadata", &filling_in)]);
    let m = verdict_of(&s, "jemalloc.metadata");
    assert_eq!(m.status, Status::Inconclusive, "{}", m.reason);
    assert!(m.reason.contains("undecided") && m.reason.contains("show whether it slows"), "{}", m.reason);
    assert_eq!(m.needs_iterations, Some(400), "{}", m.reason);
    // The same rate kept up for 3,000 iterations has added 0.14% of the heap: more than a fill.
    let mut metrics = BTreeMap::new();
    for name in ["jemalloc.allocated", "jemalloc.metadata"] {
        metrics.insert(name.to_string(), MetricSpec::new(Kind::Gauge, "bytes"));
    }
    let mut long =
        samples_of(metrics, 3000, |name, i| if name == "jemalloc.metadata" { filling_in(i) } else { early_full(i) });
    plateau_reports::relations::declare_v1(&mut long.header.metrics);
    let m = verdict_of(&long, "jemalloc.metadata");
    assert_eq!(m.status, Status::Fail, "{}", m.reason);
}

#[test]
fn a_leak_of_a_kib_riding_on_converging_bookkeeping_fails() {
    let both = |i: u64| converging(i) + 1024.0 * (i as f64 - 60.0).max(0.0);
    let s = samples(&[("jemalloc.allocated", &heap), ("jemalloc.metadata", &both)]);
    let m = verdict_of(&s, "jemalloc.metadata");
    assert_eq!(m.status, Status::Fail, "{}", m.reason);
}

#[test]
fn slowing_overhead_past_its_share_of_the_heap_fails() {
    // Twenty times the measured fragmentation: still slowing, but at its last-half rate it
    // would add more than 2% of the live heap over ten runs' length.
    let big = |i: u64| 20.0 * converging(i);
    let s = samples(&[("jemalloc.allocated", &heap), ("jemalloc.metadata", &big)]);
    let m = verdict_of(&s, "jemalloc.metadata");
    assert_eq!(m.status, Status::Fail, "{}", m.reason);
    assert!(m.reason.contains("of the live heap (at most 2%)"), "{}", m.reason);
}

#[test]
fn bookkeeping_on_a_growing_heap_is_judged_with_the_heap() {
    let growing = |i: u64| heap(i) + 4096.0 * i as f64;
    let s = samples(&[("jemalloc.allocated", &growing), ("jemalloc.metadata", &converging)]);
    assert_eq!(verdict_of(&s, "jemalloc.allocated").status, Status::Fail);
    let m = verdict_of(&s, "jemalloc.metadata");
    assert!(!m.reason.contains("fragmentation or bookkeeping"), "{}", m.reason);
}

#[test]
fn page_tables_need_the_memory_outside_the_heap_level_too() {
    let pte = |i: u64| (converging(i) / 24.0).div_euclid(PAGE) * PAGE;
    let level = |_: u64| -2.0 * MIB;
    let growing = |i: u64| -2.0 * MIB + PAGE * (i / 2) as f64;
    let passes = samples(&[("jemalloc.allocated", &heap), ("proc.pte", &pte), ("proc.anon_outside_heap", &level)]);
    assert_ne!(verdict_of(&passes, "proc.pte").status, Status::Fail);
    let fails = samples(&[("jemalloc.allocated", &heap), ("proc.pte", &pte), ("proc.anon_outside_heap", &growing)]);
    assert_eq!(verdict_of(&fails, "proc.anon_outside_heap").status, Status::Fail);
    let m = verdict_of(&fails, "proc.pte");
    assert!(!m.reason.contains("fragmentation or bookkeeping"), "{}", m.reason);
}

/// jemalloc's address space under churn: 10 MiB more at 33, 57 and 129 (its geometric growth).
fn reserved(i: u64) -> f64 {
    40.0 * MIB + 10.0 * MIB * [33, 57, 129].iter().filter(|s| i >= **s).count() as f64
}

#[test]
fn address_space_the_allocator_reserves_passes_and_a_mapping_of_its_own_does_not() {
    let mapped = |i: u64| heap(i) * 1.1;
    let retained = |i: u64| reserved(i) - mapped(i);
    let anon = |i: u64| reserved(i) + 6.0 * MIB;
    let own = |i: u64| anon(i) + 2.0 * MIB * (i / 25) as f64;
    let allocator = samples(&[
        ("jemalloc.allocated", &heap),
        ("jemalloc.mapped", &mapped),
        ("jemalloc.retained", &retained),
        ("proc.anon_bytes", &anon),
    ]);
    let m = verdict_of(&allocator, "proc.anon_bytes");
    assert_eq!(m.status, Status::Pass, "{}", m.reason);
    assert!(m.reason.contains("all of it jemalloc.mapped and jemalloc.retained"), "{}", m.reason);
    let program = samples(&[
        ("jemalloc.allocated", &heap),
        ("jemalloc.mapped", &mapped),
        ("jemalloc.retained", &retained),
        ("proc.anon_bytes", &own),
    ]);
    assert_eq!(verdict_of(&program, "proc.anon_bytes").status, Status::Fail);
}
