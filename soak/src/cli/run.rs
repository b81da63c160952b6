//! `plateau run`: a soak of plateau's own engine (in-process, a P/D pair in threads or processes)
//! or of a server at `--target`, then its verdict, the profiled replay that names the heap's
//! allocation sites, and the files CI reads.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use plateau_engine::{Injection, Injections};
use plateau_soak::analysis::describe;
use plateau_soak::detector::Tolerance;
use plateau_soak::driver::{self, Progress, RunError, RunOptions};
use plateau_soak::scenario::Scenario;

pub use super::external::ExternalArgs;
use super::{run_error_code, timestamp, verdict_code, CiArgs, USAGE};

// Parsed once per process: the size of `run`'s flags next to the small subcommands costs nothing.

#[derive(clap::Args)]
pub struct Args {
    scenario: String,
    /// cpu, cuda or auto (default: the scenario's).
    #[arg(long)]
    backend: Option<String>,
    /// Seed of the workload and of requests' sampling (default: the scenario's).
    #[arg(long)]
    seed: Option<u64>,
    /// Iterations to run (default: the scenario's).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=plateau_scenario::MAX_ITERATIONS), conflicts_with = "duration")]
    iterations: Option<u64>,
    /// Run for a wall-clock time instead: 90s, 10m, 2h.
    #[arg(long)]
    duration: Option<String>,
    /// While a gauge is undecided at the planned length (a staircase whose next step is not
    /// yet due, too few points), go on in steps to the length that would decide it, up to
    /// --max-iterations; a run still undecided there exits 4 saying what it saw.
    #[arg(long, conflicts_with = "duration")]
    until_decided: bool,
    /// The cap of --until-decided (default: the scenario's `[soak] max_iterations`, else four
    /// times the planned length).
    #[arg(long, requires = "until_decided", value_parser = clap::value_parser!(u64).range(1..=plateau_scenario::MAX_ITERATIONS))]
    max_iterations: Option<u64>,
    /// Switch on a leak injection (repeatable; see `plateau list`).
    #[arg(long = "inject", value_name = "NAME")]
    inject: Vec<Injection>,
    /// Switch on a plant, a must-pass cache in the engine (repeatable; see `plateau list`): a
    /// correct cache that fills and holds, which a run must pass.
    #[arg(long = "plant", value_name = "NAME")]
    plant: Vec<plateau_engine::Plant>,
    /// Output directory (default: runs/<scenario>-<time>).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Timer samples between quiescent points, in ms; 0 samples only at quiescent points.
    #[arg(long)]
    sample_interval_ms: Option<u64>,
    /// No progress output.
    #[arg(long)]
    quiet: bool,
    /// Run a prefill/decode scenario with a process per role, TCP between them.
    #[arg(long)]
    pd_processes: bool,
    /// Quiescent iterations the trend test skips (default: the scenario's, 20 unless it says).
    #[arg(long)]
    warmup: Option<u64>,
    /// Byte growth to accept, per request or per iteration: 64B/request, 1KiB/iteration, 0
    /// (default: the scenario's, else 1B/request).
    #[arg(long)]
    tolerance: Option<Tolerance>,
    /// Record the allocation sites and draw their growth (growth.txt, growth.pb.gz, growth.svg)
    /// even if nothing failed: plateau's own engine is replayed with jemalloc's profiler on
    /// every allocation (a failing or undecided heap always is); a native server plateau starts
    /// (--target --spawn) is replayed under a preloaded jemalloc (with --topology, the
    /// deployment started again with the process of the role that grew most under it). A Python
    /// server's sites are recorded by the run itself (--sites).
    #[arg(long)]
    profile: bool,
    /// The profiled replay's own side (set by plateau for the child it runs): mark the heap at
    /// quiescent points START, halfway and END.
    #[arg(long, hide = true, value_name = "START:END", value_parser = parse_window)]
    profile_window: Option<(u64, u64)>,
    /// Do not replay a failing heap under the profiler (a quick look; a shrink's candidates).
    #[arg(long, conflicts_with = "profile")]
    no_replay: bool,
    /// What to record of allocation sites as the run goes, for the verdict to name what grew
    /// (sites.jsonl): `full` (default): plateau's own heap sampled by jemalloc's profiler from the
    /// start; in a spawned Python server's processes, memray from the end of warm-up, every
    /// allocation with native frames; `heap`: in a Python server, malloc's allocations only (a
    /// fraction of the cost; Python's small objects unexplained); `off`: none.
    #[arg(long, value_name = "full|heap|off", default_value = "full")]
    sites: plateau_soak::sites::Depth,
    /// A replay's own side (set by plateau for the child it runs): record plateau's own heap by
    /// site at every quiescent point, with the profiler MALLOC_CONF started.
    #[arg(long, hide = true)]
    record_sites: bool,
    /// End the run at the first quiescent point where the exact layer fails (a per-request
    /// registry not back to zero, a bounded one over its capacity): a registry leak is decided
    /// there; the gauges are not judged past it.
    #[arg(long)]
    stop_on_exact_failure: bool,
    /// End the run once its verdict is decided: a failure with no gauge left undecided, judged
    /// every 10 iterations past the warm-up (for a target that takes seconds an iteration). A
    /// pass is decided at the planned length only, where its resolution is the run's.
    #[arg(long, conflicts_with = "until_decided")]
    stop_when_decided: bool,
    /// Growth already reported upstream, accepted only as written: a TOML file of `[[known]]`
    /// entries (process, site regex, max_per_request, reason, until). A failing gauge whose
    /// leaking sites each match an entry at or under its rate, before its date, passes naming
    /// it; a faster or expired one fails. Recorded in the run directory (known.json); for a
    /// server only (--target, --topology).
    #[arg(long, value_name = "FILE")]
    known: Option<PathBuf>,
    #[command(flatten)]
    external: ExternalArgs,
    #[command(flatten)]
    ci: CiArgs,
}

pub fn main(a: Args) -> u8 {
    let origin = a.origin();
    let Args {
        scenario,
        backend,
        seed,
        iterations,
        duration,
        until_decided,
        max_iterations,
        inject,
        plant,
        out,
        sample_interval_ms,
        quiet,
        pd_processes,
        warmup,
        tolerance,
        profile,
        profile_window,
        no_replay,
        sites,
        record_sites,
        stop_on_exact_failure,
        stop_when_decided,
        known,
        external,
        ci,
    } = a;
    let mut s = match load(&scenario, profile).and_then(|s| external.check().map(|()| s)) {
        Ok(s) => s,
        Err(code) => return code,
    };
    // A deployment's file, its ports taken now: its URL is the run's target.
    let topology = match load_topology(&external, &scenario, &inject) {
        Ok(t) => t,
        Err(code) => return code,
    };
    let target_url = external.target.clone().or_else(|| topology.as_ref().map(|t| t.url.clone()));
    // A server plateau does not run in-process warms as a real engine does: the scenario's target
    // length and warm-up, where it gives them, as a pair; a run whose length the user gives
    // (--iterations, --duration) keeps the scenario's own warm-up unless --warmup says otherwise.
    // The samples' header records what the run used.
    if target_url.is_some() && iterations.is_none() && duration.is_none() {
        s.soak = super::length::target_length(&s.soak, topology.as_ref().and_then(|t| t.soak), quiet);
    }
    let checked = super::length::decided_cap(&s, iterations, max_iterations, until_decided)
        .and_then(|cap| Ok((cap, super::known::for_run(known.as_ref(), target_url.is_some())?)));
    let (cap, known) = match checked {
        Ok(c) => c,
        Err(code) => return code,
    };
    let interrupt = interrupt_flag();
    let (out_dir, fresh_dir) = match claim_out(out, &s.name) {
        Ok(o) => o,
        Err(code) => return code,
    };
    // A replay's child writes into its own directory: only the run itself records where it ran.
    let kind = if target_url.is_some() { "external" } else { backend.as_deref().unwrap_or(&s.engine.backend) };
    let id = (seed.unwrap_or(s.soak.seed), kind, target_url.as_deref());
    let recorded = (profile_window.is_none() && !record_sites)
        .then(|| record_run(&s, &scenario, id, &origin, &out_dir, known))
        .transpose();
    let environment = match recorded {
        Ok(env) => env,
        Err(code) => return code,
    };
    let opts = RunOptions {
        iterations,
        duration,
        until_decided: until_decided.then_some(cap),
        seed,
        injections: plant.into_iter().fold(inject.into_iter().collect::<Injections>(), Injections::with_plant),
        backend,
        out_dir,
        sample_interval_ms,
        progress: if quiet { Progress::Quiet } else { Progress::detect() },
        interrupt,
        scenario_source: scenario.clone(),
        pd_processes,
        warmup,
        tolerance,
        profile_window,
        stop_on_exact_failure,
        stop_when_decided,
        sites,
        record_sites,
        profile,
    };
    let f = Finish {
        target_url: target_url.as_deref(),
        topology: topology.as_ref(),
        external: &external,
        no_replay,
        profile,
        environment: environment.as_ref(),
        ci: &ci,
    };
    execute(&s, &opts, f, fresh_dir)
}

/// Whether the run recorded the allocation sites of some process itself (sites.jsonl names one).
fn recorded_sites(dir: &std::path::Path) -> bool {
    plateau_soak::sites::SiteLog::read(&dir.join(plateau_soak::sites::SITES_FILE))
        .is_ok_and(|log| !log.processes.is_empty())
}

/// The run's directory (`--out`, else runs/NAME-TIME), claimed for this run, and whether it is
/// new: a run refused for bad input leaves no directory of its own behind (`history add runs/*`
/// must keep working), while a directory the user named and that existed stays.
fn claim_out(out: Option<PathBuf>, name: &str) -> Result<(PathBuf, bool), u8> {
    let out_dir = out.unwrap_or_else(|| PathBuf::from("runs").join(format!("{name}-{}", timestamp())));
    let out_dir = super::absolute(&out_dir, "--out")?;
    let fresh_dir = !out_dir.exists();
    if let Err(e) = plateau_soak::fsutil::claim_run_dir(&out_dir) {
        plateau_shell::errln!("plateau: --out {e}");
        return Err(USAGE);
    }
    Ok((out_dir, fresh_dir))
}

/// The scenario of `plateau run` (a shipped name or a file), and `--profile` refused where this
/// build cannot profile; bad input is said, and exit 2.
fn load(scenario: &str, profile: bool) -> Result<Scenario, u8> {
    if profile && !plateau_soak::heapprof::control::compiled_in() {
        plateau_shell::errln!(
            "plateau: --profile: this build of plateau has no heap profiling (jemalloc without `profiling`)"
        );
        return Err(USAGE);
    }
    match Scenario::load(scenario) {
        Ok((s, _)) => Ok(s),
        Err(e) => {
            plateau_shell::errln!("plateau: {e}");
            Err(USAGE)
        }
    }
}

/// Ctrl-C and SIGTERM (what `timeout` and a CI system's cancel send) set the returned flag from
/// the signal handler itself: no handler thread, whose first allocation (its arena, at a moment
/// the scheduler picks) would race the baseline sample. The run then ends as interrupted: its
/// server stopped, its verdict incomplete.
fn interrupt_flag() -> Arc<AtomicBool> {
    plateau_shell::children::stop_on_signals().unwrap_or_else(|e| {
        plateau_shell::errln!("plateau: warning: {e}: a signal will end the run without a verdict");
        Arc::new(AtomicBool::new(false))
    })
}

/// The deployment of `--topology`, its ports taken now (its URL is the run's target), or None;
/// a file that does not read is said, and exit 2.
fn load_topology(
    external: &ExternalArgs,
    scenario: &str,
    inject: &[Injection],
) -> Result<Option<plateau_soak::external::topology::Topology>, u8> {
    let Some(file) = &external.topology else { return Ok(None) };
    let exe = std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_else(|_| "plateau".into());
    let injections: Vec<String> = inject.iter().map(|i| i.name().to_string()).collect();
    let fill = plateau_soak::external::topology::Fill { plateau: &exe, scenario, injections: &injections };
    match plateau_soak::external::topology::load(file, &fill) {
        Ok(t) => Ok(Some(t)),
        Err(e) => {
            plateau_shell::errln!("plateau: {e}");
            Err(USAGE)
        }
    }
}

/// Writes what the run ran on (environment.json) and what `plateau shrink` replays of it (the
/// scenario as it was read, the command as typed) into `out_dir`; a directory that cannot be
/// written is said, and exit 2.
fn record_run(
    s: &Scenario,
    scenario: &str,
    (seed, backend, target): (u64, &str, Option<&str>),
    origin: &plateau_soak::shrink::Origin,
    out_dir: &std::path::Path,
    known: Option<(plateau_soak::sites::known::Known, String)>,
) -> Result<plateau_reports::Environment, u8> {
    if let Some((k, text)) = &known {
        super::known::record(out_dir, k, text)?;
    }
    let id = plateau_soak::environment::RunIdentity {
        version: env!("CARGO_PKG_VERSION"),
        commit: env!("PLATEAU_COMMIT"),
        source: &s.file,
        seed,
        backend,
        target,
        replay_args: replay_args(scenario, seed, origin),
    };
    let env = plateau_soak::environment::collect(s, &id);
    let text = serde_json::to_string_pretty(&env).unwrap_or_default() + "\n";
    let argv = serde_json::to_string(&std::env::args().collect::<Vec<_>>()).unwrap_or_default() + "\n";
    let write = |name: &str, bytes: &[u8]| plateau_soak::fsutil::write_atomic(&out_dir.join(name), bytes);
    if let Err(e) = std::fs::create_dir_all(out_dir)
        .and_then(|_| write("environment.json", text.as_bytes()))
        .and_then(|_| write(plateau_soak::shrink::SCENARIO_FILE, s.text.as_bytes()))
        .and_then(|_| write(plateau_soak::shrink::COMMAND_FILE, argv.as_bytes()))
    {
        plateau_shell::errln!("plateau: --out {}: {e}", out_dir.display());
        return Err(USAGE);
    }
    Ok(env)
}

/// Runs the scenario against plateau's engine or the server of `f`, then finishes the run
/// (`finish`); a run refused for bad input removes the directory it made (`fresh_dir`).
fn execute(s: &Scenario, opts: &RunOptions, f: Finish, fresh_dir: bool) -> u8 {
    let result = match f.target_url {
        Some(url) => match f.external.options(url, f.topology, opts, f.profile) {
            Ok(ext) => plateau_soak::external::run(s, opts, &ext),
            Err(code) => return code,
        },
        None => driver::run(s, opts),
    };
    match result {
        Ok(r) => finish(r, opts, f),
        // A run refused for bad input leaves no directory of its own behind.
        Err(e) if fresh_dir && matches!(e, RunError::Input(_)) => {
            let _ = std::fs::remove_dir_all(&opts.out_dir);
            run_error_code(e)
        }
        Err(e) => run_error_code(e),
    }
}

/// What a finished run's report needs beside the run: where it ran and how it was asked for.
struct Finish<'a> {
    target_url: Option<&'a str>,
    topology: Option<&'a plateau_soak::external::topology::Topology>,
    external: &'a ExternalArgs,
    no_replay: bool,
    profile: bool,
    environment: Option<&'a plateau_reports::Environment>,
    ci: &'a CiArgs,
}

/// A finished run: its failing heap replayed to name the line (unless --no-replay), its verdict
/// and figures said, the CI files written, and its exit code.
fn finish(mut r: driver::RunResult, opts: &RunOptions, f: Finish) -> u8 {
    if let Some(w) = plateau_soak::external::short_streams::warning(&r.aborts) {
        plateau_shell::errln!("plateau: warning: {w}");
    }
    let named = match f.target_url {
        _ if f.no_replay => None,
        // plateau's own engine records its sites as it runs: the verdict names them.
        None => None,
        // A server whose processes' sites the run recorded itself needs no second run.
        Some(_) if recorded_sites(&r.out_dir) => None,
        Some(url) => {
            let roles = f.topology.iter().flat_map(|t| t.processes.iter().map(|p| p.role.clone())).collect();
            let server = f.external.replay_of(url, roles, r.verdict.injections.clone());
            super::replay::server_sites(&mut r, opts, &server, f.profile)
        }
    };
    if let Some(code) = named {
        return code;
    }
    if r.aborts.invalid_accepted > 0 {
        plateau_shell::errln!(
            "plateau: the target answered 2xx to {} invalid requests it should have refused",
            r.aborts.invalid_accepted
        );
    }
    plateau_shell::err!("{}", describe(&r.verdict));
    plateau_shell::errln!(
        "plateau: {} iterations in {:.1} s ({} aborted, {} abort targets ended first, {} invalid requests refused); results in {}",
        r.iterations,
        r.wall_secs,
        r.aborts.aborted,
        r.aborts.missed,
        r.aborts.invalid_refused,
        r.out_dir.display()
    );
    if !r.triggers.is_empty() {
        plateau_shell::errln!("plateau: triggers fired: {}", plateau_soak::triggers::summary(&r.triggers));
        for t in plateau_soak::triggers::short(&r.triggers) {
            plateau_shell::errln!(
                "plateau: warning: the scenario claims {} but it fired {} time{} (fewer than {}): too few to be sure a leak on that path would show",
                t.trigger,
                t.fired,
                if t.fired == 1 { "" } else { "s" },
                plateau_soak::triggers::MIN_FIRED
            );
        }
    }
    let replay = plateau_reports::replay_command(&r.verdict, f.environment);
    let run = plateau_reports::ci::RunRef {
        verdict: &r.verdict,
        dir: r.out_dir.display().to_string(),
        replay: Some(replay.clone()),
    };
    if let Err(code) = f.ci.write(&[run]) {
        return code;
    }
    if r.verdict.failed() {
        plateau_shell::errln!("plateau: reproduce with: {replay}");
    } else if r.interrupted {
        plateau_shell::errln!("plateau: interrupted: the verdict is incomplete (nothing here is a pass)");
    } else if r.verdict.inconclusive() {
        plateau_shell::errln!(
            "plateau: inconclusive: too little evidence to judge; run longer (nothing here is a pass)"
        );
    }
    verdict_code(&r.verdict)
}

/// The arguments that shaped a run, as its replay repeats them: the scenario as given, the seed
/// it ran with, and every flag [`Args::origin`] keeps (backend, warm-up, tolerance, timer,
/// injections, P/D processes, the target's settings), then the target and its command.
fn replay_args(scenario: &str, seed: u64, origin: &plateau_soak::shrink::Origin) -> Vec<String> {
    let mut args = vec![scenario.to_string(), "--seed".into(), seed.to_string()];
    args.extend(origin.flags.iter().cloned());
    if let Some(t) = &origin.target {
        args.extend(["--target".into(), t.clone()]);
    }
    if let Some(s) = &origin.spawn {
        args.extend(["--spawn".into(), s.clone()]);
    }
    args
}

/// "A:B", two iterations.
fn parse_window(s: &str) -> Result<(u64, u64), String> {
    let (a, b) = s.split_once(':').ok_or_else(|| format!("`{s}`: write START:END"))?;
    let n = |t: &str| t.trim().parse::<u64>().map_err(|_| format!("`{t}` is not an iteration"));
    let (a, b) = (n(a)?, n(b)?);
    if a >= b {
        return Err(format!("`{s}`: START must come before END"));
    }
    Ok((a, b))
}

impl Args {
    /// What `plateau shrink` replays of this run: its scenario and seed, the flags that shape it
    /// (backend, injections, warm-up, tolerance, sampling, the target's settings) and the target.
    pub fn origin(&self) -> plateau_soak::shrink::Origin {
        let mut flags = Vec::new();
        let mut flag = |name: &str, value: Option<String>| {
            if let Some(v) = value {
                flags.extend([name.to_string(), v]);
            }
        };
        flag("--backend", self.backend.clone());
        flag("--warmup", self.warmup.map(|w| w.to_string()));
        flag("--tolerance", self.tolerance.map(|t| t.to_string()));
        flag("--sample-interval-ms", self.sample_interval_ms.map(|ms| ms.to_string()));
        for i in &self.inject {
            flag("--inject", Some(i.name().to_string()));
        }
        for p in &self.plant {
            flag("--plant", Some(p.name().to_string()));
        }
        if self.pd_processes {
            flags.push("--pd-processes".into());
        }
        self.external.origin(&self.scenario, &self.inject, flags)
    }
}
