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
    /// Use what the run directory records that would run or shape what runs: its `--spawn`
    /// command, `--topology`, `--spawn-env`, `--pid` and `--metrics-map` (only for a run
    /// directory you made or trust: what it records runs as you). Without it, each is refused,
    /// named; `--spawn` may be given again instead.
    #[arg(long)]
    trust_run_dir: bool,
}

/// The original run's command line, parsed as `plateau run` parses it.
pub(crate) fn origin(run_dir: &std::path::Path) -> Result<Origin, String> {
    let path = run_dir.join(COMMAND_FILE);
    let text = plateau_reports::fsutil::read_input_text(&path, plateau_reports::fsutil::RUN_FILE_BYTES)
        .map_err(|e| format!("{e} (is {} a run directory from this plateau?)", run_dir.display()))?;
    let argv: Vec<String> = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    match crate::Cli::try_parse_from(&argv) {
        Ok(crate::Cli { command: crate::Cmd::Run(a) }) => Ok(a.origin()),
        Ok(_) => Err(format!("{}: not a `plateau run` command", path.display())),
        Err(e) => Err(format!("{}: {}", path.display(), e.to_string().lines().next().unwrap_or(""))),
    }
}

pub fn main(a: Args) -> u8 {
    let Args { run_dir, jobs, budget, out, quiet, spawn, trust_run_dir } = a;
    let run_dir = match super::absolute(&run_dir, "RUN_DIR") {
        Ok(d) => d,
        Err(code) => return code,
    };
    let origin = match origin(&run_dir).and_then(|mut o| o.trusted(spawn, trust_run_dir, &run_dir).map(|_| o)) {
        Ok(o) => o,
        Err(e) => {
            plateau_shell::errln!("plateau: {e}");
            return USAGE;
        }
    };
    let exe = match super::own_exe() {
        Ok(e) => e,
        Err(code) => return code,
    };
    if origin.target.is_some() && !origin.own_servers() {
        plateau_shell::errln!(
            "plateau: shrink: warning: every candidate soaks the same server one at a time{}; give --spawn a command that names the target's port for a fresh server each",
            if origin.spawn.is_none() { " (no --spawn): what one candidate leaves, the next one sees" } else { "" }
        );
    }
    let out_dir = out.unwrap_or_else(|| run_dir.join("shrink"));
    let (out_dir, stop) = match (super::absolute(&out_dir, "--out"), super::stop_flag()) {
        (Ok(o), Ok(stop)) => (o, stop),
        (Err(code), _) | (_, Err(code)) => return code,
    };
    let opts = ShrinkOptions { out_dir, run_dir, jobs: super::jobs_or_cores(jobs), budget, exe, quiet, stop };
    match shrink::shrink(&origin, &opts) {
        Ok(s) => {
            plateau_shell::errln!(
                "plateau: shrink: {} candidates in {:.0} s{}; {}",
                s.records.len(),
                s.secs,
                if s.out_of_budget { " (the budget ran out: maybe not minimal)" } else { "" },
                opts.out_dir.join("story.md").display()
            );
            plateau_shell::out!("{}", s.story.split("\n## Candidates").next().unwrap_or(""));
            if s.interrupted {
                plateau_shell::errln!("plateau: shrink: interrupted (SIGTERM or Ctrl-C): minimal.toml still fails, but whether it is minimal is undecided (exit 4)");
                INCONCLUSIVE
            } else if s.out_of_budget {
                // A smaller failing scenario, but not shown to be the smallest: undecided.
                plateau_shell::errln!("plateau: shrink: the budget ran out before the search ended: minimal.toml still fails, but whether it is minimal is undecided (exit 4); a larger --budget decides it");
                INCONCLUSIVE
            } else {
                PASS
            }
        }
        Err(ShrinkError::Input(e)) => {
            plateau_shell::errln!("plateau: {e}");
            USAGE
        }
        Err(ShrinkError::FailsOnItsOwn(e)) => {
            plateau_shell::errln!("plateau: shrink: {e}");
            LEAK
        }
        Err(ShrinkError::Undecided(e)) => {
            plateau_shell::errln!("plateau: shrink: {e}");
            INCONCLUSIVE
        }
        Err(ShrinkError::Harness(e)) => {
            plateau_shell::errln!("plateau: {e}");
            HARNESS
        }
    }
}

/// The flags of `plateau run` that are data: what a run directory records of them is used as
/// recorded (the workload, its length and seed, how it is judged, the target's address and
/// limits, what is recorded). The others are `FLAGS_THAT_RUN`.
#[cfg(test)]
const DATA_FLAGS: [&str; 32] = [
    "--backend",
    "--known",
    "--seed",
    "--iterations",
    "--duration",
    "--until-decided",
    "--max-iterations",
    "--inject",
    "--plant",
    "--out",
    "--sample-interval-ms",
    "--quiet",
    "--pd-processes",
    "--warmup",
    "--tolerance",
    "--profile",
    "--profile-window",
    "--no-replay",
    "--sites",
    "--record-sites",
    "--stop-on-exact-failure",
    "--stop-when-decided",
    "--target",
    "--concurrency",
    "--ready-timeout-s",
    "--settle-timeout-ms",
    "--request-timeout-s",
    "--dialect",
    "--no-python-hook",
    "--summary-md",
    "--junit",
    "--help",
];

#[cfg(test)]
mod tests {
    use clap::CommandFactory;
    use plateau_soak::shrink::FLAGS_THAT_RUN;

    use super::DATA_FLAGS;

    /// Every flag `plateau run` takes is either data or would run something: a flag added later
    /// fails here until it is put in one of the two lists.
    #[test]
    fn every_flag_of_run_is_data_or_runs() {
        let cli = crate::Cli::command();
        let run = cli.find_subcommand("run").expect("run");
        let mut unlisted = Vec::new();
        for arg in run.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            let flag = format!("--{long}");
            let runs = FLAGS_THAT_RUN.contains(&flag.as_str());
            let data = DATA_FLAGS.contains(&flag.as_str());
            assert!(!(runs && data), "{flag} is both data and a flag that runs");
            if !runs && !data {
                unlisted.push(flag);
            }
        }
        assert!(unlisted.is_empty(), "flags of `run` neither data nor runs: {unlisted:?}");
    }

    #[test]
    fn a_recorded_flag_that_runs_is_refused_unless_trusted() {
        for flag in FLAGS_THAT_RUN.iter().filter(|f| **f != "--spawn") {
            let mut o = plateau_soak::shrink::Origin {
                scenario: "n-sampling".into(),
                injections: Vec::new(),
                flags: vec!["--warmup".into(), "5".into(), flag.to_string(), "X=1".into()],
                target: Some("http://127.0.0.1:1".into()),
                spawn: None,
            };
            let dir = std::path::Path::new("RUN");
            let e = o.clone().trusted(Some("server".into()), false, dir).expect_err(flag);
            assert!(e.contains(flag) && e.contains("--trust-run-dir"), "{e}");
            o.trusted(None, true, dir).expect("trusted");
        }
    }
}
