//! Simulation tests: clean sweeps pass, every injection the simulator models is caught, seeds
//! replay to the same trace hash, and proptest shrinks a failing (workload, fault plan) pair.
//! Only in the simulation build: RUSTFLAGS="--cfg madsim" CARGO_TARGET_DIR=target/madsim
//! cargo test --release -p plateau-sim.
#![cfg(madsim)]

use plateau_engine::{Injection, Injections, Request, SamplingParams};
use plateau_sim::faults::{Draw, FaultPlan, Profile, Shape};
use plateau_sim::plan::{IterationPlan, Planned};
use plateau_sim::runner::{run_plans, run_seed};
use plateau_sim::spec::{default_scenario, ModelKind, RunSpec};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};

fn spec(faults: &str, injections: Injections) -> RunSpec {
    RunSpec::new(default_scenario(), Some(faults), injections, ModelKind::Hash, None).unwrap()
}

#[test]
fn clean_sweeps_pass_under_every_fault_profile() {
    for (faults, seeds) in [("none", 0..10), ("default", 0..40), ("heavy", 100..120)] {
        let s = spec(faults, Injections::none());
        for seed in seeds {
            let r = run_seed(&s, seed, false);
            assert!(r.passed(), "{faults}: {}", r.line());
            assert!(r.requests.finished > 0, "{faults}: {}", r.line());
        }
    }
}

#[test]
fn every_registry_injection_is_caught_naming_seed_and_invariant() {
    // Each injection, the invariant that must catch it, and what the violation must name.
    for (i, invariant, names) in [
        (Injection::RegistryRetainsFinished, "registry-at-quiescence", "registry.requests"),
        (Injection::NAbortOrphans, "registry-at-quiescence", "registry.sequences"),
        (Injection::AbortKeepsBlocks, "registry-at-quiescence", "registry.kv.blocks_used"),
        (Injection::SleepKeepsKv, "registry-at-quiescence", "registry.kv_pools"),
        (Injection::EncoderCacheAbort, "registry-at-quiescence", "registry.encoder_cache.refs"),
        (Injection::PdPrefillHold, "transfer-outlived-timeout", "prefill"),
        (Injection::PdHandles, "registry-at-quiescence", "registry.pd.handles"),
        (Injection::PdMmapHook, "mapped-outside-registries", "decode"),
    ] {
        let s = spec("default", Injections::none().with(i));
        let caught = (0..20).map(|seed| run_seed(&s, seed, false)).find(|r| r.failed());
        let r = caught.unwrap_or_else(|| panic!("{} not caught in seeds 0..20", i.name()));
        let line = r.line();
        assert!(line.starts_with(&format!("seed {}: FAIL ", r.seed)), "{line}");
        let named = |v: &&plateau_sim::report::Violation| {
            v.invariant == invariant && (v.detail.contains(names) || v.node.contains(names))
        };
        assert!(
            r.violations.iter().any(|v| named(&v)),
            "{}: no {invariant} violation naming {names}: {line}",
            i.name()
        );
    }
}

/// The default length sees a slow in-flight leak under the default faults (restarts included): a
/// few hundred bytes a node per iteration, on every seed of 20, named as heap growth. The clean
/// seeds at the same length pass (`clean_sweeps_pass_under_every_fault_profile`).
#[test]
fn a_slow_in_flight_leak_is_caught_at_the_default_length_on_every_seed() {
    let s = spec("default", Injections::none().with(Injection::UntrackedHeap));
    for seed in 0..20 {
        let r = run_seed(&s, seed, false);
        assert!(
            r.violations.iter().any(|v| v.invariant == "memory-plateau" && v.detail.contains("heap.allocated")),
            "seed {seed} at {} iterations: {}",
            s.iterations,
            r.line()
        );
    }
}

/// A long run without restarts: the same slow leak is caught, and the same run clean passes (a
/// thousand points, where a wandering gauge would show as a trend if anything did).
#[test]
fn untracked_heap_shows_as_heap_growth_in_a_long_run() {
    let long = |i: Injections| RunSpec::new(default_scenario(), Some("none"), i, ModelKind::Hash, Some(1000)).unwrap();
    let r = run_seed(&long(Injections::none().with(Injection::UntrackedHeap)), 0, false);
    let v = r.violations.first().unwrap_or_else(|| panic!("not caught: {}", r.line()));
    assert_eq!(v.invariant, "memory-plateau", "{}", r.line());
    assert!(v.detail.contains("heap.allocated"), "{}", r.line());
    let clean = run_seed(&long(Injections::none()), 0, false);
    assert!(clean.passed(), "{}", clean.line());
}

#[test]
fn a_seed_replays_to_the_same_trace_and_seeds_differ() {
    let s = spec("heavy", Injections::none());
    let mut hashes = Vec::new();
    for seed in 0..24 {
        let a = run_seed(&s, seed, false);
        let b = run_seed(&s, seed, true);
        assert_eq!(a.trace_hash, b.trace_hash, "seed {seed}");
        assert_eq!(a.events, b.trace_lines.len() as u64, "seed {seed}");
        hashes.push(a.trace_hash);
    }
    hashes.sort_unstable();
    hashes.dedup();
    assert_eq!(hashes.len(), 24, "every seed runs differently");
}

/// Known trace hashes (default scenario and faults, hash model): a change in the engine's
/// scheduling, sampling, hashing or the simulator's plans changes them, and must be a visible
/// decision (update the list in the same commit, saying why). They do not depend on the
/// toolchain: every seed, key and trace is hashed with a fixed, specified hash. Last changed when
/// the default scenario's length went from 8 to 100 iterations and settling waits for the tick
/// that frees a timed-out transfer.
#[test]
fn fixed_seeds_replay_to_known_traces() {
    let s = spec("default", Injections::none());
    let known = [
        (0, 0x252d_38b0_51d1_3765),
        (1, 0xc76a_99d6_8aa6_be2a),
        (2, 0x8ec7_6179_894f_0b9c),
        (3, 0x96c5_289a_1855_71e8),
        (4, 0x8512_77ea_05b8_7c22),
    ];
    for (seed, hash) in known {
        let r = run_seed(&s, seed, false);
        assert_eq!(r.trace_hash, hash, "seed {seed}: {}", r.line());
    }
}

/// A generated workload: one iteration of plain requests (n, prompt length, max tokens, abort delay).
fn workload(reqs: &[(u32, usize, u32, Option<u64>)]) -> Vec<IterationPlan> {
    let requests = reqs
        .iter()
        .enumerate()
        .map(|(k, &(n, len, max_tokens, abort))| Planned {
            at_ms: k as u64 * 3,
            client: k as u32 % 4,
            request: Request {
                id: k as u64,
                prompt: (0..len as u32).map(|t| 10 + (t * 7 + k as u32) % 200).collect(),
                params: SamplingParams { n, max_tokens, seed: Some(k as u64), ..SamplingParams::default() },
                images: Vec::new(),
            },
            abort_after_ms: abort,
        })
        .collect();
    vec![IterationPlan { requests, sleeps: vec![(1, false)] }]
}

fn case() -> impl Strategy<Value = (Vec<(u32, usize, u32, Option<u64>)>, Vec<Draw>)> {
    let req = (1u32..3, 1usize..80, 1u32..12, proptest::option::of(0u64..40));
    (proptest::collection::vec(req, 1..10), proptest::collection::vec(any::<[u64; 6]>(), 0..5))
}

fn check(s: &RunSpec, reqs: &[(u32, usize, u32, Option<u64>)], draws: &[Draw]) -> Result<(), TestCaseError> {
    let shape = Shape { engine_nodes: 3, clients: 4, horizon_ms: 300 };
    let faults = FaultPlan::from_draws(shape, draws, draws.len());
    // One iteration: the exact layer and the invariants decide; the gauges are too short to
    // judge (undecided, which is no pass, and no failure either).
    let r = run_plans(s, 1, workload(reqs), Some(faults), false);
    prop_assert!(!r.failed(), "{}", r.line());
    Ok(())
}

#[test]
fn generated_workloads_and_fault_plans_hold_every_invariant() {
    let s = spec("none", Injections::none());
    let mut runner = TestRunner::new(Config { cases: 48, failure_persistence: None, ..Config::default() });
    runner.run(&case(), |(reqs, draws)| check(&s, &reqs, &draws)).unwrap();
}

#[test]
fn a_failing_case_shrinks_to_one_request_and_no_faults() {
    let s = spec("none", Injections::none().with(Injection::RegistryRetainsFinished));
    let mut runner = TestRunner::new(Config { cases: 16, failure_persistence: None, ..Config::default() });
    match runner.run(&case(), |(reqs, draws)| check(&s, &reqs, &draws)) {
        Err(TestError::Fail(why, (reqs, draws))) => {
            assert_eq!(reqs.len(), 1, "shrunk to {reqs:?} / {draws:?}: {why}");
            assert!(draws.is_empty(), "shrunk to {reqs:?} / {draws:?}: {why}");
        }
        other => panic!("registry-retains-finished not found: {other:?}"),
    }
}

#[test]
fn unknown_profiles_and_impossible_specs_are_refused() {
    assert!(Profile::parse("storm").is_err());
    let e = RunSpec::new(default_scenario(), None, Injections::none(), ModelKind::Hash, Some(0)).unwrap_err();
    assert!(e.contains("--iterations"), "{e}");
}
