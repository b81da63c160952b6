//! The simulator's speed on one core: simulated requests per wall second, for one seed of the
//! default cluster scenario (a P/D pair and a monolithic node behind a router) run to its end,
//! under its default faults and under none, with the hash model. Criterion's "elements" are the
//! seed's requests, so its throughput line is the figure.
//!
//!     RUSTFLAGS="--cfg madsim" CARGO_TARGET_DIR=$PWD/target/madsim cargo bench -p plateau-sim --features bench
//!
//! (`$PWD`: criterion resolves a relative target folder from the package's own folder.)

#[cfg(madsim)]
mod sweep {
    use criterion::{BenchmarkId, Criterion, Throughput};
    use plateau_engine::Injections;
    use plateau_sim::runner::run_seed;
    use plateau_sim::spec::{default_scenario, ModelKind, RunSpec};

    pub fn seeds(c: &mut Criterion) {
        let mut g = c.benchmark_group("sim_seed");
        for faults in ["default", "none"] {
            let spec = RunSpec::new(default_scenario(), Some(faults), Injections::none(), ModelKind::Hash, None)
                .expect("the default scenario runs in the simulator");
            let requests = run_seed(&spec, 0, false).requests;
            let total = requests.finished + requests.aborted + requests.failed;
            g.throughput(Throughput::Elements(total));
            // Seed 0 each time: the same run, so every sample measures the same work.
            g.bench_with_input(BenchmarkId::from_parameter(faults), &spec, |b, spec| {
                b.iter(|| {
                    let r = run_seed(spec, 0, false);
                    assert!(r.passed(), "{}", r.line());
                })
            });
        }
        g.finish();
    }
}

#[cfg(madsim)]
criterion::criterion_group!(benches, sweep::seeds);
#[cfg(madsim)]
criterion::criterion_main!(benches);

#[cfg(not(madsim))]
fn main() {
    eprintln!(
        "the simulator's benchmark needs the simulation build: RUSTFLAGS=\"--cfg madsim\" CARGO_TARGET_DIR=$PWD/target/madsim cargo bench -p plateau-sim --features bench"
    );
}
