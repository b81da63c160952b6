//! `plateau shrink RUN_DIR`: the smallest scenario that still fails the way a run failed, and what
//! the leak needs (the library's `shrink` module has the search).

use std::path::PathBuf;

use clap::Parser;
use plateau_soak::shrink::{self, Origin, ShrinkError, ShrinkOptions, COMMAND_FILE};

use super::{HARNESS, INCONCLUSIVE, LEAK, PASS, USAGE};

#[derive(clap::Args)]
pub struct Args {
    /// A failing run's directory (from `plateau run`, which wrote scenario.toml and command.json
    /// there).
    run_dir: PathBuf,
    /// Candidate runs at once, each a child process (default: the machine's cores). Against
    /// --target --spawn each gets its own server on a fresh port, where the command names the
    /// target's port; otherwise they run one at a time.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=64))]
    jobs: Option<u16>,
    /// Wall-clock budget: no candidate starts after it, and the smallest failing scenario so far
    /// is written, marked as possibly not minimal: 90s, 30m, 2h.
    #[arg(long, default_value = "30m", value_parser = super::parse_budget)]
    budget: std::time::Duration,
    /// Where minimal.toml, story.md, shrink.json and the candidates go (default: RUN_DIR/shrink).
    #[arg(long)]
    out: Option<PathBuf>,
    /// No line per candidate.
    #[arg(long)]
    quiet: bool,
    /// The command that starts the server, for a run against one (`--target`): replaces the one
    /// the run directory's command.json records, which is never run unasked.
    #[arg(long, value_name = "CMD")]
    spawn: Option<String>,
    /// Run the `--spawn` command or `--topology` that the run directory records (only for a run
    /// directory you made or trust: what it records runs as you).
    #[arg(long)]
    trust_run_dir: bool,
}

/// The original run's command line, parsed as `plateau run` parses it.
pub(crate) fn origin(run_dir: &std::path::Path) -> Result<Origin, String> {
    let path = run_dir.join(COMMAND_FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| {
        format!("{}: {e} (is {} a run directory from this plateau?)", path.display(), run_dir.display())
    })?;
    let argv: Vec<String> = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    match crate::Cli::try_parse_from(&argv) {
        Ok(crate::Cli { command: crate::Cmd::Run(a) }) => Ok(a.origin()),
        Ok(_) => Err(format!("{}: not a `plateau run` command", path.display())),
        Err(e) => Err(format!("{}: {}", path.display(), e.to_string().lines().next().unwrap_or(""))),
    }
}

pub fn main(a: Args) -> u8 {
    let Args { run_dir, jobs, budget, out, quiet, spawn, trust_run_dir } = a;
    let origin = match origin(&run_dir).and_then(|mut o| o.trusted(spawn, trust_run_dir, &run_dir).map(|_| o)) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("plateau: {e}");
            return USAGE;
        }
    };
    let exe = match super::own_exe() {
        Ok(e) => e,
        Err(code) => return code,
    };
    if origin.target.is_some() && !origin.own_servers() {
        eprintln!(
            "plateau: shrink: warning: every candidate soaks the same server one at a time{}; give --spawn a command that names the target's port for a fresh server each",
            if origin.spawn.is_none() { " (no --spawn): what one candidate leaves, the next one sees" } else { "" }
        );
    }
    let opts = ShrinkOptions {
        out_dir: out.unwrap_or_else(|| run_dir.join("shrink")),
        run_dir,
        jobs: super::jobs_or_cores(jobs),
        budget,
        exe,
        quiet,
    };
    match shrink::shrink(&origin, &opts) {
        Ok(s) => {
            eprintln!(
                "plateau: shrink: {} candidates in {:.0} s{}; {}",
                s.records.len(),
                s.secs,
                if s.out_of_budget { " (the budget ran out: maybe not minimal)" } else { "" },
                opts.out_dir.join("story.md").display()
            );
            print!("{}", s.story.split("\n## Candidates").next().unwrap_or(""));
            if s.out_of_budget {
                // A smaller failing scenario, but not shown to be the smallest: undecided.
                eprintln!("plateau: shrink: the budget ran out before the search ended: minimal.toml still fails, but whether it is minimal is undecided (exit 4); a larger --budget decides it");
                INCONCLUSIVE
            } else {
                PASS
            }
        }
        Err(ShrinkError::Input(e)) => {
            eprintln!("plateau: {e}");
            USAGE
        }
        Err(ShrinkError::FailsOnItsOwn(e)) => {
            eprintln!("plateau: shrink: {e}");
            LEAK
        }
        Err(ShrinkError::Undecided(e)) => {
            eprintln!("plateau: shrink: {e}");
            INCONCLUSIVE
        }
        Err(ShrinkError::Harness(e)) => {
            eprintln!("plateau: {e}");
            HARNESS
        }
    }
}
