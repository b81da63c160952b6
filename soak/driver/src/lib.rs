//! The soak driver: the imperative shell that runs a scenario in real time against a [`Target`]
//! (plateau's engine or a P/D pair here, `engine.rs`; an HTTP server in `crate::external`), through
//! one run loop (`run_loop.rs`) with one phase plan (`plan.rs`) and one samples writer
//! (`sink.rs`). Between engine steps a timer sample is taken every `sample_interval_ms`. Samples go
//! straight to samples.jsonl through a fixed buffer: the harness keeps no growing state of its own,
//! so its memory cannot pass for the engine's. The detector then reads the file back.

// The harness's allocator in this crate's unit tests, as the `plateau` binary has it (the
// tests read jemalloc's statistics and arenas).
#[cfg(test)]
plateau_probes::install_harness_allocator!();

mod engine;
pub mod plan;
mod run_loop;
pub mod sink;
pub mod sites_replay;
pub mod target;
pub mod triggers;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use plateau_engine::Injections;
use plateau_reports::Verdict;

pub use engine::{build_engine, build_system, resolve_backend, EngineTarget};
use plateau_analysis::{judge_run, write_outputs};
use plateau_detector::{warmup_rule, Overrides};
use plateau_probes::probes::purge_every;
use plateau_scenario::{parse_duration_secs, PdMode, Scenario};
pub use run_loop::{run_with, RunPlan};
pub use target::Target;

pub use plateau_detector::STOPPED_ON_EXACT_FAILURE;

/// Iterations a run may take at most, a duration-bound one included (the reason is beside the
/// scenario's cap).
pub const MAX_ITERATIONS: u64 = plateau_scenario::MAX_ITERATIONS;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// A progress bar (a terminal).
    Bar,
    /// Plain lines every few seconds (CI, pipes).
    Lines,
    Quiet,
}

impl Progress {
    pub fn detect() -> Progress {
        if std::io::stderr().is_terminal() {
            Progress::Bar
        } else {
            Progress::Lines
        }
    }
}

#[derive(Debug, Clone)]
pub struct RunOptions {
    pub iterations: Option<u64>,
    pub duration: Option<String>,
    /// `--until-decided`: the cap (in iterations) a run undecided at its planned length may be
    /// extended to.
    pub until_decided: Option<u64>,
    pub seed: Option<u64>,
    pub injections: Injections,
    pub backend: Option<String>,
    pub out_dir: PathBuf,
    pub sample_interval_ms: Option<u64>,
    pub progress: Progress,
    pub interrupt: Arc<AtomicBool>,
    /// The scenario as given (a path or a shipped name): child processes load it again.
    pub scenario_source: String,
    /// Run a `[pd]` scenario with a process per role (TCP between them).
    pub pd_processes: bool,
    /// `--warmup`: quiescent iterations the trend test skips (default: the scenario's).
    pub warmup: Option<u64>,
    /// `--tolerance` (default: the scenario's, else the detector's).
    pub tolerance: Option<plateau_detector::Tolerance>,
    /// A profiled replay (the child side): the window's first and last quiescent points; the
    /// target marks them and the middle one (`Target::mark_window`).
    pub profile_window: Option<(u64, u64)>,
    /// `--stop-on-exact-failure`: end the run at the first quiescent point where the exact layer
    /// fails (a shrink's candidates: a registry leak is decided there, and the gauges need not
    /// be judged).
    pub stop_on_exact_failure: bool,
    /// `--stop-when-decided`: end the run once its verdict is decided, a failure with no gauge
    /// undecided (judged every [`run_loop::DECIDED_EVERY`] iterations past the warm-up); a pass is
    /// decided at the planned length only, where its resolution is the run's.
    pub stop_when_decided: bool,
    /// `--sites`: what the run records of allocation sites (sites.jsonl).
    pub sites: plateau_sites::Depth,
    /// `--profile`: record plateau's own allocation sites whatever the run's verdict.
    pub profile: bool,
    /// A replay's own side (`--record-sites`, set by plateau for the child it runs): record
    /// plateau's own heap by site at every quiescent point, with the profiler the child started
    /// with (`sites_replay.rs`).
    pub record_sites: bool,
}

/// Why a run could not produce a verdict: bad input (exit 2) or the engine/harness failed (exit 3).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{0}")]
    Input(String),
    #[error("{0}")]
    Harness(String),
}

pub struct RunResult {
    pub verdict: Verdict,
    pub out_dir: PathBuf,
    pub interrupted: bool,
    pub iterations: u64,
    pub wall_secs: f64,
    pub aborts: AbortCounts,
    /// Each trigger the scenario claims and how often it fired (also in triggers.json).
    pub triggers: Vec<crate::triggers::TriggerCount>,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct AbortCounts {
    /// Requests an external target completed: streamed to their end with every choice asked for.
    pub completed: u64,
    pub aborted: u64,
    /// Targets that ended before reaching the stage they were to be aborted at.
    pub missed: u64,
    pub invalid_refused: u64,
    /// Invalid requests an external target answered 2xx (it took what it should have refused).
    pub invalid_accepted: u64,
    /// Completed streams of an external target that asked for more than one choice (`n > 1`).
    pub multi_choice: u64,
    /// Of those, the streams that never carried one of the choices asked for (some servers leave
    /// out a choice that ends at its first token; one that ignores `n` leaves out all but one).
    pub short_of_choices: u64,
}

/// How long a run goes: its iteration limit ([`MAX_ITERATIONS`] for a run bound by duration
/// alone) and its duration, from the options and the scenario.
pub fn run_length(scenario: &Scenario, opts: &RunOptions) -> Result<(u64, Option<Duration>), RunError> {
    let iterations = opts.iterations.unwrap_or(scenario.soak.iterations);
    if iterations == 0 {
        return Err(RunError::Input("--iterations must be at least 1".into()));
    }
    let duration = match opts.duration.as_ref().or(scenario.soak.duration.as_ref()) {
        Some(d) => Some(Duration::from_secs_f64(
            parse_duration_secs(d).map_err(|m| RunError::Input(format!("--duration: {m}")))?,
        )),
        None => None,
    };
    let limit = if duration.is_some() && opts.iterations.is_none() { MAX_ITERATIONS } else { iterations };
    Ok((limit, duration))
}

/// The length, warm-up, seed and timer of a run, from the options and the scenario.
pub fn plan_run(scenario: &Scenario, opts: &RunOptions) -> Result<RunPlan, RunError> {
    let (limit, duration) = run_length(scenario, opts)?;
    let known_length = (limit != MAX_ITERATIONS).then_some(limit);
    let warmup =
        warmup_rule(opts.warmup, Some(scenario.soak.warmup_iterations), known_length).map_err(RunError::Input)?;
    let interval_ms = opts.sample_interval_ms.unwrap_or(scenario.soak.sample_interval_ms);
    Ok(RunPlan {
        limit,
        duration,
        warmup,
        seed: opts.seed.unwrap_or(scenario.soak.seed),
        interval: (interval_ms > 0).then(|| Duration::from_millis(interval_ms)),
    })
}

/// Runs a soak of plateau's own engine (or P/D pair) and judges it.
pub fn run(scenario: &Scenario, opts: &RunOptions) -> Result<RunResult, RunError> {
    let plan = plan_run(scenario, opts)?;
    let backend = opts.backend.clone().unwrap_or_else(|| scenario.engine.backend.clone());
    let mut scenario_owned;
    let scenario = if opts.pd_processes {
        scenario_owned = scenario.clone();
        match scenario_owned.pd.as_mut() {
            Some(pd) => pd.mode = PdMode::Processes,
            None => return Err(RunError::Input("--pd-processes needs a scenario with a [pd] section".into())),
        }
        &scenario_owned
    } else {
        scenario
    };
    // A replay recording the sites (`--record-sites`) records them from before the engine is
    // built, so that every object it keeps was allocated under the profiler.
    let heap_sites = opts.record_sites.then(|| {
        let h = plateau_profile::live::HeapSites::start();
        if h.is_ok() {
            plateau_probes::arena::profile_outside_scopes();
        }
        h
    });
    let system = build_system(scenario, &opts.scenario_source, &backend, opts.injections.clone(), plan.seed)?;
    prepare_out_dir(opts)?;
    let purge =
        purge_every(plan.known_length(), plan.warmup, plateau_detector::DetectorConfig::default().min_points as u64);
    let mut target = EngineTarget::new(system, purge);
    if let Some(h) = heap_sites {
        target = target.with_heap_sites(h);
    } else if opts.sites != plateau_sites::Depth::Off && opts.profile_window.is_none() && !opts.pd_processes {
        let resolved = resolve_backend(&backend)?;
        match sites_replay::SitesReplay::of(opts, plan.seed, resolved) {
            Ok(r) => target = target.with_sites_replay(r),
            Err(e) => plateau_shell::errln!("plateau: allocation sites will not be recorded: {e}"),
        }
    }
    run_with(scenario, opts, plan, &mut target)
}

/// Creates the output directory and clears what an earlier run left in it.
pub fn prepare_out_dir(opts: &RunOptions) -> Result<(), RunError> {
    plateau_reports::fsutil::claim_run_dir(&opts.out_dir).map_err(|e| RunError::Input(format!("--out {e}")))?;
    clear_earlier_run(&opts.out_dir);
    Ok(())
}

/// What kind of program each process of a deployment is, by role (written at the end of a
/// `--topology` run, as `server.json` is for the one server of `--spawn`).
pub const SERVERS_FILE: &str = "servers.json";

/// What a run writes beside its samples, read back when the run is judged: left in the directory
/// by an earlier run, any of them would be read as this run's (an earlier interrupted verdict, an
/// earlier replay's growth sites).
const RUN_OUTPUTS: [&str; 17] = [
    "report.html",
    plateau_sites::SITES_FILE,
    plateau_profile::live::DUMP_FILE,
    "server.json",
    SERVERS_FILE,
    "triggers.json",
    "verdict.json",
    "mappings.json",
    "residues.json",
    "growth.json",
    "growth.txt",
    "growth.pb.gz",
    "growth.svg",
    "heap-start.prof",
    "heap-mid.prof",
    "heap-end.prof",
    "profile-window.json",
];

/// Removes what an earlier run left in `dir` (the samples file is truncated by its creation).
fn clear_earlier_run(dir: &Path) {
    for name in RUN_OUTPUTS {
        let _ = std::fs::remove_file(dir.join(name));
    }
    let _ = std::fs::remove_dir_all(dir.join("replay"));
}

/// Judges the run in `dir` by the one judge ([`judge_run`]: its samples with what they recorded,
/// and whatever else the directory holds: mappings, residues, growth sites) and writes
/// verdict.json, the plots and report.html. The run's own verdict and the one drawn again after
/// its profiled replay both come from here.
pub fn judge_and_write(dir: &Path) -> Result<Verdict, RunError> {
    let (samples, verdict) = judge_run(&dir.join("samples.jsonl"), &Overrides::default()).map_err(RunError::Input)?;
    write_outputs(dir, &samples, &verdict).map_err(|e| RunError::Harness(format!("{}: {e}", dir.display())))?;
    Ok(verdict)
}

/// Writes `v` as pretty JSON to `path` (a run-directory file).
pub fn write_json(path: &Path, v: &impl serde::Serialize) -> Result<(), RunError> {
    let text = serde_json::to_string_pretty(v).map_err(|e| RunError::Harness(e.to_string()))?;
    std::fs::write(path, text).map_err(|e| RunError::Harness(format!("{}: {e}", path.display())))
}
