//! The one judge with sites as evidence, over samples of a server's Python process at its default
//! target length (n-sampling against a server: 600 iterations, a warm-up of 300, 20 requests an
//! iteration; sites recorded from iteration 150): a leak is blamed at its line, a fill dying away
//! is undecided with the length that decides, the allocator keeping pages under churn is
//! undecided, and memory outside every allocator that grows keeps its failure.

use std::collections::BTreeMap;

use plateau_detector::{judge_with_sites, GaugeEvidence, Overrides};
use plateau_reports::{EndState, Header, Kind, MetricSpec, MetricVerdict, Row, RunEnd, Samples, Status, Verdict};

use super::{SiteEvidence, SiteLog};

const ITERATIONS: u64 = 600;
const WARMUP: u64 = 300;
const SITES_FROM: u64 = 150;
const REQUESTS: f64 = 20.0;

/// A deterministic wobble of a few dozen bytes, as a quiet heap has.
fn wobble(i: u64) -> f64 {
    ((i * 7919) % 13) as f64 * 16.0
}

/// Samples of one process (`target.`) with its request counter, malloc's layers, Python's objects
/// and its pages, each a function of the iteration.
fn samples(gauges: &[(&str, &dyn Fn(u64) -> f64)]) -> Samples {
    let mut metrics = BTreeMap::new();
    let mut counter = MetricSpec::new(Kind::Counter, "count");
    counter.role = Some(plateau_reports::ROLE_REQUESTS.into());
    metrics.insert("plateau.requests_added".to_string(), counter);
    for (name, _) in gauges {
        metrics.insert(name.to_string(), MetricSpec { quantum: Some(16.0), ..MetricSpec::new(Kind::Gauge, "bytes") });
    }
    let heap = "target.malloc.in_use_bytes".to_string();
    for overhead in ["target.malloc.free_bytes", "target.proc.rss"] {
        if let Some(m) = metrics.get_mut(overhead) {
            m.overhead_of = Some(heap.clone());
        }
    }
    if let Some(m) = metrics.get_mut("target.proc.rss") {
        m.overhead_with = vec!["target.py.object_bytes".into()];
        m.quantum = Some(4096.0);
    }
    let header = Header {
        schema: plateau_reports::SAMPLES_SCHEMA.into(),
        scenario: "n-sampling".into(),
        metrics,
        warmup_iterations: Some(WARMUP),
        planned_iterations: Some(ITERATIONS),
        ..Header::default()
    };
    let names: Vec<String> = header.metrics.keys().cloned().collect();
    let rows = (0..=ITERATIONS)
        .map(|i| {
            let values = names
                .iter()
                .map(|n| match gauges.iter().find(|g| g.0 == n) {
                    Some((_, f)) => Some(f(i)),
                    None => Some(REQUESTS * i as f64),
                })
                .collect();
            Row::new(i as f64, i, true, values)
        })
        .collect();
    let mut s = Samples::in_memory(header, rows);
    s.end = Some(RunEnd::new(EndState::Completed, ITERATIONS));
    s
}

/// A sites log of the process `target.`: each site (name, domain) with its live bytes by
/// iteration, recorded from [`SITES_FROM`].
/// A site: its name, its kind of growth and its live bytes at each iteration.
type SiteSeries<'a> = (&'a str, &'a str, &'a dyn Fn(u64) -> f64);

fn log(sites: &[SiteSeries]) -> SiteLog {
    let mut text = String::from(
        "{\"schema\":\"plateau.sites.v1\"}\n{\"process\":{\"prefix\":\"target.\",\"profiler\":\"test\"}}\n",
    );
    for (id, (name, domain, _)) in sites.iter().enumerate() {
        text.push_str(&format!(
            "{{\"site\":{{\"id\":{id},\"prefix\":\"target.\",\"domain\":\"{domain}\",\"name\":\"{name}\"}}}}\n"
        ));
    }
    for i in SITES_FROM..=ITERATIONS {
        let bytes: Vec<String> =
            sites.iter().enumerate().map(|(id, (_, _, f))| format!("\"{id}\":{}", f(i).round() as i64)).collect();
        text.push_str(&format!("{{\"iter\":{i},\"t\":{i},\"bytes\":{{{}}}}}\n", bytes.join(",")));
    }
    SiteLog::parse(text.as_bytes()).expect("the test's log reads")
}

fn judge(s: &Samples, l: &SiteLog) -> Verdict {
    let e = SiteEvidence { log: l };
    judge_with_sites(s, &Overrides::default(), &[], Some(&e as &dyn GaugeEvidence)).expect("judged")
}

fn metric<'a>(v: &'a Verdict, name: &str) -> &'a MetricVerdict {
    v.metrics.iter().find(|m| m.name == name).unwrap_or_else(|| panic!("no {name}"))
}

const BASE: f64 = 7.0e6;

#[test]
fn a_leak_is_blamed_at_its_line_with_its_rate_and_share() {
    let leak = |i: u64| 512.0 * REQUESTS * i.saturating_sub(SITES_FROM) as f64;
    let heap = move |i: u64| BASE + 512.0 * REQUESTS * i as f64 + wobble(i);
    let s = samples(&[("target.malloc.in_use_bytes", &heap)]);
    let l = log(&[("server.py:32 remember", "malloc", &leak), ("server.py:40 cache", "malloc", &|_| 4.0e6)]);
    let v = judge(&s, &l);
    let m = metric(&v, "target.malloc.in_use_bytes");
    assert_eq!(m.status, Status::Fail, "{}", m.reason);
    let top = &m.sites[0];
    assert_eq!((top.site.as_deref(), top.kind.as_deref()), (Some("server.py:32 remember"), Some("leak")));
    assert!((top.per_request.unwrap() - 512.0).abs() < 5.0, "{top:?}");
    assert!(m.explained_share.unwrap() > 0.95, "{m:?}");
    assert_eq!(m.sites.len(), 1, "a level site is not listed");
    assert!(v.attribution.iter().any(|a| a.contains("server.py:32 remember (leak")), "{:?}", v.attribution);
}

#[test]
fn a_fill_dying_away_is_undecided_with_the_length_that_decides_never_a_leak() {
    // 4,000 keys of 1 KiB drawn by 20 requests an iteration.
    let filled = |i: u64| 1024.0 * 4000.0 * (1.0 - (-(REQUESTS * i as f64) / 4000.0).exp());
    let site = move |i: u64| filled(i) - filled(SITES_FROM);
    let heap = move |i: u64| BASE + filled(i) + wobble(i);
    let s = samples(&[("target.malloc.in_use_bytes", &heap)]);
    let l = log(&[("server.py:41 remember", "malloc", &site)]);
    let v = judge(&s, &l);
    let m = metric(&v, "target.malloc.in_use_bytes");
    assert_eq!(m.status, Status::Inconclusive, "{}", m.reason);
    assert_eq!(m.sites[0].kind.as_deref(), Some("fill"));
    assert!((800..=1000).contains(&m.needs_iterations.unwrap()), "{m:?}");
    // What the site will hold: the keys not yet met when it was first recorded.
    let bound = m.sites[0].bound_bytes.unwrap();
    let to_come = 1024.0 * 4000.0 - filled(SITES_FROM);
    assert!((bound - to_come).abs() < 0.05 * to_come, "{bound} against {to_come}");
}

#[test]
fn the_allocator_keeping_pages_under_churn_is_undecided_and_a_mapping_that_grows_is_not_excused() {
    // The program's heap level (a full cache turning over); malloc keeps 122 KiB more freed
    // memory at iterations 310 and 483, and the process's pages with it.
    let kept = |i: u64| 124_928.0 * (u64::from(i >= 310) + u64::from(i >= 483)) as f64;
    let heap = |i: u64| BASE + wobble(i);
    let free = move |i: u64| 200_000.0 + kept(i);
    let rss = move |i: u64| 3.0e7 + kept(i);
    let objects = |_: u64| 6.6e6;
    let s = samples(&[
        ("target.malloc.in_use_bytes", &heap),
        ("target.malloc.free_bytes", &free),
        ("target.proc.rss", &rss),
        ("target.py.object_bytes", &objects),
    ]);
    let l = log(&[("server.py:34 remember", "malloc", &|_| 4.1e6)]);
    let v = judge(&s, &l);
    for name in ["target.malloc.free_bytes", "target.proc.rss"] {
        let m = metric(&v, name);
        assert_eq!(m.status, Status::Inconclusive, "{name}: {}", m.reason);
        assert!(m.reason.contains("keeping freed pages under churn"), "{name}: {}", m.reason);
        assert!(m.needs_iterations.is_some(), "{name}");
    }
    // The same pages growing with malloc's freed memory level: memory no allocator made.
    let rss_alone = move |i: u64| 3.0e7 + 2048.0 * i as f64;
    let s = samples(&[
        ("target.malloc.in_use_bytes", &heap),
        ("target.malloc.free_bytes", &|_| 200_000.0),
        ("target.proc.rss", &rss_alone),
        ("target.py.object_bytes", &objects),
    ]);
    let v = judge(&s, &l);
    assert_eq!(metric(&v, "target.proc.rss").status, Status::Fail, "{}", metric(&v, "target.proc.rss").reason);
}
