//! `plateau-sim`: sweeps seeds of the simulated cluster, replays one, lists fault profiles.
//! Exit codes: 0 every seed passed; 1 a seed failed an invariant; 2 bad input; 3 the simulator
//! itself failed (for example, a trace file that cannot be written).

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use plateau_engine::{Injection, Injections};
use plateau_scenario::Scenario;
use plateau_sim::faults::Profile;
use plateau_sim::shards::SweepIdentity;
use plateau_sim::spec::{default_scenario, parse_seeds, parse_shard, ModelKind, RunSpec};

#[derive(Parser)]
#[command(
    name = "plateau-sim",
    version,
    about = "Deterministic cluster simulation of the plateau engine: seeds, faults, invariants, replay"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Clone)]
struct RunArgs {
    /// Scenario file or shipped soak scenario name; its [sim] section sets the cluster shape.
    /// Default: the simulator's own `cluster` scenario (1 prefill, 1 decode, 1 monolithic node).
    #[arg(long)]
    scenario: Option<String>,
    /// Fault profile: none, light, default, heavy (default: the scenario's sim.faults).
    #[arg(long)]
    faults: Option<String>,
    /// Leak injection to switch on in every engine (repeatable; `plateau list` describes them).
    #[arg(long = "inject", value_name = "NAME")]
    inject: Vec<String>,
    /// Model backend of the engine nodes: hash (fast pseudo-logits) or cpu (the real tiny model).
    #[arg(long, default_value = "hash")]
    model: String,
    /// Scenario iterations per run (default: the scenario's sim.iterations).
    #[arg(long)]
    iterations: Option<u64>,
}

#[derive(Subcommand)]
enum Command {
    /// Run a range of seeds; print one line per failing seed and a summary. Exit 1 on any failure.
    Sweep {
        /// Seeds: A..B (B excluded) or one seed.
        #[arg(long, default_value = "0..100")]
        seeds: String,
        /// Run only shard I of N (seed k belongs to shard k mod N), for spreading a nightly sweep.
        #[arg(long)]
        shard: Option<String>,
        /// Also print a line for every passing seed.
        #[arg(long)]
        verbose: bool,
        /// Write the shard's result here (JSON) for `plateau-sim merge`.
        #[arg(long, value_name = "FILE")]
        out: Option<std::path::PathBuf>,
        #[command(flatten)]
        run: RunArgs,
    },
    /// Join the results of a sharded sweep (`sweep --shard I/N --out FILE`, one file per shard)
    /// into one summary with the failing seeds and their replay commands. Refuses shards of
    /// different sweeps, a shard given twice and a missing one. Exit 1 when a seed failed.
    Merge {
        #[arg(required = true, value_name = "SHARD_FILE")]
        files: Vec<std::path::PathBuf>,
        /// Also write GitHub job-summary markdown here.
        #[arg(long, value_name = "FILE")]
        summary_md: Option<std::path::PathBuf>,
    },
    /// Rerun one seed; print its result and trace hash, and write its event trace with --trace.
    Replay {
        #[arg(long)]
        seed: u64,
        /// Write every event of the run, one line each, to this file.
        #[arg(long)]
        trace: Option<std::path::PathBuf>,
        /// Write what the detector judged (every node's registries and gauges at each quiescent
        /// point) to this file as samples v1: `plateau analyze FILE` plots and explains it.
        #[arg(long, value_name = "FILE")]
        samples: Option<std::path::PathBuf>,
        #[command(flatten)]
        run: RunArgs,
    },
    /// List the fault profiles.
    ListFaults,
}

/// The run arguments as given, as a replay command line takes them.
fn run_args(a: &RunArgs) -> String {
    let mut out = Vec::new();
    if let Some(s) = &a.scenario {
        out.push(format!("--scenario {s}"));
    }
    if let Some(f) = &a.faults {
        out.push(format!("--faults {f}"));
    }
    out.extend(a.inject.iter().map(|i| format!("--inject {i}")));
    if a.model != "hash" {
        out.push(format!("--model {}", a.model));
    }
    if let Some(n) = a.iterations {
        out.push(format!("--iterations {n}"));
    }
    out.join(" ")
}

fn spec(a: &RunArgs) -> Result<RunSpec, String> {
    let scenario = match &a.scenario {
        Some(s) => Scenario::load(s).map_err(|e| e.to_string())?.0,
        None => default_scenario(),
    };
    let mut injections = Injections::none();
    for name in &a.inject {
        let i: Injection = name.parse().map_err(|e: String| format!("--inject: {e}"))?;
        if i == Injection::PdSenderOnAbort {
            // The simulated cluster moves KV as whole messages: it has no chunked sender side.
            return Err(format!(
                "--inject {name}: not modelled in the simulator (its KV transfers are whole messages, with no chunked sender); soak it with `plateau run pd-transfer --inject {name}`"
            ));
        }
        injections = injections.with(i);
    }
    let model = ModelKind::parse(&a.model).map_err(|e| format!("--model: {e}"))?;
    RunSpec::new(scenario, a.faults.as_deref(), injections, model, a.iterations)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::ListFaults => {
            for (name, _, what) in Profile::ALL {
                println!("{name:<8} {what}");
            }
            ExitCode::SUCCESS
        }
        Command::Sweep { seeds, shard, verbose, out, run } => {
            let parsed = (|| {
                let seeds = parse_seeds(&seeds)?;
                let shard = shard.as_deref().map(parse_shard).transpose()?;
                Ok::<_, String>((seeds, shard, spec(&run)?))
            })();
            match parsed {
                Ok((seeds, shard, spec)) => {
                    // An output that cannot be written is found before the sweep, not after it.
                    if let Some(o) = &out {
                        let tmp = o.with_extension("json.tmp");
                        if let Err(e) = std::fs::write(&tmp, b"").and_then(|_| std::fs::remove_file(&tmp)) {
                            return usage(&format!("--out {}: {e}", o.display()));
                        }
                    }
                    let identity = SweepIdentity {
                        seeds_start: seeds.start,
                        seeds_end: seeds.end,
                        shard_count: shard.map_or(1, |s| s.1),
                        run_args: run_args(&run),
                    };
                    sweep(seeds, shard, &spec, verbose, out.map(|o| (o, identity)))
                }
                Err(e) => usage(&e),
            }
        }
        Command::Merge { files, summary_md } => merge(&files, summary_md.as_deref()),
        Command::Replay { seed, trace, samples, run } => match spec(&run) {
            Ok(spec) => replay(seed, trace, samples, &spec),
            Err(e) => usage(&e),
        },
    }
}

fn usage(e: &str) -> ExitCode {
    eprintln!("plateau-sim: {e}");
    ExitCode::from(2)
}

/// Where a sweep writes its shard record, and which sweep it is part of.
type ShardOut = Option<(std::path::PathBuf, SweepIdentity)>;

fn merge(files: &[std::path::PathBuf], summary_md: Option<&std::path::Path>) -> ExitCode {
    use plateau_sim::shards;
    let records = match files
        .iter()
        .map(|f| shards::read(f).map(|r| (f.display().to_string(), r)))
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(r) => r,
        Err(e) => return usage(&e),
    };
    let merged = match shards::merge(&records) {
        Ok(m) => m,
        Err(e) => return usage(&e),
    };
    print!("{}", merged.text());
    if let Some(p) = summary_md {
        use std::io::Write;
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .and_then(|mut f| f.write_all(merged.markdown().as_bytes()));
        if let Err(e) = written {
            eprintln!("plateau-sim: --summary-md {}: {e}", p.display());
            return ExitCode::from(2);
        }
    }
    if merged.failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

#[cfg(not(madsim))]
fn sweep(_: std::ops::Range<u64>, _: Option<(u64, u64)>, _: &RunSpec, _: bool, _: ShardOut) -> ExitCode {
    not_simulation()
}

#[cfg(not(madsim))]
fn replay(_: u64, _: Option<std::path::PathBuf>, _: Option<std::path::PathBuf>, _: &RunSpec) -> ExitCode {
    not_simulation()
}

#[cfg(not(madsim))]
fn not_simulation() -> ExitCode {
    usage("this binary was built without the simulation; build it with RUSTFLAGS=\"--cfg madsim\" CARGO_TARGET_DIR=target/madsim cargo build --release -p plateau-sim (or: just sim)")
}

#[cfg(madsim)]
fn sweep(
    seeds: std::ops::Range<u64>,
    shard: Option<(u64, u64)>,
    spec: &RunSpec,
    verbose: bool,
    out: ShardOut,
) -> ExitCode {
    use std::io::Write;
    let start = std::time::Instant::now();
    let (mut runs, mut failed, mut undecided, mut requests, mut sim_ms) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut first_fail = None;
    let mut failed_seeds = Vec::new();
    for seed in plateau_sim::shards::shard_seeds(seeds.clone(), shard) {
        let r = plateau_sim::runner::run_seed(spec, seed, false);
        runs += 1;
        requests += r.requests.finished + r.requests.aborted + r.requests.failed;
        sim_ms += r.sim_ms;
        if r.failed() {
            failed += 1;
            first_fail.get_or_insert(seed);
            failed_seeds.push(plateau_sim::shards::FailedSeed { seed, line: r.line() });
        } else if !r.passed() {
            undecided += 1;
        }
        if !r.passed() || verbose {
            println!("{}", r.line());
            let _ = std::io::stdout().flush();
        }
    }
    let wall = start.elapsed().as_secs_f64();
    let injections: Vec<&str> = spec.injections.iter().map(|i| i.name()).collect();
    println!(
        "sweep {}..{}{}: {runs} seeds, {failed} failed{}, {undecided} undecided; scenario {}, faults {:?}, injections [{}]; {requests} requests, {:.1} s simulated in {wall:.1} s wall ({:.0} requests/s, {:.0}x real time)",
        seeds.start,
        seeds.end,
        shard.map(|(i, n)| format!(" shard {i}/{n}")).unwrap_or_default(),
        first_fail.map(|s| format!(" (first: seed {s})")).unwrap_or_default(),
        spec.scenario.name,
        spec.profile,
        injections.join(", "),
        sim_ms as f64 / 1000.0,
        requests as f64 / wall.max(1e-9),
        sim_ms as f64 / 1000.0 / wall.max(1e-9),
    );
    if let Some((path, sweep)) = out {
        let record = plateau_sim::shards::ShardRecord {
            schema: plateau_sim::shards::SHARD_SCHEMA.into(),
            sweep,
            shard_index: shard.map_or(0, |s| s.0),
            seeds_run: runs,
            failed: failed_seeds,
            requests,
            sim_ms,
            wall_s: wall,
        };
        let text = serde_json::to_string_pretty(&record).unwrap_or_default() + "\n";
        let tmp = path.with_extension("json.tmp");
        if let Err(e) = std::fs::write(&tmp, text).and_then(|_| std::fs::rename(&tmp, &path)) {
            eprintln!("plateau-sim: --out {}: {e}", path.display());
            return ExitCode::from(2);
        }
    }
    // Every seed judged and passed, or the sweep is no pass: 1 on a failure, 4 on an undecided.
    if failed > 0 {
        ExitCode::from(1)
    } else if undecided > 0 {
        ExitCode::from(4)
    } else {
        ExitCode::SUCCESS
    }
}

#[cfg(madsim)]
fn replay(
    seed: u64,
    trace: Option<std::path::PathBuf>,
    samples: Option<std::path::PathBuf>,
    spec: &RunSpec,
) -> ExitCode {
    let r = plateau_sim::runner::run_seed(spec, seed, trace.is_some());
    for v in &r.violations {
        println!(
            "seed {seed}: violation {} on {} at t={:.3}s: {}",
            v.invariant,
            v.node,
            v.t_ms as f64 / 1000.0,
            v.detail
        );
    }
    println!("{}", r.line());
    if let Some(path) = trace {
        let mut text = r.trace_lines.join("\n");
        text.push('\n');
        if let Err(e) = std::fs::write(&path, text) {
            eprintln!("plateau-sim: cannot write the trace to {}: {e}", path.display());
            return ExitCode::from(3);
        }
        println!("trace: {} events written to {}", r.events, path.display());
    }
    if let Some(path) = samples {
        let Some(s) = &r.samples else {
            eprintln!("plateau-sim: the run recorded no samples (it ended before its first quiescent point)");
            return ExitCode::from(3);
        };
        if let Err(e) = std::fs::write(&path, s.to_jsonl()) {
            eprintln!("plateau-sim: cannot write the samples to {}: {e}", path.display());
            return ExitCode::from(3);
        }
        println!(
            "samples: {} quiescent points written to {} (plateau analyze plots them)",
            s.rows.len(),
            path.display()
        );
    }
    ExitCode::from(plateau_sim::report::RunReport::exit_code([&r]))
}
