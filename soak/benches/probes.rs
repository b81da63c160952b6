//! Harness costs: each probe of a sample, a whole quiescent sample, and one iteration's engine work
//! for two shipped scenarios, so that the sampling overhead per iteration is their ratio.

use std::collections::BTreeMap;

use criterion::{criterion_group, criterion_main, Criterion};
use plateau_engine::Injections;
use plateau_soak::driver::build_engine;
use plateau_soak::probes::{read_jemalloc, read_proc, settle_allocator, ProcessProbes, Settle};
use plateau_soak::scenario::{Phase, Scenario};
use plateau_soak::workload::Workload;

// The harness's allocator, as the `plateau` binary has it.
plateau_probes::install_harness_allocator!();

fn probes(c: &mut Criterion) {
    let (s, _) = Scenario::load("n-sampling").unwrap();
    let engine = build_engine(&s, "cpu", Injections::none(), 0).unwrap();
    let mut g = c.benchmark_group("probe");
    g.bench_function("settle_flush", |b| b.iter(|| settle_allocator(Settle::Flush)));
    g.bench_function("jemalloc_read", |b| {
        let mut v = BTreeMap::new();
        b.iter(|| read_jemalloc("", &mut v))
    });
    let pp = ProcessProbes::new();
    let p = pp.process().unwrap();
    g.bench_function("proc_read", |b| {
        let mut v = BTreeMap::new();
        b.iter(|| read_proc(p, "", &mut v))
    });
    g.bench_function("engine_stats", |b| b.iter(|| engine.stats()));
    let mut pp = ProcessProbes::new();
    g.bench_function("full_quiescent_sample", |b| {
        b.iter(|| {
            let (mut v, mut cost) = (BTreeMap::new(), BTreeMap::new());
            pp.sample("", Settle::Flush, &mut v, &mut cost);
            for m in engine.stats() {
                v.insert(m.name, m.value as f64);
            }
            v
        })
    });
    g.finish();
}

fn iteration(c: &mut Criterion) {
    for name in ["n-sampling", "mixed", "multimodal-repeat"] {
        let (s, _) = Scenario::load(name).unwrap();
        let mut engine = build_engine(&s, "cpu", Injections::none(), 0).unwrap();
        let mut w = Workload::new(0);
        let mut iter = 0u64;
        c.bench_function(&format!("iteration_engine_work/{name}"), |b| {
            b.iter(|| {
                iter += 1;
                for (i, phase) in s.phases.iter().enumerate() {
                    match phase {
                        Phase::Batch(bt) => {
                            for r in w.batch(i, bt, iter) {
                                engine.add_request(r).unwrap();
                            }
                        }
                        Phase::Pressure(p) => {
                            let c = engine.config();
                            for r in w.pressure(p, c.num_kv_blocks * c.block_size, c.max_num_seqs) {
                                engine.add_request(r).unwrap();
                            }
                        }
                        Phase::Sleep(sl) => {
                            engine.sleep(sl.level).unwrap();
                            engine.wake().unwrap();
                        }
                    }
                    while engine.has_unfinished() {
                        engine.step().unwrap();
                    }
                }
            })
        });
    }
}

criterion_group!(benches, probes, iteration);
criterion_main!(benches);
