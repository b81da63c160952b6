//! The soak driver: the imperative shell that runs a scenario against a real engine in real time.
//!
//! A run: build the engine, write the samples header, take a baseline sample, then iteration by
//! iteration run every phase and drain the engine (no request in flight anywhere), take a
//! quiescent sample, and go on until the iteration count or the duration is reached or Ctrl-C
//! arrives. Between engine steps a timer sample is taken every `sample_interval_ms`. Samples go
//! straight to samples.jsonl through a fixed buffer: the harness keeps no growing state of its own,
//! so its memory cannot pass for the engine's. The detector then reads the file back.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use plateau_engine::{AbortOutcome, Engine, Injections, RequestStage, Role, WeightSource};
use plateau_reports::{Header, SampleLine, Status, Verdict, SAMPLES_SCHEMA};

use crate::analysis::{judge_file, write_outputs, JudgeOptions};
use crate::arena::HarnessScope;
use crate::detector::warmup_rule;
use crate::pd::pair::{PdOptions, PdPair};
use crate::probes::{purge_every, sample_engine, ProcessProbes, Settle};
use crate::scenario::spec_of;
use crate::scenario::{parse_duration_secs, Abort, PdMode, Phase, Scenario, Stage};
use crate::system::System;
use crate::triggers::{PhaseTraits, Triggers};
use crate::workload::{rng_for, Workload};

/// Engine steps one phase may take before the run is declared stuck.
const MAX_STEPS_PER_PHASE: u64 = 1_000_000;
/// Iterations a duration-bound run may take at most.
pub const MAX_ITERATIONS: u64 = 100_000_000;

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
    pub tolerance: Option<crate::detector::Tolerance>,
    /// A profiled replay (the child side): activate jemalloc's heap profiler at the first
    /// quiescent point and dump the live heap there (heap-start.prof) and at the second
    /// (heap-end.prof), into the output directory.
    pub profile_window: Option<(u64, u64)>,
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
    pub aborted: u64,
    /// Targets that ended before reaching the stage they were to be aborted at.
    pub missed: u64,
    pub invalid_refused: u64,
    /// Invalid requests an external target answered 2xx (it took what it should have refused).
    pub invalid_accepted: u64,
}

/// Builds the engine a scenario describes.
pub fn build_engine(s: &Scenario, backend: &str, injections: Injections, seed: u64) -> Result<Engine, RunError> {
    let backend = resolve_backend(backend)?;
    let dtype = plateau_engine::model::cuda::DType::parse(&s.engine.dtype).map_err(RunError::Input)?;
    plateau_engine::model::factory::engine_on(backend, s.engine_config(injections, seed), dtype)
        .map_err(|err| RunError::Input(format!("engine: {err}")))
}

/// `cpu`, `cuda` (a usable device, or bad input naming what is missing) or `auto`.
pub fn resolve_backend(backend: &str) -> Result<&'static str, RunError> {
    plateau_engine::model::factory::resolve(backend).map_err(RunError::Input)
}

/// Builds what the scenario runs against: one engine, or a prefill/decode pair (`[pd]`).
pub fn build_system(
    s: &Scenario,
    source: &str,
    backend: &str,
    injections: Injections,
    seed: u64,
) -> Result<Box<dyn System>, RunError> {
    let Some(pd) = &s.pd else { return Ok(Box::new(build_engine(s, backend, injections, seed)?)) };
    if pd.mode == PdMode::Processes {
        if injections.on(plateau_engine::Injection::PdSenderOnAbort) {
            return Err(RunError::Input(
                "--inject pd-sender-on-abort: the node processes pull each transfer whole, with no chunked sender; run it in-process (without --pd-processes)".into(),
            ));
        }
        if resolve_backend(backend)? != "cpu" {
            return Err(RunError::Input(
                "[pd] mode = \"processes\" runs its nodes on the cpu backend; use --backend cpu".into(),
            ));
        }
        let mut config = s.engine_config(injections.clone(), seed);
        config.kv_transfer_timeout_ms = pd.kv_transfer_timeout_ms;
        let spec = crate::pd::remote::NodeSpec {
            scenario: source.to_string(),
            seed,
            injections: injections.iter().map(|i| i.name().to_string()).collect(),
        };
        let pair = crate::pd::remote::RemotePair::start(spec, config, pd.decode_failure_fraction)
            .map_err(|e| RunError::Harness(format!("P/D nodes: {e}")))?;
        return Ok(Box::new(pair));
    }
    let leak_on_remap = injections.on(plateau_engine::Injection::PdMmapHook);
    let role = |role, id| -> Result<Engine, RunError> {
        let mut e = build_engine(s, backend, injections.clone(), seed)?;
        e.set_role(role, id, pd.kv_transfer_timeout_ms);
        Ok(e)
    };
    let prefill = role(Role::Prefill, 1)?;
    let decode = role(Role::Decode, 2)?;
    let options = PdOptions {
        regions: pd.regions,
        bytes_per_step: pd.transfer_bytes_per_step,
        decode_failure_fraction: pd.decode_failure_fraction,
        leak_on_remap,
        sender_kept_on_abort: injections.on(plateau_engine::Injection::PdSenderOnAbort),
        seed,
    };
    Ok(Box::new(PdPair::new(prefill, decode, options)))
}

struct Driver<'a> {
    scenario: &'a Scenario,
    engine: Box<dyn System>,
    workload: Workload,
    probes: ProcessProbes,
    out: BufWriter<File>,
    samples_path: PathBuf,
    start: Instant,
    last_sample: Instant,
    interval: Option<Duration>,
    iter: u64,
    interrupt: Arc<AtomicBool>,
    /// Checks that failed at the last quiescent point (named), for the progress line.
    accounting: Option<String>,
    aborts: AbortCounts,
    rss_bytes: f64,
    /// A purge at every this many quiescent points ([`purge_every`]).
    purge_every: u64,
    /// What really fired, and what the phase being driven asks its requests for.
    triggers: Triggers,
    phase_traits: PhaseTraits,
}

impl Driver<'_> {
    fn sample(&mut self, quiescent: bool) -> Result<(), RunError> {
        let _harness = HarnessScope::enter();
        let mut values = BTreeMap::new();
        let mut cost_us = BTreeMap::new();
        let settle = match quiescent {
            false => Settle::None,
            true if self.iter % self.purge_every == 0 => Settle::Purge,
            true => Settle::Flush,
        };
        self.probes.sample("", settle, &mut values, &mut cost_us);
        let t0 = Instant::now();
        let stats = self.engine.stats();
        sample_engine(&stats, "", &mut values);
        self.engine.sample_processes(settle, &mut values);
        cost_us.insert("engine".into(), t0.elapsed().as_secs_f64() * 1e6);
        let mut checks = BTreeMap::new();
        if quiescent {
            if let Err(v) = self.engine.check_idle() {
                self.accounting = Some(v.iter().map(|x| x.metric.clone()).collect::<Vec<_>>().join(", "));
                checks.extend(v.into_iter().map(|x| (x.metric, x.detail)));
            }
        }
        self.rss_bytes = values.get("proc.rss").copied().unwrap_or(0.0);
        let line =
            SampleLine { t: self.start.elapsed().as_secs_f64(), iter: self.iter, quiescent, values, cost_us, checks };
        serde_json::to_writer(&mut self.out, &line).map_err(|e| self.io_err(e.into()))?;
        self.out.write_all(b"\n").map_err(|e| self.io_err(e))?;
        self.last_sample = Instant::now();
        Ok(())
    }

    fn io_err(&self, e: std::io::Error) -> RunError {
        RunError::Harness(format!("{}: {e}", self.samples_path.display()))
    }

    /// A request the scenario built was refused: the scenario asks for something the engine
    /// cannot serve (exit 2); any other engine failure is the harness's (exit 3).
    fn add_err(&self, phase: usize, e: plateau_engine::EngineError) -> RunError {
        match e {
            plateau_engine::EngineError::InvalidRequest { reason, .. } => {
                RunError::Input(format!("phase[{phase}]: the engine refuses its requests: {reason}"))
            }
            other => self.engine_err("add_request", other),
        }
    }

    fn engine_err(&self, what: &str, e: impl std::fmt::Display) -> RunError {
        RunError::Harness(format!("engine failed at iteration {} ({what}): {e}", self.iter + 1))
    }

    /// Steps the engine until nothing is in flight, aborting `targets` when they reach their stage.
    fn drive(&mut self, mut targets: Vec<(u64, Stage, u64)>) -> Result<(), RunError> {
        for step in 0..MAX_STEPS_PER_PHASE {
            let engine = &mut self.engine;
            let counts = &mut self.aborts;
            let fired = &mut self.triggers;
            targets.retain(|&(id, stage, trigger)| {
                let Some(now) = engine.stage(id) else {
                    counts.missed += 1;
                    return false;
                };
                let hit = match stage {
                    Stage::Waiting => now == RequestStage::Waiting,
                    Stage::AwaitingKv => now == RequestStage::AwaitingKv,
                    Stage::PullingKv => now == RequestStage::PullingKv,
                    Stage::Encode => matches!(now, RequestStage::Encoding | RequestStage::Encoded),
                    Stage::Prefill => now == RequestStage::Prefill,
                    Stage::Decode => now == RequestStage::Decode,
                    Stage::Preempted => now == RequestStage::Preempted,
                    Stage::Any => step >= trigger,
                };
                if hit {
                    if engine.abort(id) == AbortOutcome::Aborted {
                        counts.aborted += 1;
                        fired.aborted(stage);
                    }
                    return false;
                }
                true
            });
            if !self.engine.has_unfinished() {
                self.aborts.missed += targets.len() as u64;
                return Ok(());
            }
            self.step()?;
            if self.interval.is_some_and(|i| self.last_sample.elapsed() >= i) {
                self.sample(false)?;
            }
        }
        Err(RunError::Harness(format!(
            "iteration {}: the engine did not drain within {MAX_STEPS_PER_PHASE} steps",
            self.iter + 1
        )))
    }

    /// One step of the system at the shell's clock; what ended in it is counted against the
    /// phase's triggers.
    fn step(&mut self) -> Result<(), RunError> {
        let now_ms = self.start.elapsed().as_millis() as u64;
        let outputs = self.engine.step(now_ms).map_err(|e| self.engine_err("step", e))?;
        for o in &outputs {
            self.triggers.finished(o, &self.phase_traits);
        }
        Ok(())
    }

    /// Waits, stepping, for work that ends by itself (KV held until its transfer timeout), at most
    /// twice its longest time plus 100 ms: what is still there then is left for the sample to see.
    fn settle(&mut self) -> Result<(), RunError> {
        let limit = Duration::from_millis(self.engine.settle_ms().saturating_mul(2).saturating_add(100));
        let t0 = Instant::now();
        while self.engine.unsettled() > 0 && t0.elapsed() < limit {
            std::thread::sleep(Duration::from_millis(1));
            self.step()?;
        }
        Ok(())
    }

    fn targets(&self, ids: &[u64], abort: &Option<Abort>, phase: usize) -> Vec<(u64, Stage, u64)> {
        let Some(a) = abort else { return Vec::new() };
        let mut rng = rng_for(&[self.workload.seed, self.iter, phase as u64, 0x7a]);
        self.workload
            .abort_targets(ids, a.fraction, self.iter, phase)
            .into_iter()
            .map(|id| (id, a.stage, rand_core::RngCore::next_u64(&mut rng) % 8))
            .collect()
    }

    fn run_phase(&mut self, index: usize, phase: &Phase) -> Result<(), RunError> {
        let iter = self.iter + 1;
        self.phase_traits = PhaseTraits::of(phase);
        match phase {
            Phase::Batch(b) => {
                let reqs = self.workload.batch(index, b, iter);
                let ids: Vec<u64> = reqs.iter().map(|r| r.id).collect();
                let vocab = self.engine.model_config().vocab_size;
                let mut invalid =
                    (0..b.invalid as u64).map(|k| self.workload.invalid(k + iter, vocab)).collect::<Vec<_>>();
                for (k, r) in reqs.into_iter().enumerate() {
                    self.engine.add_request(r).map_err(|e| self.add_err(index, e))?;
                    // Invalid requests are spread through the batch.
                    if k % 4 == 1 {
                        if let Some((bad, what)) = invalid.pop() {
                            self.refuse(bad, what)?;
                        }
                    }
                }
                for (bad, what) in invalid {
                    self.refuse(bad, what)?;
                }
                let targets = self.targets(&ids, &b.abort, index);
                self.drive(targets)
            }
            Phase::Pressure(p) => {
                let c = self.engine.config();
                let pool_tokens = c.num_kv_blocks * c.block_size;
                let reqs = self.workload.pressure(p, pool_tokens, c.max_num_seqs);
                let ids: Vec<u64> = reqs.iter().map(|r| r.id).collect();
                for r in reqs {
                    self.engine.add_request(r).map_err(|e| self.add_err(index, e))?;
                }
                let targets = self.targets(&ids, &p.abort, index);
                self.drive(targets)
            }
            Phase::Sleep(s) => {
                self.engine.sleep(s.level).map_err(|e| self.engine_err("sleep", e))?;
                if s.update_weights {
                    let source = match &self.scenario.engine.weights {
                        Some(dir) => WeightSource::Dir(dir.clone()),
                        None => WeightSource::Preset {
                            name: self.scenario.engine.preset.clone(),
                            seed: self.scenario.engine.weights_seed.wrapping_add(iter),
                        },
                    };
                    self.engine.update_weights(source).map_err(|e| self.engine_err("update_weights", e))?;
                }
                self.engine.wake().map_err(|e| self.engine_err("wake", e))?;
                self.triggers.woke();
                Ok(())
            }
        }
    }

    fn refuse(&mut self, bad: plateau_engine::Request, what: &str) -> Result<(), RunError> {
        match self.engine.add_request(bad) {
            Err(_) => {
                self.aborts.invalid_refused += 1;
                self.triggers.refused();
                Ok(())
            }
            Ok(()) => Err(RunError::Harness(format!("the engine accepted an invalid request ({what})"))),
        }
    }
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

/// Runs a soak and judges it. The samples are complete on disk before the verdict is drawn.
pub fn run(scenario: &Scenario, opts: &RunOptions) -> Result<RunResult, RunError> {
    let (limit, duration) = run_length(scenario, opts)?;
    let seed = opts.seed.unwrap_or(scenario.soak.seed);
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
    let engine = build_system(scenario, &opts.scenario_source, &backend, opts.injections.clone(), seed)?;
    std::fs::create_dir_all(&opts.out_dir)
        .map_err(|e| RunError::Input(format!("--out {}: {e}", opts.out_dir.display())))?;
    clear_earlier_run(&opts.out_dir);
    let samples_path = opts.out_dir.join("samples.jsonl");
    let file = File::create(&samples_path).map_err(|e| RunError::Input(format!("{}: {e}", samples_path.display())))?;
    let known_length = (limit != MAX_ITERATIONS).then_some(limit);
    let warmup =
        warmup_rule(opts.warmup, Some(scenario.soak.warmup_iterations), known_length).map_err(RunError::Input)?;
    let mut metrics = ProcessProbes::specs("");
    for m in engine.stats() {
        metrics.insert(m.name.clone(), spec_of(&m));
    }
    metrics.extend(engine.process_specs());
    let header = Header {
        schema: SAMPLES_SCHEMA.into(),
        scenario: scenario.name.clone(),
        seed,
        backend: engine.backend_name().into(),
        metrics,
        warmup_iterations: Some(warmup),
        injections: opts.injections.iter().map(|i| i.name().to_string()).collect(),
    };
    let mut out = BufWriter::with_capacity(64 * 1024, file);
    serde_json::to_writer(&mut out, &header).map_err(|e| RunError::Harness(e.to_string()))?;
    out.write_all(b"\n").map_err(|e| RunError::Harness(e.to_string()))?;
    let interval_ms = opts.sample_interval_ms.unwrap_or(scenario.soak.sample_interval_ms);
    let now = Instant::now();
    let mut d = Driver {
        scenario,
        engine,
        workload: Workload::new(seed),
        probes: ProcessProbes::new(),
        out,
        samples_path: samples_path.clone(),
        start: now,
        last_sample: now,
        interval: (interval_ms > 0).then(|| Duration::from_millis(interval_ms)),
        iter: 0,
        interrupt: Arc::clone(&opts.interrupt),
        accounting: None,
        aborts: AbortCounts::default(),
        rss_bytes: 0.0,
        purge_every: purge_every(known_length, warmup, crate::detector::DetectorConfig::default().min_points as u64),
        triggers: Triggers::default(),
        phase_traits: PhaseTraits::default(),
    };
    let bar = (opts.progress == Progress::Bar).then(|| {
        let pb = if limit == MAX_ITERATIONS {
            indicatif::ProgressBar::new_spinner()
        } else {
            indicatif::ProgressBar::new(limit)
        };
        pb.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {pos}/{len} iterations [{elapsed_precise}] {msg}")
                .expect("static template"),
        );
        pb
    });
    let mut snapshots = crate::mappings::Snapshots::default();
    let mut last_line = Instant::now();
    d.sample(true)?;
    let mut interrupted = false;
    // The planned length; `--until-decided` moves it on while the verdict is undecided.
    let mut planned = limit;
    let mut extensions: Vec<u64> = Vec::new();
    // Bounded: `planned` only moves on up to the --until-decided cap.
    let mut iter = 0;
    while iter < planned {
        iter += 1;
        if duration.is_some_and(|dur| d.start.elapsed() >= dur) {
            break;
        }
        d.engine.set_epoch(iter);
        for (i, phase) in scenario.phases.iter().enumerate() {
            d.run_phase(i, phase)?;
            if d.interrupt.load(Ordering::Relaxed) {
                break;
            }
        }
        d.drive(Vec::new())?;
        d.settle()?;
        d.iter = iter;
        // The rest of the iteration is the harness's: sampling, snapshots, progress, judging.
        let _harness = HarnessScope::enter();
        d.sample(true)?;
        if iter == warmup.max(1) {
            snapshots.start_iter = iter;
            snapshots.start = d.engine.mappings().unwrap_or_else(|| d.probes.mappings());
        }
        // Last in the iteration, after the harness's own bookkeeping (the mapping snapshot), so
        // that only what the engine and the run keep is in the profile's difference.
        if let Some((start, end)) = opts.profile_window {
            let dump = |name: &str| crate::heapprof::control::dump(&opts.out_dir.join(name)).map_err(RunError::Harness);
            if iter == start {
                crate::heapprof::control::activate().map_err(RunError::Harness)?;
                dump("heap-start.prof")?;
            }
            if iter == end {
                dump("heap-end.prof")?;
            }
        }
        let status = match &d.accounting {
            None => "accounting ok".to_string(),
            Some(names) => format!("accounting FAIL: {names}"),
        };
        let msg = format!("rss {:.1} MiB, {status}", d.rss_bytes / 1024.0 / 1024.0);
        match (&bar, opts.progress) {
            (Some(pb), _) => {
                pb.set_position(iter);
                pb.set_message(msg);
            }
            (None, Progress::Lines) if last_line.elapsed() >= Duration::from_secs(10) || iter == planned => {
                eprintln!("plateau: iteration {iter}/{planned}, {:.1} s, {msg}", d.start.elapsed().as_secs_f64());
                last_line = Instant::now();
            }
            _ => {}
        }
        if d.interrupt.load(Ordering::Relaxed) {
            interrupted = true;
            break;
        }
        if let Some(cap) = opts.until_decided.filter(|_| iter == planned) {
            d.out.flush().map_err(|e| d.io_err(e))?;
            let next = undecided_until(scenario, opts, &samples_path, planned, cap)?;
            if let Some(next) = next {
                if opts.progress != Progress::Quiet {
                    eprintln!(
                        "plateau: undecided at iteration {planned}: going on to {next} (--until-decided, cap {cap})"
                    );
                }
                extensions.push(next);
                planned = next;
                if let Some(pb) = &bar {
                    pb.set_length(planned);
                }
            }
        }
    }
    let _harness = HarnessScope::enter();
    if let Some(pb) = bar {
        pb.finish_and_clear();
    }
    snapshots.end_iter = d.iter;
    snapshots.end = d.engine.mappings().unwrap_or_else(|| d.probes.mappings());
    d.out.flush().map_err(|e| d.io_err(e))?;
    let wall_secs = d.start.elapsed().as_secs_f64();
    let (iterations_done, aborts) = (d.iter, d.aborts);
    let residues = d.engine.residues();
    let triggers = d.triggers.report(scenario);
    drop(d);
    write_json(&opts.out_dir.join("triggers.json"), &triggers)?;
    write_json(&opts.out_dir.join("mappings.json"), &snapshots)?;
    write_json(&opts.out_dir.join("residues.json"), &residues)?;
    let mut verdict = rejudge(scenario, opts, interrupted)?;
    if let Some(cap) = opts.until_decided {
        verdict.warnings.push(until_decided_story(limit, &extensions, cap, &verdict));
        write_json(&opts.out_dir.join("verdict.json"), &verdict)?;
    }
    Ok(RunResult {
        verdict,
        out_dir: opts.out_dir.clone(),
        interrupted,
        iterations: iterations_done,
        wall_secs,
        aborts,
        triggers,
    })
}

/// Iterations an undecided run goes on by when no gauge says how long it needs: half its length
/// again, so that a trend's test gains about as many points as a step's spacing would need.
const UNDECIDED_GROWTH: f64 = 1.5;

/// At the planned length of a run that goes on until decided: judges the samples so far and
/// returns the length to go on to (what the undecided gauges say they need, else half as long
/// again, rounded up to 50 and at most `cap`), or None when the verdict is decided or the cap is
/// reached.
fn undecided_until(
    scenario: &Scenario,
    opts: &RunOptions,
    samples: &Path,
    planned: u64,
    cap: u64,
) -> Result<Option<u64>, RunError> {
    let judge = JudgeOptions {
        warmup: None,
        tolerance: opts.tolerance.or_else(|| scenario.soak.tolerance()),
        tolerance_explicit: false,
        incomplete: false,
    };
    let (_, v) = crate::analysis::judge_file(samples, &judge).map_err(RunError::Harness)?;
    if v.verdict != Status::Inconclusive || planned >= cap {
        return Ok(None);
    }
    let asked = v.metrics.iter().filter(|m| m.status == Status::Inconclusive).filter_map(|m| m.needs_iterations).max();
    let grown = (planned as f64 * UNDECIDED_GROWTH).ceil() as u64;
    let next = asked.unwrap_or(grown).max(planned + 1).div_ceil(50) * 50;
    Ok(Some(next.min(cap)))
}

/// The verdict's line on how long a run that went on until decided ran, and why it stopped.
fn until_decided_story(planned: u64, extensions: &[u64], cap: u64, v: &Verdict) -> String {
    let lengths: Vec<String> =
        std::iter::once(planned).chain(extensions.iter().copied()).map(|n| n.to_string()).collect();
    let ran = if extensions.is_empty() {
        format!("decided at its planned {planned} iterations")
    } else {
        format!("went on from {} iterations", lengths.join(" to "))
    };
    let end = if v.verdict == Status::Inconclusive && !v.incomplete {
        let undecided: Vec<&str> =
            v.metrics.iter().filter(|m| m.status == Status::Inconclusive).map(|m| m.name.as_str()).collect();
        format!(
            "; still undecided at the cap of {cap} iterations ({}): a longer --max-iterations would tell",
            undecided.join(", ")
        )
    } else {
        String::new()
    };
    format!("--until-decided: {ran}{end}")
}

/// What a run writes beside its samples, read back when the run is judged: left in the directory
/// by an earlier run, any of them would be read as this run's (an earlier interrupted verdict, an
/// earlier replay's growth sites).
const RUN_OUTPUTS: [&str; 11] = [
    "report.html",
    "triggers.json",
    "verdict.json",
    "mappings.json",
    "residues.json",
    "growth.json",
    "growth.txt",
    "growth.pb.gz",
    "growth.svg",
    "heap-start.prof",
    "heap-end.prof",
];

/// Removes what an earlier run left in `dir` (the samples file is truncated by its creation).
pub(crate) fn clear_earlier_run(dir: &Path) {
    for name in RUN_OUTPUTS {
        let _ = std::fs::remove_file(dir.join(name));
    }
    let _ = std::fs::remove_dir_all(dir.join("replay"));
}

/// Judges a run's samples (and whatever else its directory holds: mappings, residues, growth
/// sites) and writes verdict.json and the plots.
pub fn rejudge(scenario: &Scenario, opts: &RunOptions, interrupted: bool) -> Result<Verdict, RunError> {
    // The warm-up is in the header: a run shorter than it is inconclusive, not an input error.
    let judge = JudgeOptions {
        warmup: None,
        tolerance: opts.tolerance.or_else(|| scenario.soak.tolerance()),
        tolerance_explicit: opts.tolerance.is_some() || scenario.soak.tolerance.is_some(),
        incomplete: interrupted,
    };
    let (samples, verdict) = judge_file(&opts.out_dir.join("samples.jsonl"), &judge).map_err(RunError::Input)?;
    write_outputs(&opts.out_dir, &samples, &verdict)
        .map_err(|e| RunError::Harness(format!("{}: {e}", opts.out_dir.display())))?;
    Ok(verdict)
}

pub(crate) fn write_json(path: &Path, v: &impl serde::Serialize) -> Result<(), RunError> {
    let text = serde_json::to_string_pretty(v).map_err(|e| RunError::Harness(e.to_string()))?;
    std::fs::write(path, text).map_err(|e| RunError::Harness(format!("{}: {e}", path.display())))
}
