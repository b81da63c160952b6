//! `plateau history show` over a year of nights: 365 stored runs of one scenario, each with 55
//! judged gauges (the size of a real n-sampling run's header), read back as the markdown trend and
//! the HTML page. Also the cost of storing one night.

use std::path::Path;

use criterion::{criterion_group, criterion_main, Criterion};
use plateau_reports::Samples;
use plateau_soak::detector::judge;
use plateau_soak::history::show::{html, markdown, ShowFilter};
use plateau_soak::history::store::{add, RunRecord};

// The harness's allocator, as the `plateau` binary has it.
plateau_probes::install_harness_allocator!();

const METRICS: usize = 55;
const ITERATIONS: u64 = 200;

/// A night: `METRICS` gauges over `ITERATIONS` quiescent iterations, level rising with the night.
fn night(k: u64) -> RunRecord {
    let names: Vec<String> = (0..METRICS).map(|m| format!("metric.{m:02}")).collect();
    let specs: Vec<String> =
        names.iter().map(|n| format!("\"{n}\":{{\"kind\":\"gauge\",\"unit\":\"bytes\"}}")).collect();
    let mut t = format!(
        "{{\"schema\":\"plateau.samples.v1\",\"scenario\":\"n-sampling\",\"seed\":{k},\"backend\":\"cpu\",\"metrics\":{{{}}}}}\n",
        specs.join(",")
    );
    for i in 1..=ITERATIONS {
        let values: Vec<String> = names
            .iter()
            .enumerate()
            .map(|(m, n)| format!("\"{n}\":{}", 1_000_000 + m as u64 * 4096 + k * 64 + (i * 7919 % 13) * 8))
            .collect();
        t.push_str(&format!("{{\"t\":{i},\"iter\":{i},\"quiescent\":true,\"values\":{{{}}}}}\n", values.join(",")));
    }
    let samples = Samples::parse(t.as_bytes(), Path::new("bench.jsonl")).unwrap();
    let verdict = judge(&samples).expect("the bench's samples read");
    RunRecord {
        dir: format!("runs/night-{k}").into(),
        samples_sha256: format!("{k:064x}"),
        samples,
        verdict,
        environment: None,
    }
}

fn history(c: &mut Criterion) {
    let dir = std::env::temp_dir().join(format!("plateau-bench-history-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("h.db");
    let _ = std::fs::remove_file(&db);
    let mut conn = plateau_soak::history::open(&db, true).unwrap();
    let nights: Vec<RunRecord> = (0..365).map(night).collect();
    for (k, n) in nights.iter().enumerate() {
        add(&mut conn, &db, std::slice::from_ref(n), &format!("2026-01-01T00:00:{k:03}Z")).unwrap();
    }
    let f = ShowFilter::default();
    let mut g = c.benchmark_group("history");
    g.sample_size(20);
    g.bench_function("show_markdown_365_nights", |b| b.iter(|| markdown(&conn, &db, &f).unwrap()));
    g.bench_function("show_html_365_nights", |b| b.iter(|| html(&conn, &db, &f).unwrap()));
    let one = night(1000);
    g.bench_function("add_one_night", |b| {
        b.iter(|| {
            conn.execute("DELETE FROM runs WHERE samples_sha256 = ?1", [&one.samples_sha256]).unwrap();
            add(&mut conn, &db, std::slice::from_ref(&one), "2027-01-01T00:00:00Z").unwrap()
        })
    });
    g.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, history);
criterion_main!(benches);
