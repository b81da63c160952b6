//! The `plateau` command's subcommands, one file each; `main.rs` is the command table. Exit codes,
//! for every subcommand: 0 pass; 1 growth or leak detected; 2 usage or input error; 3 the engine or
//! the harness itself failed; 4 inconclusive (too little evidence to judge).

use std::path::{Path, PathBuf};

use plateau_soak::driver::RunError;

pub mod analyze;
pub mod bisect;
pub mod explain;
pub mod external;
pub mod fuzz;
pub mod history;
pub mod known;
pub mod length;
pub mod list;
pub mod node;
pub mod replay;
pub mod report;
pub mod repro;
pub mod run;
pub mod selftest;
pub mod serve;
pub mod shrink;

pub const PASS: u8 = 0;
pub const LEAK: u8 = 1;
pub const USAGE: u8 = 2;
pub const HARNESS: u8 = 3;
pub const INCONCLUSIVE: u8 = 4;

/// The exit code of a verdict, for every subcommand that judges one: fail 1, inconclusive 4, pass 0.
pub fn verdict_code(v: &plateau_reports::Verdict) -> u8 {
    v.exit_code()
}

/// Files for CI systems, written beside the usual outputs (each whole or not at all).
#[derive(clap::Args, Default)]
pub struct CiArgs {
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
    pub fn write(&self, runs: &[plateau_reports::ci::RunRef]) -> Result<(), u8> {
        self.write_texts(|| plateau_reports::ci::summary_markdown(runs), || plateau_reports::ci::junit(runs))
    }

    /// The same for a list of checks (selftest's cases).
    pub fn write_checks(&self, title: &str, checks: &[plateau_reports::ci::Check]) -> Result<(), u8> {
        self.write_texts(
            || plateau_reports::ci::checks_markdown(title, checks),
            || plateau_reports::ci::checks_junit("selftest", checks),
        )
    }

    fn write_texts(&self, md: impl Fn() -> String, xml: impl Fn() -> Result<String, String>) -> Result<(), u8> {
        let write = |path: &Path, text: &str| {
            plateau_soak::fsutil::write_atomic(path, text.as_bytes()).map_err(|e| {
                plateau_shell::errln!("plateau: {}: {e}", path.display());
                USAGE
            })
        };
        if let Some(p) = &self.summary_md {
            write(p, &md())?;
        }
        if let Some(p) = &self.junit {
            let text = xml().map_err(|e| {
                plateau_shell::errln!("plateau: --junit: {e}");
                HARNESS
            })?;
            write(p, &text)?;
        }
        Ok(())
    }
}

/// Prints why a run could not produce a verdict; its exit code: bad input 2, the harness 3.
pub fn run_error_code(e: RunError) -> u8 {
    plateau_shell::errln!("plateau: {e}");
    match e {
        RunError::Input(_) => USAGE,
        RunError::Harness(_) => HARNESS,
    }
}

/// `--jobs`, or else the machine's cores: child runs at once (selftest, shrink, fuzz).
pub fn jobs_or_cores(jobs: Option<u16>) -> usize {
    jobs.map_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()), usize::from)
}

/// This binary, which runs its own child runs; Err(exit 3) when it cannot be found, said.
pub fn own_exe() -> Result<PathBuf, u8> {
    std::env::current_exe().map_err(|e| {
        plateau_shell::errln!("plateau: cannot find my own binary: {e}");
        HARNESS
    })
}

/// A wall-clock budget such as 90s, 30m or 2h (`--budget`).
pub fn parse_budget(s: &str) -> Result<std::time::Duration, String> {
    plateau_soak::scenario::parse_duration_secs(s).map(std::time::Duration::from_secs_f64)
}

/// `path` made absolute against the current directory, before anything is written there (a
/// child that runs elsewhere, git's `-C`, must find the same place); an error is said, exit 2.
pub fn absolute(path: &Path, flag: &str) -> Result<PathBuf, u8> {
    std::path::absolute(path).map_err(|e| {
        plateau_shell::errln!("plateau: {flag} {}: {e}", path.display());
        USAGE
    })
}

/// The flag SIGTERM and SIGINT set, for a command that runs child processes (`bisect`, `fuzz`,
/// `shrink`): its children are stopped and it ends with what it decided (exit 4); exit 3 when
/// the handlers cannot be registered.
pub fn stop_flag() -> Result<std::sync::Arc<std::sync::atomic::AtomicBool>, u8> {
    plateau_shell::children::stop_on_signals().map_err(|e| {
        plateau_shell::errln!("plateau: cannot take over {e}: a stop would leave child processes running");
        HARNESS
    })
}

/// UTC time as YYYYmmdd-HHMMSS, for default run directories.
pub fn timestamp() -> String {
    let (y, m, d, hh, mm, ss) = plateau_soak::environment::utc_now_parts();
    format!("{y:04}{m:02}{d:02}-{hh:02}{mm:02}{ss:02}")
}
