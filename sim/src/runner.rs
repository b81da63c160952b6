//! Running seeds: each on a fresh OS thread with its own madsim runtime (several runtimes on one
//! thread lose reproducibility through per-thread caches), a panic inside the simulation reported
//! as a violation with the node and simulated time where it happened.

use std::sync::Once;

use crate::faults::FaultPlan;
use crate::plan::IterationPlan;
use crate::report::{context, RunReport, Violation};
use crate::spec::RunSpec;

thread_local! {
    static LAST_PANIC: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Panics inside simulation threads are recorded for the report instead of printed.
fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let sim = std::thread::current().name().is_some_and(|n| n.starts_with("sim-seed-"));
            if sim {
                let msg = info
                    .payload()
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| info.payload().downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "panic".into());
                let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
                LAST_PANIC.with(|p| *p.borrow_mut() = Some(format!("{msg}{at}")));
            } else {
                default(info);
            }
        }));
    });
}

/// Runs one seed to the end and reports what it found. `keep_trace` keeps every trace line.
pub fn run_seed(spec: &RunSpec, seed: u64, keep_trace: bool) -> RunReport {
    match crate::plan::from_scenario(&spec.scenario, spec.sim.arrival_window_ms, seed, spec.iterations) {
        Ok(plans) => run_plans(spec, seed, plans, None, keep_trace),
        Err(e) => failed(seed, "scenario", "sim".into(), 0, e),
    }
}

/// Runs given iteration plans, under a given fault plan or (None) the one the seed draws.
pub fn run_plans(
    spec: &RunSpec,
    seed: u64,
    plans: Vec<IterationPlan>,
    faults: Option<FaultPlan>,
    keep_trace: bool,
) -> RunReport {
    install_panic_hook();
    let spec2 = spec.clone();
    let thread = std::thread::Builder::new().name(format!("sim-seed-{seed}")).spawn(move || {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut rt = madsim::runtime::Runtime::with_seed_and_config(seed, madsim::Config::default());
            rt.set_time_limit(std::time::Duration::from_secs(24 * 3600));
            rt.block_on(crate::cluster::run(spec2, seed, plans, faults, keep_trace))
        }));
        outcome.map_err(|_| {
            let msg = LAST_PANIC.with(|p| p.borrow_mut().take()).unwrap_or_else(|| "panic".into());
            let (node, t_ms) = context();
            (msg, node, t_ms)
        })
    });
    match thread.map(|t| t.join()) {
        Ok(Ok(Ok(report))) => report,
        Ok(Ok(Err((msg, node, t_ms)))) => failed(seed, "panic", node, t_ms, msg),
        Ok(Err(_)) => failed(seed, "panic", "sim".into(), 0, "the simulation thread died".into()),
        Err(e) => failed(seed, "panic", "sim".into(), 0, format!("cannot start a thread: {e}")),
    }
}

fn failed(seed: u64, invariant: &'static str, node: String, t_ms: u64, detail: String) -> RunReport {
    RunReport {
        seed,
        trace_hash: 0,
        events: 0,
        sim_ms: t_ms,
        requests: Default::default(),
        violations: vec![Violation { invariant, node, t_ms, detail }],
        trace_lines: Vec::new(),
        samples: None,
        undecided: Vec::new(),
    }
}
