//! The one run loop, for every target: plateau's engine, a prefill/decode pair, an HTTP server.
//!
//! A run: write the samples header, take a baseline sample, then iteration by iteration run every
//! phase (its requests planned by `plan.rs`) and reach quiescence (no request in flight anywhere),
//! take a quiescent sample, and go on until the iteration count or the duration is reached or
//! Ctrl-C arrives; `--until-decided` moves the planned length on while the verdict is undecided.
//! A run that stops on a harness error keeps what it sampled and judges it, marked incomplete:
//! growth that was conclusive before the failure (a target killed by its own leak) is the run's
//! finding. What decides the verdict is recorded with the samples: the header holds the warm-up,
//! the tolerance and the planned length, and the last line how the run ended ([`RunEnd`]). The
//! samples are complete on disk before the verdict is drawn, by the one judge.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use plateau_reports::{EndState, Header, Kind, MetricSpec, RunEnd, Samples, Status, SAMPLES_SCHEMA};

use super::plan;
use super::sink::Sink;
use super::target::{Target, WindowEdge};
use super::{judge_and_write, write_json, Progress, RunError, RunOptions, RunResult, MAX_ITERATIONS};
use plateau_probes::arena::HarnessScope;
use plateau_scenario::workload::Workload;
use plateau_scenario::Scenario;

/// How long a run goes and how it is sampled, settled before its target is built.
#[derive(Debug, Clone, Copy)]
pub struct RunPlan {
    /// The iteration limit ([`MAX_ITERATIONS`] for a run bound by duration alone).
    pub limit: u64,
    pub duration: Option<Duration>,
    pub warmup: u64,
    pub seed: u64,
    /// Timer samples between quiescent points, if any.
    pub interval: Option<Duration>,
}

impl RunPlan {
    /// The run's length when it is known (not bound by duration alone).
    pub fn known_length(&self) -> Option<u64> {
        (self.limit != MAX_ITERATIONS).then_some(self.limit)
    }
}

/// Runs `scenario` against `target` and judges it.
pub fn run_with(
    scenario: &Scenario,
    opts: &RunOptions,
    plan: RunPlan,
    target: &mut dyn Target,
) -> Result<RunResult, RunError> {
    let samples_path = opts.out_dir.join("samples.jsonl");
    // What the verdict is judged with, recorded before the first sample: the warm-up, the
    // tolerance the user or the scenario gave (absent: the detector's default), the length.
    let mut metrics = target.specs();
    plateau_reports::relations::declare_v1(&mut metrics);
    let header = Header {
        schema: SAMPLES_SCHEMA.into(),
        scenario: scenario.name.clone(),
        seed: plan.seed,
        backend: target.backend(),
        metrics,
        warmup_iterations: Some(plan.warmup),
        injections: opts.injections.iter().map(|i| i.name().to_string()).collect(),
        plants: opts.injections.plants().iter().map(|p| p.name().to_string()).collect(),
        tolerance: opts.tolerance.or_else(|| scenario.soak.tolerance()).map(|t| t.to_string()),
        planned_iterations: plan.known_length(),
        planned_duration_s: plan.duration.map(|d| d.as_secs_f64()),
    };
    let mut sink = Sink::create(&samples_path, &header, plan.interval)?;
    let mut state = LoopState {
        planned: plan.limit,
        extensions: Vec::new(),
        done: 0,
        interrupted: false,
        specs: header.metrics.clone(),
        exact_failure: None,
        decided: false,
        sites: SiteLog { writer: None, failed: false },
    };
    let mut snapshots = plateau_probes::mappings::Snapshots::default();
    let outcome = iterate(scenario, opts, plan, target, &mut sink, &mut state, &mut snapshots);
    state.sites.name(target);
    let _harness = HarnessScope::enter();
    snapshots.end_iter = state.done;
    snapshots.end = target.mappings();
    snapshots.set_roles(target.role_mappings(), |r| &mut r.end);
    sink.flush()?;
    let wall_secs = sink.elapsed().as_secs_f64();
    let failed = outcome.as_ref().err();
    let finish = target.finish(scenario, failed);
    if let Some(t) = &finish.triggers {
        write_json(&opts.out_dir.join("triggers.json"), t)?;
    }
    if !snapshots.end.is_empty() || !snapshots.roles.is_empty() {
        write_json(&opts.out_dir.join("mappings.json"), &snapshots)?;
    }
    if let Some(r) = &finish.residues {
        write_json(&opts.out_dir.join("residues.json"), r)?;
    }
    // Input errors (a request the scenario made that the engine refuses) stop at once; a harness
    // failure keeps the samples so far and judges them.
    if let Err(e @ RunError::Input(_)) = outcome {
        return Err(e);
    }
    sink.write_end(&run_end(opts, &state, failed, &finish))?;
    drop(sink);
    target.before_verdict(&opts.out_dir, state.done, plan.warmup, state.interrupted || failed.is_some());
    let verdict = match judge_and_write(&opts.out_dir) {
        Ok(v) => v,
        Err(j) => return Err(outcome.err().unwrap_or(j)),
    };
    let result = |verdict, interrupted| RunResult {
        verdict,
        out_dir: opts.out_dir.clone(),
        interrupted,
        iterations: state.done,
        wall_secs,
        aborts: target.counts(),
        triggers: finish.triggers.clone().unwrap_or_default(),
    };
    match outcome {
        Ok(()) => Ok(result(verdict, state.interrupted)),
        // Growth conclusive before the failure is the run's finding (exit 1).
        Err(e) if verdict.failed() => {
            plateau_shell::errln!("plateau: {e}");
            Ok(result(verdict, true))
        }
        Err(e) => Err(match &finish.target_exit {
            Some(how) => RunError::Harness(format!("{e}; {how}")),
            None => e,
        }),
    }
}

/// How the run ended, for its samples' last line: what the one judge needs beyond the samples.
fn run_end(opts: &RunOptions, state: &LoopState, failed: Option<&RunError>, finish: &super::target::Finish) -> RunEnd {
    let end_state = match (failed, &state.exact_failure) {
        (Some(_), _) => EndState::Failed,
        (None, _) if state.interrupted => EndState::Interrupted,
        (None, Some(_)) => EndState::Stopped,
        (None, None) if state.decided => EndState::Decided,
        (None, None) => EndState::Completed,
    };
    let mut end = RunEnd::new(end_state, state.done);
    end.error = failed.map(|e| match &finish.target_exit {
        Some(how) => format!("{e}; {how}"),
        None => e.to_string(),
    });
    end.until_decided_cap = opts.until_decided;
    end.extensions = state.extensions.clone();
    end.stopped_on = state.exact_failure.as_ref().map(|(_, what)| what.clone());
    end.target_exit = finish.target_exit.clone();
    end.settle_timeouts = finish.settle_timeouts;
    end.control = finish.control.clone();
    end.roles = finish.roles.clone();
    end
}

/// How far the loop got.
struct LoopState {
    /// The planned length; `--until-decided` moves it on while the verdict is undecided.
    planned: u64,
    extensions: Vec<u64>,
    /// Iterations done.
    done: u64,
    interrupted: bool,
    /// The header's metrics, for `--stop-on-exact-failure`.
    specs: BTreeMap<String, MetricSpec>,
    /// `--stop-on-exact-failure`: the iteration the run stopped at, and what failed there.
    exact_failure: Option<(u64, String)>,
    /// `--stop-when-decided`: the run stopped once its verdict was decided.
    decided: bool,
    /// sites.jsonl, where the target records allocation sites.
    sites: SiteLog,
}

/// What fails the exact layer in one quiescent probe, if anything: a per-request registry not
/// back to zero, a bounded one over its capacity (the detector's rules, seen as they happen).
fn exact_failure(specs: &BTreeMap<String, MetricSpec>, p: &super::sink::Probe) -> Option<String> {
    specs.iter().find_map(|(name, spec)| {
        let v = *p.values.get(name)?;
        match spec.kind {
            Kind::PerRequest if v != 0.0 => Some(format!("{name} holds {v} entries with nothing in flight")),
            Kind::Bounded if spec.capacity.is_some_and(|c| v > c as f64) => {
                Some(format!("{name} at {v}, over its capacity {}", spec.capacity.unwrap_or(0)))
            }
            _ => None,
        }
    })
}

/// sites.jsonl as the run writes it: opened at the first quiescent point a target records sites
/// at. A write that fails ends the recording (said once), never the run.
struct SiteLog {
    writer: Option<plateau_sites::SitesWriter>,
    failed: bool,
}

impl SiteLog {
    /// Records the target's sites at the quiescent point of `iter` (inside the harness's scope:
    /// what recording allocates is neither the engine's heap nor a site of it).
    fn record(&mut self, target: &mut dyn Target, (iter, warmup): (u64, u64), t: f64, out_dir: &Path) {
        if self.failed {
            return;
        }
        let _harness = HarnessScope::enter();
        let Some(r) = target.sites(iter, warmup, out_dir) else { return };
        let path = out_dir.join(plateau_sites::SITES_FILE);
        let result = match &mut self.writer {
            Some(w) => w.write(iter, t, r),
            None => plateau_sites::SitesWriter::create(&path).and_then(|w| self.writer.insert(w).write(iter, t, r)),
        };
        if let Err(e) = result {
            plateau_shell::errln!("plateau: allocation sites are no longer recorded: {e}");
            self.failed = true;
        }
    }

    /// Once the run is over: the names of the sites recorded under provisional keys, and the
    /// log closed.
    fn name(&mut self, target: &mut dyn Target) {
        let Some(mut w) = self.writer.take() else { return };
        let _harness = HarnessScope::enter();
        if let Err(e) = w.names(&target.site_names()) {
            plateau_shell::errln!("plateau: allocation sites could not be named: {e}");
        }
    }
}

fn iterate(
    scenario: &Scenario,
    opts: &RunOptions,
    plan: RunPlan,
    target: &mut dyn Target,
    sink: &mut Sink,
    state: &mut LoopState,
    snapshots: &mut plateau_probes::mappings::Snapshots,
) -> Result<(), RunError> {
    let bar = (opts.progress == Progress::Bar).then(|| progress_bar(plan.limit));
    let mut last_line = Instant::now();
    let baseline = target.probe(0, true)?;
    sink.write(0, true, baseline)?;
    state.sites.record(target, (0, plan.warmup), sink.elapsed().as_secs_f64(), &opts.out_dir);
    let mut workload = Workload::new(plan.seed);
    let shape = target.shape();
    // Bounded: `planned` only moves on up to the --until-decided cap.
    let mut iter = 0;
    while iter < state.planned {
        iter += 1;
        if plan.duration.is_some_and(|dur| sink.elapsed() >= dur) {
            break;
        }
        target.begin(iter);
        for (index, phase) in scenario.phases.iter().enumerate() {
            let sends = plan::phase(&mut workload, index, phase, iter, shape);
            run_phase(scenario, index, sends, target, sink, state, iter)?;
            if opts.interrupt.load(Ordering::Relaxed) {
                break;
            }
        }
        target.quiesce(iter, sink)?;
        state.done = iter;
        // The rest of the iteration is the harness's: sampling, snapshots, progress, judging.
        let _harness = HarnessScope::enter();
        let p = target.probe(iter, true)?;
        let failed_exactly = if opts.stop_on_exact_failure { exact_failure(&state.specs, &p) } else { None };
        sink.write(iter, true, p)?;
        state.sites.record(target, (iter, plan.warmup), sink.elapsed().as_secs_f64(), &opts.out_dir);
        if iter == plan.warmup.max(1) {
            snapshots.start_iter = iter;
            snapshots.start = target.mappings();
            snapshots.set_roles(target.role_mappings(), |r| &mut r.start);
        }
        // Last in the iteration, after the harness's own bookkeeping (the mapping snapshot), so
        // that only what the target and the run keep is in the profile's difference.
        if let Some(edge) = opts.profile_window.and_then(|w| WindowEdge::at(iter, w)) {
            target.mark_window(edge, iter, &opts.out_dir)?;
        }
        show_progress(bar.as_ref(), opts.progress, (iter, state.planned), sink, &mut last_line, target.status());
        if opts.interrupt.load(Ordering::Relaxed) {
            state.interrupted = true;
            break;
        }
        if let Some(what) = failed_exactly {
            state.exact_failure = Some((iter, what));
            break;
        }
        if opts.stop_when_decided && iter < state.planned && decided_check_due(iter, plan.warmup) {
            sink.flush()?;
            if decided_at(&opts.out_dir.join("samples.jsonl"), iter)? {
                if opts.progress != Progress::Quiet {
                    plateau_shell::errln!("plateau: decided at iteration {iter}: stopping (--stop-when-decided)");
                }
                state.decided = true;
                break;
            }
        }
        if let Some(cap) = opts.until_decided.filter(|_| iter == state.planned) {
            sink.flush()?;
            if let Some(next) = undecided_until(&opts.out_dir.join("samples.jsonl"), iter, cap)? {
                if opts.progress != Progress::Quiet {
                    plateau_shell::errln!(
                        "plateau: undecided at iteration {iter}: going on to {next} (--until-decided, cap {cap})"
                    );
                }
                state.extensions.push(next);
                state.planned = next;
                if let Some(pb) = &bar {
                    pb.set_length(next);
                }
            }
        }
    }
    if let Some(pb) = bar {
        pb.finish_and_clear();
    }
    Ok(())
}

/// The progress bar moved to `iter` of `planned`, or a line every 10 s (and at the end).
fn show_progress(
    bar: Option<&indicatif::ProgressBar>,
    progress: Progress,
    (iter, planned): (u64, u64),
    sink: &Sink,
    last_line: &mut Instant,
    msg: String,
) {
    match (bar, progress) {
        (Some(pb), _) => {
            pb.set_position(iter);
            pb.set_message(msg);
        }
        (None, Progress::Lines) if last_line.elapsed() >= Duration::from_secs(10) || iter == planned => {
            plateau_shell::errln!("plateau: iteration {iter}/{planned}, {:.1} s, {msg}", sink.elapsed().as_secs_f64());
            *last_line = Instant::now();
        }
        _ => {}
    }
}

/// Runs phase `index` of iteration `iter`; a sleep the target refuses is sampled first
/// ([`sample_refused_sleep`]), the iteration then counted as done.
fn run_phase(
    scenario: &Scenario,
    index: usize,
    sends: Vec<plan::Send>,
    target: &mut dyn Target,
    sink: &mut Sink,
    state: &mut LoopState,
    iter: u64,
) -> Result<(), RunError> {
    let Err(e) = target.run_phase(scenario, iter, index, sends, sink) else { return Ok(()) };
    if matches!(scenario.phases[index], plateau_scenario::Phase::Sleep(_)) && sample_refused_sleep(target, sink, iter) {
        // Its requests were all served and it has its quiescent point.
        state.done = iter;
    }
    Err(e)
}

/// A sleep phase starts with none of the run's requests in flight, so a target that refuses it
/// (plateau serve answers 409 while it still counts requests in flight; a real server can fail
/// the same way) is sampled there once more, settled, as the quiescent point of the iteration
/// that ended: the exact layer then judges what the server kept (orphans no client holds)
/// instead of the run ending on the refusal alone. A target that cannot be sampled any more
/// adds nothing; the refusal is still how the run ended. True when the point was written.
fn sample_refused_sleep(target: &mut dyn Target, sink: &mut Sink, iter: u64) -> bool {
    if target.quiesce(iter, sink).is_err() {
        return false;
    }
    // A probe or a write that fails here adds no point; the refusal stays the run's error (a
    // sink that cannot write fails again when the run's end is written).
    target.probe(iter, true).is_ok_and(|p| sink.write(iter, true, p).is_ok())
}

fn progress_bar(limit: u64) -> indicatif::ProgressBar {
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
}

/// How often `--stop-when-decided` judges the samples so far, in iterations past the warm-up: a
/// judgement reads the whole file (tens of milliseconds for a server's hundred metrics at a few
/// hundred points), which every tenth iteration keeps under the cost of one iteration of a real
/// server.
pub const DECIDED_EVERY: u64 = 10;

/// Quiescent points past the warm-up before a verdict can be decided: the detector judges no
/// trend on fewer.
const DECIDED_MIN_POINTS: u64 = 20;

fn decided_check_due(iter: u64, warmup: u64) -> bool {
    iter >= warmup + DECIDED_MIN_POINTS && (iter - warmup) % DECIDED_EVERY == 0
}

/// Whether the samples so far, judged as a run that stopped here once decided (the one judge,
/// with the end it would record), fail with no gauge undecided.
fn decided_at(samples: &Path, iter: u64) -> Result<bool, RunError> {
    let mut s = Samples::read(samples).map_err(|e| RunError::Harness(e.to_string()))?;
    s.end = Some(RunEnd::new(EndState::Decided, iter));
    // The one judge with what the run directory holds so far (its sites among it).
    let v =
        plateau_analysis::judge_read(&s, samples, &plateau_detector::Overrides::default()).map_err(RunError::Input)?;
    Ok(v.verdict == Status::Fail && v.metrics.iter().all(|m| m.status != Status::Inconclusive))
}

/// Iterations an undecided run goes on by when no gauge says how long it needs: half its length
/// again, so that a trend's test gains about as many points as a step's spacing would need.
const UNDECIDED_GROWTH: f64 = 1.5;

/// At the planned length of a run that goes on until decided: judges the samples so far as a run
/// that ended here (the one judge, with the end it would record) and returns the length to go on
/// to (what the undecided gauges say they need, else half as long again, rounded up to 50 and at
/// most `cap`), or None when the verdict is decided or the cap is reached.
fn undecided_until(samples: &Path, planned: u64, cap: u64) -> Result<Option<u64>, RunError> {
    let mut s = Samples::read(samples).map_err(|e| RunError::Harness(e.to_string()))?;
    s.end = Some(RunEnd::new(EndState::Completed, planned));
    let v =
        plateau_analysis::judge_read(&s, samples, &plateau_detector::Overrides::default()).map_err(RunError::Input)?;
    if v.verdict != Status::Inconclusive || planned >= cap {
        return Ok(None);
    }
    let asked = v.metrics.iter().filter(|m| m.status == Status::Inconclusive).filter_map(|m| m.needs_iterations).max();
    let grown = (planned as f64 * UNDECIDED_GROWTH).ceil() as u64;
    let next = asked.unwrap_or(grown).max(planned + 1).div_ceil(50) * 50;
    Ok(Some(next.min(cap)))
}
