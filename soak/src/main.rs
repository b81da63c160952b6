//! The `plateau` command. Exit codes, for every subcommand: 0 pass; 1 growth or leak detected;
//! 2 usage or input error; 3 the engine or the harness itself failed; 4 inconclusive (too little
//! evidence to judge).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use plateau_engine::{Injection, Injections};
use plateau_soak::analysis::{describe, judge_file, write_outputs, JudgeOptions};
use plateau_soak::detector::Tolerance;
use plateau_soak::driver::{self, Progress, RunError, RunOptions};
use plateau_soak::scenario::{Scenario, SHIPPED};

const PASS: u8 = 0;
const LEAK: u8 = 1;
const USAGE: u8 = 2;
const HARNESS: u8 = 3;
const INCONCLUSIVE: u8 = 4;

/// The exit code of a verdict: fail 1, inconclusive 4, pass 0.
fn verdict_code(v: &plateau_reports::Verdict) -> u8 {
    v.exit_code()
}

#[derive(Parser)]
#[command(
    name = "plateau",
    version,
    about = "Soak-test an LLM inference engine and fail on memory growth that does not level off",
    long_about = "plateau drives its engine through a scenario script, again and again, samples jemalloc, \
the kernel's view of the process and every engine registry, and fails the run on growth that does \
not level off.\n\nExit codes: 0 pass; 1 growth or leak detected; 2 usage or input error; \
3 the engine or the harness itself failed; 4 inconclusive (too little evidence to judge: a run \
too short for its warm-up, a metric with no quiescent values). Nothing unjudged passes."
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

/// Files for CI systems, written beside the usual outputs (each whole or not at all).
#[derive(clap::Args, Default)]
struct CiArgs {
    /// Write GitHub's job-summary markdown here (verdict, a table of failing metrics, links, the
    /// replay command); point it at $GITHUB_STEP_SUMMARY in a workflow.
    #[arg(long, value_name = "FILE", help_heading = "CI outputs")]
    summary_md: Option<PathBuf>,
    /// Write JUnit XML here: a testsuite per run, its verdict and a testcase per judged metric.
    #[arg(long, value_name = "FILE", help_heading = "CI outputs")]
    junit: Option<PathBuf>,
}

impl CiArgs {
    /// Writes the files asked for; an unwritable one is the user's (exit 2).
    fn write(&self, runs: &[plateau_reports::ci::RunRef]) -> Result<(), u8> {
        self.write_texts(|| plateau_reports::ci::summary_markdown(runs), || plateau_reports::ci::junit(runs))
    }

    /// The same for a list of checks (selftest's cases).
    fn write_checks(&self, title: &str, checks: &[plateau_reports::ci::Check]) -> Result<(), u8> {
        self.write_texts(
            || plateau_reports::ci::checks_markdown(title, checks),
            || plateau_reports::ci::checks_junit("selftest", checks),
        )
    }

    fn write_texts(&self, md: impl Fn() -> String, xml: impl Fn() -> Result<String, String>) -> Result<(), u8> {
        let write = |path: &Path, text: &str| {
            plateau_soak::analysis::write_atomic(path, text.as_bytes()).map_err(|e| {
                eprintln!("plateau: {}: {e}", path.display());
                USAGE
            })
        };
        if let Some(p) = &self.summary_md {
            write(p, &md())?;
        }
        if let Some(p) = &self.junit {
            let text = xml().map_err(|e| {
                eprintln!("plateau: --junit: {e}");
                HARNESS
            })?;
            write(p, &text)?;
        }
        Ok(())
    }
}

/// Soak a server plateau did not start in-process: see README, "Soak your own server".
#[derive(clap::Args)]
struct ExternalArgs {
    /// Send the scenario's requests to this OpenAI-compatible server (http://HOST:PORT) instead of
    /// plateau's own engine; its /metrics is scraped and its processes probed (--pid, --spawn).
    #[arg(long, value_name = "URL", help_heading = "External target")]
    target: Option<String>,
    /// The server's process id: it and its descendants are probed (memory, mappings, fds,
    /// threads, GPU memory).
    #[arg(long, requires = "target", conflicts_with = "spawn", help_heading = "External target")]
    pid: Option<i32>,
    /// Start the server with this shell command, wait until it answers, stop it at the end (and
    /// on Ctrl-C); its output goes to target.log in the run directory.
    #[arg(long, value_name = "CMD", requires = "target", help_heading = "External target")]
    spawn: Option<String>,
    /// A TOML file mapping the server's Prometheus metrics to kinds (added to the built-in
    /// rules for vLLM, SGLang, llama.cpp and plateau serve).
    #[arg(long, value_name = "FILE", requires = "target", help_heading = "External target")]
    metrics_map: Option<PathBuf>,
    /// Requests in flight at most.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=4096), help_heading = "External target")]
    concurrency: u64,
    /// Seconds the server may take to answer `GET /v1/models` (a spawned one: to start and
    /// answer); past it the run stops with exit 3.
    #[arg(long, default_value_t = 600, help_heading = "External target")]
    ready_timeout_s: u64,
    /// Milliseconds to wait, after the last request, for the server's in-flight gauges to read zero.
    #[arg(long, default_value_t = 10_000, help_heading = "External target")]
    settle_timeout_ms: u64,
    /// Seconds one request may take.
    #[arg(long, default_value_t = 300, help_heading = "External target")]
    request_timeout_s: u64,
}

// Parsed once per process: the size of `run`'s flags next to the small subcommands costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Cmd {
    /// Run a soak: SCENARIO is a .toml file or the name of a shipped scenario (see `plateau list`).
    Run {
        scenario: String,
        /// cpu, cuda or auto (default: the scenario's).
        #[arg(long)]
        backend: Option<String>,
        /// Seed of the workload and of requests' sampling (default: the scenario's).
        #[arg(long)]
        seed: Option<u64>,
        /// Iterations to run (default: the scenario's).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..), conflicts_with = "duration")]
        iterations: Option<u64>,
        /// Run for a wall-clock time instead: 90s, 10m, 2h.
        #[arg(long)]
        duration: Option<String>,
        /// While a gauge is undecided at the planned length (a staircase whose next step is not
        /// yet due, too few points), go on in steps to the length that would decide it, up to
        /// --max-iterations; a run still undecided there exits 4 saying what it saw. Not yet with
        /// --target.
        #[arg(long, conflicts_with = "duration")]
        until_decided: bool,
        /// The cap of --until-decided (default: the scenario's `[soak] max_iterations`, else four
        /// times the planned length).
        #[arg(long, requires = "until_decided", value_parser = clap::value_parser!(u64).range(1..))]
        max_iterations: Option<u64>,
        /// Switch on a leak injection (repeatable; see `plateau list`).
        #[arg(long = "inject", value_name = "NAME")]
        inject: Vec<Injection>,
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
        /// Replay the run with jemalloc's heap profiler and name the allocation sites of its heap
        /// growth (growth.txt, growth.pb.gz, growth.svg), even if the heap did not fail. A heap
        /// that fails is always replayed.
        #[arg(long)]
        profile: bool,
        /// The profiled replay's own side (set by plateau for the child it runs): activate the
        /// heap profiler at quiescent point START and dump the live heap there and at END.
        #[arg(long, hide = true, value_name = "START:END", value_parser = parse_window)]
        profile_window: Option<(u64, u64)>,
        #[command(flatten)]
        external: ExternalArgs,
        #[command(flatten)]
        ci: CiArgs,
    },
    /// Serve plateau's engine over an OpenAI-compatible HTTP API (/v1/completions,
    /// /v1/chat/completions with images, n, streaming; /v1/models, /health, /metrics), so that
    /// `run --target` can be tested against a server whose leaks are known.
    Serve {
        /// The scenario whose [engine] section configures the engine (a .toml file or a shipped
        /// name; default n-sampling: the tiny preset on the cpu backend).
        #[arg(default_value = "n-sampling")]
        scenario: String,
        /// A model preset instead of the scenario's (see `plateau list`).
        #[arg(long)]
        preset: Option<String>,
        /// Port to listen on (0 picks a free one; the address is printed).
        #[arg(long, default_value_t = 8000)]
        port: u16,
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        /// cpu, cuda or auto (default: the scenario's).
        #[arg(long)]
        backend: Option<String>,
        /// Engine seed (requests without a seed draw from it).
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Switch on a leak injection in the served engine (repeatable; see `plateau list`).
        #[arg(long = "inject", value_name = "NAME")]
        inject: Vec<Injection>,
    },
    /// Serve one engine of a prefill/decode pair over TCP (started by `run --pd-processes`).
    Node {
        /// prefill or decode.
        #[arg(long)]
        role: String,
        /// Address to listen on, such as 127.0.0.1:0 (the bound address is printed first).
        #[arg(long)]
        listen: String,
        /// The scenario whose engine section configures this engine.
        #[arg(long)]
        scenario: String,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[arg(long = "inject", value_name = "NAME")]
        inject: Vec<Injection>,
        /// Decode role: the prefill node's address, to pull KV from.
        #[arg(long)]
        peer: Option<String>,
    },
    /// Run the detector alone on a samples.jsonl file (from plateau or anything writing v1).
    Analyze {
        samples: PathBuf,
        /// Where to write verdict.json and plots (default: next to the samples).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Quiescent iterations to skip before trend tests (default: the header's, else 20).
        #[arg(long)]
        warmup: Option<u64>,
        /// Byte growth to accept, per request or per iteration: 64B/request, 1KiB/iteration, 0
        /// (default 1B/request).
        #[arg(long)]
        tolerance: Option<Tolerance>,
        #[command(flatten)]
        ci: CiArgs,
    },
    /// List the shipped scenarios and the leak injections.
    List,
    /// Prove the harness's power: every injection caught, every clean scenario passing.
    Selftest {
        /// Shorter injected runs (each to its detection, a few iterations past it); clean
        /// scenarios still run at their full length. About 4 minutes on 2 cores.
        #[arg(long)]
        quick: bool,
        /// Keep the runs in this directory (default: a temporary one, removed on success).
        #[arg(long)]
        keep: Option<PathBuf>,
        #[command(flatten)]
        ci: CiArgs,
    },
    /// Tell the story of a run: what grew, how fast, since when, where (allocation sites, the
    /// mapping, registry insertion sites), and how to replay it.
    Explain {
        /// A directory written by `plateau run` (verdict.json and samples.jsonl; growth.json,
        /// residues.json and mappings.json where the run wrote them).
        run_dir: PathBuf,
    },
    /// Redraw a run's verdict, plots and report.html from its samples, optionally against a
    /// baseline run (an earlier night): the change of level and slope per metric. Exits with the
    /// run's verdict code.
    Report {
        run_dir: PathBuf,
        /// A run directory to compare with (another scenario's is compared where comparable).
        #[arg(long)]
        baseline: Option<PathBuf>,
    },
    /// Runs across nights in an SQLite database: add runs, show the trend, check for regressions.
    History {
        #[command(subcommand)]
        cmd: HistoryCmd,
    },
}

#[derive(Subcommand)]
enum HistoryCmd {
    /// Store run directories (header, environment, verdict, per-metric level and slope); a run
    /// already stored is skipped. All or nothing: every directory is read before any is stored.
    Add {
        #[arg(required = true, value_name = "RUN_DIR")]
        run_dirs: Vec<PathBuf>,
        /// The history database, SQLite (created if missing).
        #[arg(long)]
        db: PathBuf,
    },
    /// Print the trend across nights (markdown tables) and write an HTML page of it.
    Show {
        /// The history database, SQLite.
        #[arg(long)]
        db: PathBuf,
        /// Only this scenario.
        #[arg(long)]
        scenario: Option<String>,
        /// Only this metric, night by night (default: every gauge, first and last night).
        #[arg(long)]
        metric: Option<String>,
        /// Only the last N nights of each scenario (0: all).
        #[arg(long, default_value_t = 0)]
        last: usize,
        /// Where to write the HTML page (default: beside the database, DB.html).
        #[arg(long)]
        html: Option<PathBuf>,
    },
    /// Judge each scenario's nights as a series from its baseline night (`pin`, else its first
    /// passing night): exit 1 when a gauge's level jumped more than the tolerance above every
    /// night since the baseline, or creeps (a significant rise over 4 or more nights) to more than
    /// the tolerance above the baseline, or its slope passed the steepest of the last N passing
    /// nights by more than the run resolves; 4 when no scenario has a night to compare.
    Check {
        /// The history database, SQLite.
        #[arg(long)]
        db: PathBuf,
        /// Only this scenario.
        #[arg(long)]
        scenario: Option<String>,
        /// Passing nights whose slopes the latest is compared with.
        #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u64).range(1..=365))]
        last: u64,
        /// Allowed rise of a gauge's level, in percent: above the highest night since the
        /// baseline (a jump), or above the baseline (a creep).
        #[arg(long, default_value_t = 10.0)]
        level_tolerance_pct: f64,
    },
    /// Make a stored run (a complete passing night) the baseline its scenario's later nights are
    /// measured from; it replaces the scenario's earlier pin.
    Pin {
        #[arg(value_name = "RUN_DIR")]
        run_dir: PathBuf,
        /// The history database, SQLite.
        #[arg(long)]
        db: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match std::panic::catch_unwind(move || dispatch(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(_) => {
            eprintln!("plateau: internal error (see the message above); this is a bug in plateau");
            ExitCode::from(HARNESS)
        }
    }
}

fn dispatch(cli: Cli) -> u8 {
    match cli.command {
        Cmd::Node { role, listen, scenario, seed, inject, peer } => node(&role, &listen, &scenario, seed, inject, peer),
        Cmd::Run {
            scenario,
            backend,
            seed,
            iterations,
            duration,
            until_decided,
            max_iterations,
            inject,
            out,
            sample_interval_ms,
            quiet,
            pd_processes,
            warmup,
            tolerance,
            profile,
            profile_window,
            external,
            ci,
        } => {
            if profile && !plateau_soak::heapprof::control::compiled_in() {
                eprintln!(
                    "plateau: --profile: this build of plateau has no heap profiling (jemalloc without `profiling`)"
                );
                return USAGE;
            }
            let (s, _) = match Scenario::load(&scenario) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("plateau: {e}");
                    return USAGE;
                }
            };
            let planned = iterations.unwrap_or(s.soak.iterations);
            let cap = max_iterations.unwrap_or_else(|| s.soak.until_decided_cap(planned));
            if until_decided && cap < planned {
                eprintln!("plateau: --max-iterations {cap} is below the run's planned length ({planned} iterations)");
                return USAGE;
            }
            if until_decided && external.target.is_some() {
                eprintln!("plateau: --until-decided: not yet available with --target (plateau's own engine only); give --iterations");
                return USAGE;
            }
            let interrupt = Arc::new(AtomicBool::new(false));
            // Ctrl-C sets the flag from the signal handler itself: no handler thread, whose first
            // allocation (its arena, at a moment the scheduler picks) would race the baseline sample.
            if let Err(e) = signal_hook::flag::register(signal_hook::consts::SIGINT, Arc::clone(&interrupt)) {
                eprintln!("plateau: warning: Ctrl-C will end the run without a verdict: {e}");
            }
            let out_dir = out.unwrap_or_else(|| PathBuf::from("runs").join(format!("{}-{}", s.name, timestamp())));
            // A run refused for bad input leaves no directory of its own behind (`history add
            // runs/*` must keep working); a directory the user named and that existed stays.
            let fresh_dir = !out_dir.exists();
            if profile_window.is_none() {
                // The profiled replay's child writes into its own directory: only the run itself
                // records where it ran.
                let id = plateau_soak::environment::RunIdentity {
                    version: env!("CARGO_PKG_VERSION"),
                    commit: env!("PLATEAU_COMMIT"),
                    source: &s.file,
                    seed: seed.unwrap_or(s.soak.seed),
                    backend: if external.target.is_some() {
                        "external"
                    } else {
                        backend.as_deref().unwrap_or(&s.engine.backend)
                    },
                    target: external.target.as_deref(),
                };
                let env = plateau_soak::environment::collect(&s, &id);
                let text = serde_json::to_string_pretty(&env).unwrap_or_default() + "\n";
                if let Err(e) = std::fs::create_dir_all(&out_dir).and_then(|_| {
                    plateau_soak::analysis::write_atomic(&out_dir.join("environment.json"), text.as_bytes())
                }) {
                    eprintln!("plateau: --out {}: {e}", out_dir.display());
                    return USAGE;
                }
            }
            let opts_out_dir = out_dir.clone();
            let opts = RunOptions {
                iterations,
                duration,
                until_decided: until_decided.then_some(cap),
                seed,
                injections: inject.into_iter().collect::<Injections>(),
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
            };
            let result = match &external.target {
                Some(url) => {
                    if profile || pd_processes || opts.backend.is_some() {
                        eprintln!(
                            "plateau: --target: --profile, --pd-processes and --backend apply to plateau's own engine only"
                        );
                        return USAGE;
                    }
                    if opts.sample_interval_ms.is_some_and(|ms| ms > 0) {
                        eprintln!("plateau: --target: a server is sampled at quiescent points only (no timer samples); drop --sample-interval-ms");
                        return USAGE;
                    }
                    let ext = plateau_soak::external::ExternalOptions {
                        url: url.clone(),
                        pid: external.pid,
                        spawn: external.spawn.clone(),
                        metrics_map: external.metrics_map.clone(),
                        concurrency: external.concurrency as usize,
                        ready_timeout: std::time::Duration::from_secs(external.ready_timeout_s),
                        settle_timeout: std::time::Duration::from_millis(external.settle_timeout_ms),
                        request_timeout: std::time::Duration::from_secs(external.request_timeout_s),
                    };
                    plateau_soak::external::run(&s, &opts, &ext)
                }
                None => driver::run(&s, &opts),
            };
            match result {
                Ok(mut r) => {
                    if external.target.is_none() {
                        if let Some(code) = heap_sites(&mut r, &s, &opts, profile) {
                            return code;
                        }
                    }
                    if r.aborts.invalid_accepted > 0 {
                        eprintln!(
                            "plateau: the target answered 2xx to {} invalid requests it should have refused",
                            r.aborts.invalid_accepted
                        );
                    }
                    eprint!("{}", describe(&r.verdict));
                    eprintln!(
                        "plateau: {} iterations in {:.1} s ({} aborted, {} abort targets ended first, {} invalid requests refused); results in {}",
                        r.iterations,
                        r.wall_secs,
                        r.aborts.aborted,
                        r.aborts.missed,
                        r.aborts.invalid_refused,
                        r.out_dir.display()
                    );
                    if !r.triggers.is_empty() {
                        eprintln!("plateau: triggers fired: {}", plateau_soak::triggers::summary(&r.triggers));
                        for t in plateau_soak::triggers::short(&r.triggers) {
                            eprintln!(
                                "plateau: warning: the scenario claims {} but it fired {} times (fewer than {}): a leak on that path could not be seen",
                                t.trigger,
                                t.fired,
                                plateau_soak::triggers::MIN_FIRED
                            );
                        }
                    }
                    let mut inj: String = r.verdict.injections.iter().map(|i| format!(" --inject {i}")).collect();
                    if let Some(url) = &external.target {
                        inj.push_str(&format!(" --target {url}"));
                        match (&external.spawn, external.pid) {
                            (Some(cmd), _) => inj.push_str(&format!(" --spawn {cmd:?}")),
                            (None, Some(pid)) => inj.push_str(&format!(" --pid {pid}")),
                            (None, None) => {}
                        }
                    }
                    let replay =
                        format!("plateau run {scenario} --seed {} --iterations {}{inj}", r.verdict.seed, r.iterations);
                    let run = plateau_reports::ci::RunRef {
                        verdict: &r.verdict,
                        dir: r.out_dir.display().to_string(),
                        replay: Some(replay.clone()),
                    };
                    if let Err(code) = ci.write(&[run]) {
                        return code;
                    }
                    if r.verdict.failed() {
                        eprintln!("plateau: reproduce with: {replay}");
                        LEAK
                    } else if r.interrupted {
                        eprintln!("plateau: interrupted: the verdict is incomplete");
                        HARNESS
                    } else {
                        if r.verdict.inconclusive() {
                            eprintln!("plateau: inconclusive: too little evidence to judge; run longer (nothing here is a pass)");
                        }
                        verdict_code(&r.verdict)
                    }
                }
                Err(e) => {
                    if fresh_dir && matches!(e, RunError::Input(_)) {
                        let _ = std::fs::remove_dir_all(&opts_out_dir);
                    }
                    run_error_code(e)
                }
            }
        }
        Cmd::Analyze { samples, out, warmup, tolerance, ci } => {
            let o = JudgeOptions { warmup, tolerance, tolerance_explicit: tolerance.is_some(), incomplete: false };
            let (s, v) = match judge_file(&samples, &o) {
                Ok(x) => x,
                Err(e) => {
                    eprintln!("plateau: {e}");
                    return USAGE;
                }
            };
            let dir = out.unwrap_or_else(|| samples.parent().map(Path::to_path_buf).unwrap_or_default());
            if let Err(e) = write_outputs(&dir, &s, &v) {
                // The output directory is the user's: one that cannot be written is bad input.
                eprintln!("plateau: --out {}: {e}", dir.display());
                return USAGE;
            }
            eprint!("{}", describe(&v));
            let run = plateau_reports::ci::RunRef { verdict: &v, dir: dir.display().to_string(), replay: None };
            if let Err(code) = ci.write(&[run]) {
                return code;
            }
            verdict_code(&v)
        }
        Cmd::List => {
            println!("scenarios:");
            for (name, text) in SHIPPED {
                let d = Scenario::parse(text, name).map(|s| s.description).unwrap_or_else(|e| e.to_string());
                println!("  {name:<28} {d}");
            }
            println!("injections:");
            for i in Injection::ALL {
                println!("  {:<28} {}", i.name(), i.description());
            }
            PASS
        }
        Cmd::Selftest { quick, keep, ci } => {
            let exe = match std::env::current_exe() {
                Ok(e) => e,
                Err(e) => {
                    eprintln!("plateau: cannot find my own binary: {e}");
                    return HARNESS;
                }
            };
            let root = keep
                .clone()
                .unwrap_or_else(|| std::env::temp_dir().join(format!("plateau-selftest-{}", std::process::id())));
            let probe = root.join(".writable");
            if let Err(e) = std::fs::create_dir_all(&root).and_then(|_| std::fs::write(&probe, b"")) {
                eprintln!("plateau: --keep {}: {e}", root.display());
                return USAGE;
            }
            let _ = std::fs::remove_file(&probe);
            let checks = match plateau_soak::selftest::run(quick, &exe, &root) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("plateau: {e}");
                    return HARNESS;
                }
            };
            if let Err(code) = ci.write_checks("plateau selftest", &checks) {
                return code;
            }
            match checks.iter().filter(|c| c.problem.is_some()).count() {
                0 => {
                    if keep.is_none() {
                        let _ = std::fs::remove_dir_all(&root);
                    }
                    PASS
                }
                _ => {
                    eprintln!("plateau: selftest failed; runs kept in {}", root.display());
                    LEAK
                }
            }
        }
        Cmd::Report { run_dir, baseline } => report(&run_dir, baseline.as_deref()),
        Cmd::Serve { scenario, preset, port, host, backend, seed, inject } => {
            let (mut s, _) = match Scenario::load(&scenario) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("plateau: {e}");
                    return USAGE;
                }
            };
            if let Some(p) = preset {
                if let Err(e) = plateau_engine::ModelConfig::preset(&p) {
                    eprintln!("plateau: --preset: {e}");
                    return USAGE;
                }
                s.engine.preset = p;
            }
            let opts = plateau_soak::serve::ServeOptions {
                backend,
                seed,
                injections: inject.into_iter().collect(),
                host,
                port,
            };
            match plateau_soak::serve::serve(&s, &opts) {
                Ok(()) => PASS,
                Err(e) => run_error_code(e),
            }
        }
        Cmd::History { cmd } => history(cmd),
        Cmd::Explain { run_dir } => match plateau_soak::explain::explain(&run_dir) {
            Ok(story) => {
                print!("{story}");
                PASS
            }
            Err(e) => {
                eprintln!("plateau: {e}");
                USAGE
            }
        },
    }
}

/// Prints why a run could not produce a verdict; its exit code: bad input 2, the harness 3.
fn run_error_code(e: RunError) -> u8 {
    eprintln!("plateau: {e}");
    match e {
        RunError::Input(_) => USAGE,
        RunError::Harness(_) => HARNESS,
    }
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

/// Iterations a profiled replay profiles after warm-up, unless the growth became conclusive later
/// (then up to that iteration, so a late onset is inside the window): enough for a per-iteration
/// figure at the byte, while sampling every allocation costs the replay several times a plain run.
const REPLAY_ITERATIONS: u64 = 40;

/// After a run whose heap failed (or with --profile), the profiled replay that names where it
/// grew; then the verdict is drawn again with the sites. Some(exit code) when the replay could not
/// be run (the run's verdict stays written) or the growth is in another process.
fn heap_sites(r: &mut driver::RunResult, s: &Scenario, opts: &RunOptions, profile: bool) -> Option<u8> {
    if opts.profile_window.is_some() || r.interrupted {
        return None;
    }
    // A node process's heap (`decode.jemalloc.allocated`) is not replayed: the verdict says so
    // (analysis::note_node_heaps).
    let heap = r.verdict.metrics.iter().find(|m| m.name == "jemalloc.allocated")?;
    if !(profile || heap.status == plateau_reports::Status::Fail) {
        return None;
    }
    let start = r.verdict.warmup_iterations.max(1);
    let end = r.iterations.min((start + REPLAY_ITERATIONS).max(heap.first_iter.unwrap_or(0)));
    if end <= start {
        eprintln!("plateau: no profiled replay: the run ended within its warm-up");
        return None;
    }
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("plateau: the profiled replay cannot find this binary: {e}");
            return Some(HARNESS);
        }
    };
    let injections: Vec<String> = r.verdict.injections.clone();
    let spec = plateau_soak::heapprof::replay::ReplaySpec {
        exe: &exe,
        scenario: &opts.scenario_source,
        seed: r.verdict.seed,
        injections: &injections,
        start_iter: start,
        end_iter: end,
        run_dir: &r.out_dir,
        metric: "jemalloc.allocated",
        run_bytes_per_iter: heap.trend.as_ref().map_or(0.0, |t| t.slope_per_iter),
        requests_per_iter: r.verdict.requests_per_iter,
    };
    eprintln!("plateau: profiling a replay of iterations {start}..{end} for the heap's allocation sites");
    if let Err(e) = spec.run() {
        eprint!("{}", describe(&r.verdict));
        eprintln!("plateau: {e}; the run's verdict is in {}", r.out_dir.display());
        return Some(HARNESS);
    }
    match driver::rejudge(s, opts, r.interrupted) {
        Ok(v) => {
            r.verdict = v;
            None
        }
        Err(e) => {
            eprintln!("plateau: {e}");
            Some(HARNESS)
        }
    }
}

fn node(role: &str, listen: &str, scenario: &str, seed: u64, inject: Vec<Injection>, peer: Option<String>) -> u8 {
    let run = || -> Result<(), (u8, String)> {
        let role = plateau_soak::pd::node::parse_role(role).map_err(|m| (USAGE, m))?;
        // The address is the user's: one that does not parse, resolve or bind is bad input.
        let listener = std::net::TcpListener::bind(listen).map_err(|e| (USAGE, format!("--listen {listen}: {e}")))?;
        let (s, _) = Scenario::load(scenario).map_err(|e| (USAGE, e.to_string()))?;
        let pd = s.pd.clone().ok_or((USAGE, format!("{scenario}: no [pd] section")))?;
        let injections: Injections = inject.into_iter().collect();
        let leak = injections.on(Injection::PdMmapHook);
        let mut engine = driver::build_engine(&s, "cpu", injections, seed).map_err(|e| (USAGE, e.to_string()))?;
        let id = if role == plateau_engine::Role::Prefill { 1 } else { 2 };
        engine.set_role(role, id, pd.kv_transfer_timeout_ms);
        plateau_soak::pd::node::serve(engine, listener, peer, leak, pd.regions).map_err(|m| (HARNESS, m))
    };
    match run() {
        Ok(()) => PASS,
        Err((code, m)) => {
            eprintln!("plateau node: {m}");
            code
        }
    }
}

fn report(run_dir: &Path, baseline: Option<&Path>) -> u8 {
    let load = |dir: &Path| judge_file(&dir.join("samples.jsonl"), &JudgeOptions::default());
    let (s, v) = match load(run_dir) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("plateau: {e}");
            return USAGE;
        }
    };
    let base = match baseline.map(|b| load(b).map(|(samples, verdict)| (b, samples, verdict))).transpose() {
        Ok(x) => x.map(|(b, samples, verdict)| plateau_soak::analysis::BaselineRun {
            dir: b.to_path_buf(),
            samples,
            verdict,
        }),
        Err(e) => {
            eprintln!("plateau: --baseline: {e}");
            return USAGE;
        }
    };
    if let Err(e) = plateau_soak::analysis::write_outputs_against(run_dir, &s, &v, base.as_ref()) {
        eprintln!("plateau: {}: cannot write the report: {e}", run_dir.display());
        return USAGE;
    }
    print!("{}", describe(&v));
    if let Some(b) = &base {
        if b.verdict.scenario != v.scenario {
            println!(
                "note: the baseline ran scenario {}, this run {}: only the metrics both have are compared",
                b.verdict.scenario, v.scenario
            );
        }
        let now = plateau_reports::figures::of_run(&s, &v);
        let then = plateau_reports::figures::of_run(&b.samples, &b.verdict);
        println!(
            "{:<36} {:>14} {:>14} {:>16} {:>16}",
            "metric (against the baseline)", "level then", "level now", "slope/it then", "slope/it now"
        );
        for n in now.iter().filter(|n| n.kind == plateau_reports::Kind::Gauge) {
            let Some(t) = then.iter().find(|t| t.name == n.name) else { continue };
            let f = |x: Option<f64>| x.map(|x| plateau_reports::figures::fmt_value(x, &n.unit)).unwrap_or("-".into());
            println!(
                "{:<36} {:>14} {:>14} {:>16} {:>16}",
                n.name,
                f(t.level),
                f(n.level),
                f(t.slope_per_iter),
                f(n.slope_per_iter)
            );
        }
    }
    println!("report: {}", run_dir.join("report.html").display());
    verdict_code(&v)
}

/// `plateau history ...`: exit 0, 1 (a regression), 2 (bad input), 3 (cannot write), 4 (nothing
/// to compare).
fn history(cmd: HistoryCmd) -> u8 {
    use plateau_soak::history::{self, HistoryError};
    let code = |e: HistoryError| match e {
        HistoryError::Input(m) => {
            eprintln!("plateau: history: {m}");
            USAGE
        }
        HistoryError::Harness(m) => {
            eprintln!("plateau: history: {m}");
            HARNESS
        }
    };
    match cmd {
        HistoryCmd::Add { run_dirs, db } => {
            let runs = match run_dirs.iter().map(|d| history::store::read_run(d)).collect::<Result<Vec<_>, _>>() {
                Ok(r) => r,
                Err(e) => return code(e),
            };
            let added = history::open(&db, true)
                .and_then(|mut c| history::store::add(&mut c, &db, &runs, &plateau_soak::environment::utc_now()));
            match added {
                Ok(n) => {
                    println!("history: {n} runs added to {} ({} already there)", db.display(), runs.len() - n);
                    PASS
                }
                Err(e) => code(e),
            }
        }
        HistoryCmd::Show { db, scenario, metric, last, html } => {
            let f = history::show::ShowFilter { scenario, metric, last };
            let page = html.unwrap_or_else(|| db.with_extension("html"));
            let out = history::open(&db, false).and_then(|c| {
                let md = history::show::markdown(&c, &db, &f)?;
                let h = history::show::html(&c, &db, &f)?;
                Ok((md, h))
            });
            match out {
                Ok((md, h)) => {
                    print!("{md}");
                    if let Err(e) = plateau_soak::analysis::write_atomic(&page, h.as_bytes()) {
                        eprintln!("plateau: history: --html {}: {e}", page.display());
                        return USAGE;
                    }
                    eprintln!("history: page written to {}", page.display());
                    PASS
                }
                Err(e) => code(e),
            }
        }
        HistoryCmd::Pin { run_dir, db } => {
            let pinned = history::store::read_run(&run_dir)
                .and_then(|r| history::open(&db, false).and_then(|c| history::check::pin(&c, &db, &r)));
            match pinned {
                Ok(line) => {
                    println!("history: {line}");
                    PASS
                }
                Err(e) => code(e),
            }
        }
        HistoryCmd::Check { db, scenario, last, level_tolerance_pct } => {
            if !(level_tolerance_pct.is_finite() && level_tolerance_pct >= 0.0) {
                eprintln!(
                    "plateau: history: --level-tolerance-pct {level_tolerance_pct}: give a percentage of 0 or more"
                );
                return USAGE;
            }
            let o = history::check::CheckOptions { last: last as usize, level_tolerance_pct };
            match history::open(&db, false).and_then(|c| history::check::check(&c, &db, scenario.as_deref(), &o)) {
                Ok(out) => {
                    for line in &out.compared {
                        println!("{line}");
                    }
                    for line in &out.regressions {
                        println!("REGRESSION {line}");
                    }
                    if !out.regressions.is_empty() {
                        LEAK
                    } else if out.groups_judged == 0 {
                        eprintln!(
                            "plateau: history: no scenario has a night to compare with its baseline: nothing judged"
                        );
                        INCONCLUSIVE
                    } else {
                        println!("history: no regression");
                        PASS
                    }
                }
                Err(e) => code(e),
            }
        }
    }
}

/// UTC time as YYYYmmdd-HHMMSS, for default run directories.
fn timestamp() -> String {
    let (y, m, d, hh, mm, ss) = plateau_soak::environment::utc_now_parts();
    format!("{y:04}{m:02}{d:02}-{hh:02}{mm:02}{ss:02}")
}
