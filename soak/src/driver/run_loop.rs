//! The one run loop, for every target: plateau's engine, a prefill/decode pair, an HTTP server.
//!
//! A run: write the samples header, take a baseline sample, then iteration by iteration run every
//! phase (its requests planned by `plan.rs`) and reach quiescence (no request in flight anywhere),
//! take a quiescent sample, and go on until the iteration count or the duration is reached or
//! Ctrl-C arrives; `--until-decided` moves the planned length on while the verdict is undecided.
//! A run that stops on a harness error keeps what it sampled and judges it, marked incomplete:
//! growth that was conclusive before the failure (a target killed by its own leak) is the run's
//! finding. The samples are complete on disk before the verdict is drawn.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use plateau_reports::{Header, Kind, MetricSpec, Status, Verdict, SAMPLES_SCHEMA};

use super::plan;
use super::sink::Sink;
use super::target::{Target, WindowEdge};
use super::{rejudge, write_json, Progress, RunError, RunOptions, RunResult, MAX_ITERATIONS};
use crate::analysis::JudgeOptions;
use crate::arena::HarnessScope;
use crate::scenario::Scenario;
use crate::workload::Workload;

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
    let header = Header {
        schema: SAMPLES_SCHEMA.into(),
        scenario: scenario.name.clone(),
        seed: plan.seed,
        backend: target.backend(),
        metrics: target.specs(),
        warmup_iterations: Some(plan.warmup),
        injections: opts.injections.iter().map(|i| i.name().to_string()).collect(),
    };
    let mut sink = Sink::create(&samples_path, &header, plan.interval)?;
    let mut state = LoopState {
        planned: plan.limit,
        extensions: Vec::new(),
        done: 0,
        interrupted: false,
        specs: header.metrics.clone(),
        exact_failure: None,
    };
    let mut snapshots = crate::mappings::Snapshots::default();
    let outcome = iterate(scenario, opts, plan, target, &mut sink, &mut state, &mut snapshots);
    let _harness = HarnessScope::enter();
    snapshots.end_iter = state.done;
    snapshots.end = target.mappings();
    sink.flush()?;
    let wall_secs = sink.elapsed().as_secs_f64();
    drop(sink);
    let failed = outcome.as_ref().err();
    let finish = target.finish(scenario, failed);
    if let Some(t) = &finish.triggers {
        write_json(&opts.out_dir.join("triggers.json"), t)?;
    }
    if !snapshots.end.is_empty() {
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
    let incomplete = state.interrupted || failed.is_some();
    let mut verdict = match rejudge(scenario, opts, incomplete) {
        Ok(v) => v,
        Err(j) => return Err(outcome.err().unwrap_or(j)),
    };
    note_target(&mut verdict, &finish);
    if let Some(cap) = opts.until_decided {
        verdict.warnings.push(until_decided_story(plan.limit, &state.extensions, cap, &verdict));
    }
    if let Some((iter, what)) = &state.exact_failure {
        verdict.warnings.push(format!(
            "stopped at iteration {iter} of {}: {what} {}; the gauges were not judged past it",
            plan.limit,
            super::STOPPED_ON_EXACT_FAILURE
        ));
    }
    write_json(&opts.out_dir.join("verdict.json"), &verdict)?;
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
            eprintln!("plateau: {e}");
            Ok(result(verdict, true))
        }
        Err(e) => Err(match &finish.target_exit {
            Some(how) => RunError::Harness(format!("{e}; {how}")),
            None => e,
        }),
    }
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

fn iterate(
    scenario: &Scenario,
    opts: &RunOptions,
    plan: RunPlan,
    target: &mut dyn Target,
    sink: &mut Sink,
    state: &mut LoopState,
    snapshots: &mut crate::mappings::Snapshots,
) -> Result<(), RunError> {
    let bar = (opts.progress == Progress::Bar).then(|| progress_bar(plan.limit));
    let mut last_line = Instant::now();
    let baseline = target.probe(0, true)?;
    sink.write(0, true, baseline)?;
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
            target.run_phase(scenario, iter, index, sends, sink)?;
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
        if iter == plan.warmup.max(1) {
            snapshots.start_iter = iter;
            snapshots.start = target.mappings();
        }
        // Last in the iteration, after the harness's own bookkeeping (the mapping snapshot), so
        // that only what the target and the run keep is in the profile's difference.
        if let Some(edge) = opts.profile_window.and_then(|w| WindowEdge::at(iter, w)) {
            target.mark_window(edge, iter, &opts.out_dir)?;
        }
        let msg = target.status();
        match (&bar, opts.progress) {
            (Some(pb), _) => {
                pb.set_position(iter);
                pb.set_message(msg);
            }
            (None, Progress::Lines) if last_line.elapsed() >= Duration::from_secs(10) || iter == state.planned => {
                eprintln!("plateau: iteration {iter}/{}, {:.1} s, {msg}", state.planned, sink.elapsed().as_secs_f64());
                last_line = Instant::now();
            }
            _ => {}
        }
        if opts.interrupt.load(Ordering::Relaxed) {
            state.interrupted = true;
            break;
        }
        if let Some(what) = failed_exactly {
            state.exact_failure = Some((iter, what));
            break;
        }
        if let Some(cap) = opts.until_decided.filter(|_| iter == state.planned) {
            sink.flush()?;
            if let Some(next) = undecided_until(scenario, opts, &opts.out_dir.join("samples.jsonl"), iter, cap)? {
                if opts.progress != Progress::Quiet {
                    eprintln!(
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

/// What the verdict says of a target that ended before the run did, and of quiescent points
/// sampled with requests still in flight.
fn note_target(v: &mut Verdict, finish: &super::target::Finish) {
    v.target_exit = finish.target_exit.clone();
    v.settle_timeouts = finish.settle_timeouts;
    if let Some(how) = &finish.target_exit {
        let when = if v.failed() {
            "after the growth was already conclusive: the leak is the finding"
        } else {
            "before any growth was conclusive: the run could not be judged"
        };
        v.summary.push_str(&format!("; {how}, {when}"));
    }
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
