//! `plateau fuzz`: a property test over a scenario's features, for people testing their own
//! engines. Each case is a random mix of the scenario's phases and request features (drawn by
//! proptest from the run's seed, so the same command draws the same cases), run as a soak and
//! judged as `plateau run` judges: the exact layer (every per-request registry and in-flight gauge
//! back to zero at every quiescent point, every bounded one within its capacity, every idle
//! self-check holding) and the gauges (memory that does not level off), so that a server whose
//! registries are right can still fail on what it keeps. The property is that no mix fails.
//!
//! Lifecycle: draw `cases` mixes; run them `jobs` at a time, in order, each ending at its first
//! exact-layer failure (`run --stop-on-exact-failure`) or going on while its gauges are undecided
//! (`--until-decided`, up to four times its length); at the first batch with a failing case, stop
//! and shrink the first failing case as `plateau shrink` does, into `shrink/`. A case still
//! undecided at its cap is counted as such.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use toml::Table;

use super::candidate::{Record, Runner, Setup};
use super::features::{self, Feature};
use super::{shrink, Origin, ShrinkError, ShrinkOptions, Shrunk, Signature};

pub struct FuzzOptions {
    pub cases: u32,
    /// Each case's length, in iterations.
    pub iterations: u64,
    pub seed: u64,
    pub out_dir: PathBuf,
    pub jobs: usize,
    pub budget: Duration,
    pub exe: PathBuf,
    pub quiet: bool,
    /// Set by SIGTERM or SIGINT: cases stop, nothing is shrunk, fuzz.json says so (exit 4).
    pub stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// One drawn mix: the phases kept (indices, in order) and the features left on.
#[derive(Debug, Clone, PartialEq)]
pub struct Mix {
    pub phases: Vec<usize>,
    pub on: Vec<Feature>,
}

impl Mix {
    fn describe(&self, all: &[Feature]) -> String {
        let off: Vec<String> = all.iter().filter(|f| !self.on.contains(f)).map(Feature::name).collect();
        let phases: Vec<String> = self.phases.iter().map(|p| (p + 1).to_string()).collect();
        format!("phases {}; off: {}", phases.join(", "), if off.is_empty() { "nothing".into() } else { off.join(", ") })
    }

    fn apply(&self, doc: &Table, all: &[Feature]) -> Table {
        let off: Vec<Feature> = all.iter().filter(|f| !self.on.contains(f)).cloned().collect();
        features::without(&features::with_phases(doc, &self.phases), &off)
    }
}

/// `cases` mixes of the scenario's phases (at least one) and features, drawn from `seed`.
pub fn draw(doc: &Table, cases: u32, seed: u64) -> Vec<Mix> {
    let phases: Vec<usize> = (0..features::phase_count(doc)).collect();
    let all = features::features(doc);
    if phases.is_empty() {
        return Vec::new();
    }
    let strategy = (
        proptest::sample::subsequence(phases.clone(), 1..=phases.len()),
        proptest::sample::subsequence(all.clone(), 0..=all.len()),
    );
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    let mut runner = TestRunner::new_with_rng(Config::default(), TestRng::from_seed(RngAlgorithm::ChaCha, &key));
    (0..cases)
        .filter_map(|_| strategy.new_tree(&mut runner).ok().map(|t| t.current()))
        .map(|(phases, on)| Mix { phases, on })
        .collect()
}

/// What a fuzz found.
pub struct Fuzzed {
    /// plateau was told to stop (SIGTERM, SIGINT) before the cases ended: nothing was shrunk.
    pub interrupted: bool,
    /// Every case run, in order (a mix drawn twice runs once).
    pub records: Vec<Record>,
    /// Mixes drawn, and of them those whose run ended in a verdict (a repeat counts with its
    /// first run).
    pub drawn: usize,
    pub judged: usize,
    /// Of the judged cases, those still undecided at their cap (inconclusive).
    pub undecided: usize,
    /// The first failing case's record index, and its shrink.
    pub failure: Option<(usize, Result<Shrunk, ShrinkError>)>,
    /// The first case whose control run (without the injections) failed too: the server or
    /// engine under test grows on its own, which is what fuzz exists to find (never shrunk as
    /// the injection's leak, never a pass).
    pub own_failure: Option<usize>,
}

/// Runs the cases and shrinks the first failing one (see the module's lifecycle).
pub fn fuzz(doc: &Table, origin: &Origin, opts: &FuzzOptions) -> Result<Fuzzed, String> {
    let t0 = Instant::now();
    let all = features::features(doc);
    let mixes = draw(doc, opts.cases, opts.seed);
    std::fs::create_dir_all(&opts.out_dir).map_err(|e| format!("--out {}: {e}", opts.out_dir.display()))?;
    let jobs = if origin.target.is_some() && !origin.own_servers() { 1 } else { opts.jobs.max(1) };
    let mut runner = Runner::new(Setup {
        exe: opts.exe.clone(),
        origin,
        seed: opts.seed,
        signature: Signature::any(),
        dir: opts.out_dir.clone(),
        jobs,
        deadline: t0 + opts.budget,
        stop: std::sync::Arc::clone(&opts.stop),
        quiet: opts.quiet,
        label: "fuzz: case",
        until_decided: true,
    });
    let mut failing = None;
    let mut own_failure = None;
    let mut judged_cases = 0;
    let mut undecided = 0;
    for batch in mixes.chunks(jobs) {
        let docs: Vec<(String, Table)> = batch
            .iter()
            .map(|m| (m.describe(&all), features::with_length(&m.apply(doc, &all), opts.iterations, opts.seed)))
            .collect();
        let judged = runner.judge(&docs);
        judged_cases += judged.iter().filter(|(_, k)| runner.records[*k].judged()).count();
        undecided += judged.iter().filter(|(_, k)| runner.records[*k].verdict == "inconclusive").count();
        if let Some(&(_, k)) = judged.iter().find(|(f, _)| *f) {
            failing = Some(k);
            break;
        }
        if let Some(&(_, k)) = judged.iter().find(|(_, k)| !runner.records[*k].control_failing.is_empty()) {
            own_failure = Some(k);
            break;
        }
        if runner.out_of_budget || runner.interrupted {
            break;
        }
    }
    // A case cut short by a stop never fails: nothing is shrunk after a stop.
    let failure = failing.filter(|_| !runner.interrupted).map(|k| {
        let shrunk = shrink(
            origin,
            &ShrinkOptions {
                run_dir: opts.out_dir.join("candidates").join(format!("{k:03}")).join("run"),
                out_dir: opts.out_dir.join("shrink"),
                jobs: opts.jobs,
                budget: opts.budget.saturating_sub(t0.elapsed()).max(Duration::from_secs(60)),
                exe: opts.exe.clone(),
                quiet: opts.quiet,
                stop: std::sync::Arc::clone(&opts.stop),
            },
        );
        (k, shrunk)
    });
    let json = serde_json::json!({
        "schema": "plateau.fuzz.v1",
        "seed": opts.seed,
        "iterations": opts.iterations,
        "cases": runner.records,
        "first_failure": failing,
        "first_failure_without_injections": own_failure,
        "out_of_budget": runner.out_of_budget,
        "interrupted": runner.interrupted,
    });
    let path = opts.out_dir.join("fuzz.json");
    plateau_reports::fsutil::write_atomic(
        &path,
        (serde_json::to_string_pretty(&json).unwrap_or_default() + "\n").as_bytes(),
    )
    .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(Fuzzed {
        interrupted: runner.interrupted,
        records: runner.records,
        drawn: mixes.len(),
        judged: judged_cases,
        undecided,
        failure,
        own_failure,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_draws_the_same_mixes_and_every_mix_keeps_a_phase() {
        let doc: Table =
            plateau_scenario::SHIPPED.iter().find(|(n, _)| *n == "mixed").expect("mixed").1.parse().unwrap();
        let a = draw(&doc, 40, 7);
        assert_eq!(a.len(), 40);
        assert_eq!(a, draw(&doc, 40, 7));
        assert_ne!(a, draw(&doc, 40, 8));
        assert!(a.iter().all(|m| !m.phases.is_empty()));
        // Mixes differ: both some with n>1 on and some with it off.
        let with_n = a.iter().filter(|m| m.on.contains(&Feature::ParallelSampling)).count();
        assert!(with_n > 0 && with_n < 40, "{with_n}");
        for m in &a {
            let text = features::render(&features::with_length(&m.apply(&doc, &features::features(&doc)), 10, 7));
            plateau_scenario::Scenario::parse(&text, "case.toml").unwrap_or_else(|e| panic!("{e}\n{text}"));
        }
    }
}
