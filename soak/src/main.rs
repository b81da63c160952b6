//! The `plateau` command: its table of subcommands. Each lives in its own file under `cli/`, with
//! its flags; exit codes are the same for every subcommand (`cli/mod.rs`): 0 pass; 1 growth or
//! leak detected; 2 usage or input error; 3 the engine or the harness itself failed; 4
//! inconclusive (too little evidence to judge).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cli;

// The harness's allocator is the binary's choice: jemalloc with the harness's own arena.
plateau_probes::install_harness_allocator!();

#[derive(Parser)]
#[command(
    name = "plateau",
    version,
    about = "Soak-test an LLM inference engine and fail on memory growth that does not level off",
    long_about = "plateau drives its engine through a scenario script, again and again, samples jemalloc, \
the kernel's view of the process and every engine registry, and fails the run on growth that does \
not level off.\n\nExit codes: 0 pass; 1 growth or leak detected; 2 usage or input error; \
3 the engine or the harness itself failed; 4 inconclusive (too little evidence to judge: a run \
too short for its warm-up, a metric with no quiescent values). Nothing unjudged passes.\n\n\
plateau lays out its address space the same in every run (it turns the kernel's randomisation \
off for itself, as gdb does, and gives it back to a server it spawns), so that a seed repeats \
the allocator's bookkeeping too; PLATEAU_ASLR=keep keeps the randomisation."
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Cmd,
}

// Parsed once per process: the size of `run`'s flags next to the small subcommands costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
pub(crate) enum Cmd {
    /// Run a soak: SCENARIO is a .toml file or the name of a shipped scenario (see `plateau list`).
    Run(cli::run::Args),
    /// Serve plateau's engine over an OpenAI-compatible HTTP API (/v1/completions,
    /// /v1/chat/completions with images, n, streaming; /v1/models, /health, /metrics), so that
    /// `run --target` can be tested against a server whose leaks are known.
    Serve(cli::serve::Args),
    /// Serve one engine of a prefill/decode pair over TCP (started by `run --pd-processes`).
    Node(cli::node::Args),
    /// Run the detector alone on a samples.jsonl file (from plateau or anything writing v1).
    Analyze(cli::analyze::Args),
    /// List the shipped scenarios and the leak injections.
    List,
    /// Prove the harness's power: every injection caught, every clean scenario passing.
    Selftest(cli::selftest::Args),
    /// Tell the story of a run: what grew, how fast, since when, where (allocation sites, the
    /// mapping, registry insertion sites), and how to replay it.
    Explain(cli::explain::Args),
    /// Redraw a run's verdict, plots and report.html from its samples, optionally against a
    /// baseline run (an earlier night): the change of level and slope per metric. Exits with the
    /// run's verdict code.
    Report(cli::report::Args),
    /// Shrink a failing run to the smallest scenario that still fails the same way (same seed,
    /// injections and target): phases dropped and request features turned off by delta
    /// debugging, then fewer requests and iterations. Writes minimal.toml and story.md (what the
    /// leak needs, what does not matter).
    Shrink(cli::shrink::Args),
    /// Find the commit that made a soak fail: each candidate between --good and --bad is checked
    /// out in a scratch git worktree, built (--build) and soaked, bisecting to the first that
    /// fails; or the release of a server (--versions, --setup); or, with --find fix, the first
    /// that passes again. Exit 0 with the commit named, 4 when skipped candidates leave a range, 2 on bad
    /// input (a good end that fails, a bad end that passes), 3 when nothing could be judged.
    Bisect(cli::bisect::Args),
    /// Write what a server's maintainers can act on without plateau, from a failing run against
    /// it: repro.py (Python's standard library alone: the run's requests sent again, the
    /// server's process tree measured, exit 1 when the growth is reproduced) and ISSUE.md (what
    /// grew per request and per process, the site with its stack, versions, the plot).
    Repro(cli::repro::Args),
    /// Property-test an engine over a scenario's features: random mixes of its phases and
    /// request features, each a short soak judged by the exact layer (registries and in-flight
    /// gauges back to zero at quiescence); the first failing mix is shrunk as `shrink` does.
    Fuzz(cli::fuzz::Args),
    /// Runs across nights in an SQLite database: add runs, show the trend, check for regressions.
    History(cli::history::Args),
}

fn main() -> ExitCode {
    // First of all: the same address space in every run of a seed (the kernel's randomisation
    // off, by executing the program again), before the allocator maps anything it judges.
    if let Err(e) = plateau_probes::layout::fix() {
        plateau_shell::errln!("plateau: {e}");
        return ExitCode::from(cli::USAGE);
    }
    // Before anything maps memory of its own: the allocator's address space is told apart from
    // the rest from here on (`proc.anon_outside_heap`).
    plateau_soak::extents::install();
    let cli = Cli::parse();
    match std::panic::catch_unwind(move || dispatch(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(_) => {
            plateau_shell::errln!("plateau: internal error (see the message above); this is a bug in plateau");
            ExitCode::from(cli::HARNESS)
        }
    }
}

fn dispatch(cli: Cli) -> u8 {
    match cli.command {
        Cmd::Run(a) => cli::run::main(a),
        Cmd::Serve(a) => cli::serve::main(a),
        Cmd::Node(a) => cli::node::main(a),
        Cmd::Analyze(a) => cli::analyze::main(a),
        Cmd::List => cli::list::main(),
        Cmd::Selftest(a) => cli::selftest::main(a),
        Cmd::Explain(a) => cli::explain::main(a),
        Cmd::Report(a) => cli::report::main(a),
        Cmd::History(a) => cli::history::main(a),
        Cmd::Shrink(a) => cli::shrink::main(a),
        Cmd::Bisect(a) => cli::bisect::main(a),
        Cmd::Repro(a) => cli::repro::main(a),
        Cmd::Fuzz(a) => cli::fuzz::main(a),
    }
}
