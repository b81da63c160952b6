//! The in-process target: plateau's own engine, or a prefill/decode pair (threads, or a process
//! per role over TCP), stepped by the run loop's clock. Requests are added straight to the
//! engine; an abort fires when its request reaches the stage the scenario names; the quiescent
//! point is an engine with nothing unfinished and nothing left to settle; a probe reads jemalloc,
//! the kernel's view of the process and every registry, and runs the engine's idle self-checks.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use plateau_engine::{AbortOutcome, Engine, Injections, RequestStage, Role, WeightSource};
use plateau_reports::MetricSpec;

use super::plan::{Action, Send};
use super::sink::Sink;
use super::target::{Finish, Probe, Shape, Target, WindowEdge};
use super::{AbortCounts, RunError};
use crate::triggers::{PhaseTraits, Triggers};
use plateau_pd::pair::{PdOptions, PdPair};
use plateau_probes::arena::HarnessScope;
use plateau_probes::probes::{sample_engine, ProcessProbes, Settle};
use plateau_probes::system::System;
use plateau_scenario::{spec_of, PdMode, Phase, Scenario, Stage};

/// Engine steps one phase may take before the run is declared stuck.
const MAX_STEPS_PER_PHASE: u64 = 1_000_000;

/// Builds the engine a scenario describes.
pub fn build_engine(s: &Scenario, backend: &str, injections: Injections, seed: u64) -> Result<Engine, RunError> {
    let backend = resolve_backend(backend)?;
    let dtype = plateau_engine::model::dtype::DType::parse(&s.engine.dtype).map_err(RunError::Input)?;
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
        let spec = plateau_pd::remote::NodeSpec {
            scenario: source.to_string(),
            seed,
            injections: injections.iter().map(|i| i.name().to_string()).collect(),
        };
        let pair = plateau_pd::remote::RemotePair::start(spec, config, pd.decode_failure_fraction)
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

pub struct EngineTarget {
    engine: Box<dyn System>,
    probes: ProcessProbes,
    /// Checks that failed at the last quiescent point (named), for the progress line.
    accounting: Option<String>,
    aborts: AbortCounts,
    rss_bytes: f64,
    /// A purge at every this many quiescent points ([`plateau_probes::probes::purge_every`]).
    purge_every: u64,
    /// What really fired, and what the phase being driven asks its requests for.
    triggers: Triggers,
    phase_traits: PhaseTraits,
    /// The live heap by allocation site, recorded from the run's start (or why it is not).
    heap_sites: Option<Result<plateau_profile::live::HeapSites, String>>,
    /// Whether sites.jsonl was told about this process yet.
    sites_announced: bool,
    /// The replay that records the run's sites before its verdict is drawn.
    sites_replay: Option<super::sites_replay::SitesReplay>,
}

impl EngineTarget {
    /// Records the live heap by allocation site at each quiescent point with `h` (started before
    /// the engine was built), or says why it cannot.
    pub fn with_heap_sites(mut self, h: Result<plateau_profile::live::HeapSites, String>) -> Self {
        self.heap_sites = Some(h);
        self
    }

    /// Records the run's sites by a replay before its verdict is drawn.
    pub fn with_sites_replay(mut self, r: super::sites_replay::SitesReplay) -> Self {
        self.sites_replay = Some(r);
        self
    }

    pub fn new(engine: Box<dyn System>, purge_every: u64) -> Self {
        EngineTarget {
            heap_sites: None,
            sites_announced: false,
            sites_replay: None,
            engine,
            probes: ProcessProbes::new(),
            accounting: None,
            aborts: AbortCounts::default(),
            rss_bytes: 0.0,
            purge_every,
            triggers: Triggers::default(),
            phase_traits: PhaseTraits::default(),
        }
    }

    /// A request the scenario built was refused: the scenario asks for something the engine
    /// cannot serve (exit 2); any other engine failure is the harness's (exit 3).
    fn add_err(phase: usize, iter: u64, e: plateau_engine::EngineError) -> RunError {
        match e {
            plateau_engine::EngineError::InvalidRequest { reason, .. } => {
                RunError::Input(format!("phase[{phase}]: the engine refuses its requests: {reason}"))
            }
            other => engine_err(iter, "add_request", other),
        }
    }

    /// Steps the engine until nothing is in flight, aborting `targets` when they reach their stage.
    fn drive(&mut self, iter: u64, mut targets: Vec<(u64, Stage, u64)>, sink: &mut Sink) -> Result<(), RunError> {
        for step in 0..MAX_STEPS_PER_PHASE {
            let engine = &mut self.engine;
            let counts = &mut self.aborts;
            let fired = &mut self.triggers;
            targets.retain(|&(id, stage, delay)| {
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
                    Stage::Any => step >= delay,
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
            self.step(iter, sink)?;
            if sink.timer_due() {
                let p = self.probe(iter - 1, false)?;
                sink.write(iter - 1, false, p)?;
            }
        }
        Err(RunError::Harness(format!("iteration {iter}: the engine did not drain within {MAX_STEPS_PER_PHASE} steps")))
    }

    /// One step of the system at the run's clock; what ended in it is counted against the
    /// phase's triggers.
    fn step(&mut self, iter: u64, sink: &Sink) -> Result<(), RunError> {
        let now_ms = sink.elapsed().as_millis() as u64;
        let outputs = self.engine.step(now_ms).map_err(|e| engine_err(iter, "step", e))?;
        for o in &outputs {
            self.triggers.finished(o, &self.phase_traits);
        }
        Ok(())
    }

    fn sleep_phase(&mut self, scenario: &Scenario, iter: u64, s: &plateau_scenario::Sleep) -> Result<(), RunError> {
        self.engine.sleep(s.level).map_err(|e| engine_err(iter, "sleep", e))?;
        if s.update_weights {
            let source = match &scenario.engine.weights {
                Some(dir) => WeightSource::Dir(dir.clone()),
                None => WeightSource::Preset {
                    name: scenario.engine.preset.clone(),
                    seed: scenario.engine.weights_seed.wrapping_add(iter),
                },
            };
            self.engine.update_weights(source).map_err(|e| engine_err(iter, "update_weights", e))?;
        }
        self.engine.wake().map_err(|e| engine_err(iter, "wake", e))?;
        self.triggers.woke();
        if s.reset_prefix_cache {
            self.engine.reset_prefix_cache().map_err(|e| engine_err(iter, "reset_prefix_cache", e))?;
        }
        Ok(())
    }
}

fn engine_err(iter: u64, what: &str, e: impl std::fmt::Display) -> RunError {
    RunError::Harness(format!("engine failed at iteration {iter} ({what}): {e}"))
}

impl Target for EngineTarget {
    fn specs(&mut self) -> BTreeMap<String, MetricSpec> {
        let mut metrics = ProcessProbes::specs("");
        for m in self.engine.stats() {
            metrics.insert(m.name.clone(), spec_of(&m));
        }
        metrics.extend(self.engine.process_specs());
        metrics
    }

    fn backend(&self) -> String {
        self.engine.backend_name().into()
    }

    fn shape(&self) -> Shape {
        let c = self.engine.config();
        Shape {
            vocab_size: self.engine.model_config().vocab_size,
            pool_tokens: c.num_kv_blocks * c.block_size,
            max_num_seqs: c.max_num_seqs,
        }
    }

    fn begin(&mut self, iter: u64) {
        self.engine.set_epoch(iter);
    }

    fn run_phase(
        &mut self,
        scenario: &Scenario,
        iter: u64,
        index: usize,
        sends: Vec<Send>,
        sink: &mut Sink,
    ) -> Result<(), RunError> {
        let phase = &scenario.phases[index];
        self.phase_traits = PhaseTraits::of(phase);
        if let Phase::Sleep(s) = phase {
            return self.sleep_phase(scenario, iter, s);
        }
        let mut targets = Vec::new();
        for Send { request, action } in sends {
            let id = request.id;
            match action {
                Action::Refuse { what } => match self.engine.add_request(request) {
                    Err(_) => {
                        self.aborts.invalid_refused += 1;
                        self.triggers.refused();
                    }
                    Ok(()) => {
                        return Err(RunError::Harness(format!("the engine accepted an invalid request ({what})")))
                    }
                },
                Action::Complete | Action::Abort { .. } => {
                    self.engine.add_request(request).map_err(|e| Self::add_err(index, iter, e))?;
                    if let Action::Abort { stage, delay } = action {
                        targets.push((id, stage, delay));
                    }
                }
            }
        }
        self.drive(iter, targets, sink)
    }

    /// Drains what is left, then waits, stepping, for work that ends by itself (KV held until its
    /// transfer timeout), at most twice its longest time plus 100 ms: what is still there then is
    /// left for the sample to see.
    fn quiesce(&mut self, iter: u64, sink: &mut Sink) -> Result<(), RunError> {
        self.drive(iter, Vec::new(), sink)?;
        let limit = Duration::from_millis(self.engine.settle_ms().saturating_mul(2).saturating_add(100));
        let t0 = Instant::now();
        while self.engine.unsettled() > 0 && t0.elapsed() < limit {
            std::thread::sleep(Duration::from_millis(1));
            self.step(iter, sink)?;
        }
        Ok(())
    }

    fn probe(&mut self, iter: u64, quiescent: bool) -> Result<Probe, RunError> {
        let _harness = HarnessScope::enter();
        let mut p = Probe::default();
        let settle = match quiescent {
            false => Settle::None,
            true if iter % self.purge_every == 0 => Settle::Purge,
            true => Settle::Flush,
        };
        self.probes.sample("", settle, &mut p.values, &mut p.cost_us);
        let t0 = Instant::now();
        let stats = self.engine.stats();
        sample_engine(&stats, "", &mut p.values);
        self.engine.sample_processes(settle, &mut p.values);
        p.cost_us.insert("engine".into(), t0.elapsed().as_secs_f64() * 1e6);
        if quiescent {
            self.accounting = None;
            if let Err(v) = self.engine.check_idle() {
                self.accounting = Some(v.iter().map(|x| x.metric.clone()).collect::<Vec<_>>().join(", "));
                p.checks.extend(v.into_iter().map(|x| (x.metric, x.detail)));
            }
        }
        self.rss_bytes = p.values.get("proc.rss").copied().unwrap_or(0.0);
        Ok(p)
    }

    /// The live heap dumped by jemalloc's profiler, active since the replay started (activating
    /// it again at the window's start is a no-op, kept for a replay started without it): the
    /// engine is idle and the harness keeps no growing state, so the dumps differ by what the
    /// engine kept, frees of older objects included.
    fn mark_window(&mut self, edge: WindowEdge, _iter: u64, out_dir: &Path) -> Result<(), RunError> {
        use plateau_profile::control;
        if edge == WindowEdge::Start {
            control::activate().map_err(RunError::Harness)?;
        }
        control::dump(&out_dir.join(edge.dump_file())).map_err(RunError::Harness)
    }

    fn mappings(&mut self) -> Vec<plateau_probes::mappings::Mapping> {
        self.engine.mappings().unwrap_or_else(|| self.probes.mappings())
    }

    fn before_verdict(&mut self, out_dir: &Path, iterations: u64, warmup: u64, interrupted: bool) {
        if let (Some(r), false) = (&self.sites_replay, interrupted) {
            r.record(out_dir, iterations, warmup);
        }
    }

    fn site_names(&mut self) -> Vec<plateau_sites::SiteName> {
        match &self.heap_sites {
            Some(Ok(h)) => h.names().unwrap_or_else(|e| {
                plateau_shell::errln!("plateau: plateau's own allocation sites could not be named: {e}");
                Vec::new()
            }),
            _ => Vec::new(),
        }
    }

    fn sites(&mut self, _iter: u64, _warmup: u64, out_dir: &Path) -> Option<plateau_sites::Recorded> {
        let mut r = plateau_sites::Recorded::default();
        if !std::mem::replace(&mut self.sites_announced, true) {
            match self.heap_sites.as_ref()? {
                Ok(_) => r.processes.push(plateau_sites::Process {
                    prefix: String::new(),
                    pid: Some(std::process::id() as i32),
                    profiler: plateau_profile::live::profiler(),
                }),
                Err(e) => r.notes.push(format!("plateau's own heap: no site recorded: {e}")),
            }
        }
        match self.heap_sites.as_mut()? {
            Ok(h) => match h.snapshot(out_dir) {
                Ok(snap) => r.snapshots.push(snap),
                Err(e) => {
                    r.notes.push(format!("plateau's own heap: sites no longer recorded: {e}"));
                    self.heap_sites = Some(Err(e));
                }
            },
            Err(_) if r.notes.is_empty() => return None,
            Err(_) => {}
        }
        Some(r)
    }

    fn status(&self) -> String {
        let status = match &self.accounting {
            None => "accounting ok".to_string(),
            Some(names) => format!("accounting FAIL: {names}"),
        };
        format!("rss {:.1} MiB, {status}", self.rss_bytes / 1024.0 / 1024.0)
    }

    fn counts(&self) -> AbortCounts {
        self.aborts
    }

    fn finish(&mut self, scenario: &Scenario, _failed: Option<&RunError>) -> Finish {
        Finish {
            residues: serde_json::to_value(self.engine.residues()).ok(),
            triggers: Some(self.triggers.report(scenario)),
            ..Finish::default()
        }
    }
}
