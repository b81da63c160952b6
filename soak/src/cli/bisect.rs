//! `plateau bisect`: the first commit whose soak fails, between a good and a bad one (the
//! library's `bisect` module has the search).

use std::path::{Path, PathBuf};

use plateau_soak::bisect::{self, BisectError, BisectOptions};

use super::{HARNESS, USAGE};

#[derive(clap::Args)]
pub struct Args {
    /// A failing run's directory: its command (or its shrunk minimal.toml, where the run was
    /// shrunk) is the soak, with the repository's path in it made {worktree} and the target's
    /// port {port}. Without it, give the soak after `--`.
    run_dir: Option<PathBuf>,
    /// The git repository to bisect (its checkout, index and HEAD are never touched: each
    /// candidate is checked out in a scratch worktree).
    #[arg(long)]
    repo: PathBuf,
    /// A commit whose soak passes (checked first).
    #[arg(long)]
    good: String,
    /// A later commit whose soak fails (checked first).
    #[arg(long)]
    bad: String,
    /// A shell command run in each candidate's worktree before its soak (a failed build skips
    /// the candidate): `cargo build --release`, `pip install -e .`.
    #[arg(long, value_name = "CMD")]
    build: Option<String>,
    /// Where bisect.json, story.md, report.html, each candidate's run and the scratch worktrees
    /// go (default: runs/bisect-TIME, from the current directory, never inside --repo). SIGTERM
    /// or Ctrl-C stops the soaks, removes the worktrees and writes what was decided (exit 4).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Candidates soaked at once (multi-section bisection), each on its own port.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=16))]
    jobs: u16,
    /// No line per candidate.
    #[arg(long)]
    quiet: bool,
    /// With a run directory against a server: the command that starts it, replacing the one the
    /// directory's command.json records (never run unasked). {port} and {worktree} apply.
    #[arg(long, value_name = "CMD")]
    spawn: Option<String>,
    /// Use what the run directory records that would run or shape what runs: its `--spawn`
    /// command, `--topology`, `--spawn-env`, `--pid` and `--metrics-map` (only for a run
    /// directory you made or trust: what it records runs as you). Without it, each is refused,
    /// named; `--spawn` may be given again instead.
    #[arg(long)]
    trust_run_dir: bool,
    /// The soak: `-- run SCENARIO ARGS...`, where {worktree} is the candidate's checkout and
    /// {port} a free port of its own (for --target and --spawn).
    #[arg(last = true, value_name = "RUN")]
    command: Vec<String>,
}

pub fn main(a: Args) -> u8 {
    let Args { run_dir, repo, good, bad, build, out, jobs, quiet, spawn, trust_run_dir, command } = a;
    if run_dir.is_none() && (spawn.is_some() || trust_run_dir) {
        plateau_shell::errln!(
            "plateau: --spawn and --trust-run-dir apply to a run directory's soak; after --, give the soak whole"
        );
        return USAGE;
    }
    let command = match (run_dir, command.is_empty()) {
        (Some(_), false) => {
            plateau_shell::errln!("plateau: bisect takes a run directory or a soak after --, not both");
            return USAGE;
        }
        (None, true) => {
            plateau_shell::errln!(
                "plateau: bisect needs the soak: `-- run SCENARIO ARGS...` (or a failing run's directory)"
            );
            return USAGE;
        }
        (None, false) => command,
        (Some(dir), true) => match command_of(&dir, &repo, spawn, trust_run_dir) {
            Ok(c) => c,
            Err(e) => {
                plateau_shell::errln!("plateau: {e}");
                return USAGE;
            }
        },
    };
    let plateau = match super::own_exe() {
        Ok(e) => e,
        Err(code) => return code,
    };
    let out = out.unwrap_or_else(|| PathBuf::from("runs").join(format!("bisect-{}", super::timestamp())));
    // Its worktrees go under --out: a relative one is taken from here, never from the repository.
    let (out, interrupt) = match (super::absolute(&out, "--out"), super::stop_flag()) {
        (Ok(o), Ok(stop)) => (o, stop),
        (Err(code), _) | (_, Err(code)) => return code,
    };
    let o = BisectOptions { repo, good, bad, build, out, jobs: jobs as usize, command, plateau, interrupt, quiet };
    match bisect::bisect(&o) {
        Ok(r) => {
            match &r.first_bad {
                Some(sha) => plateau_shell::errln!("plateau: first bad commit: {sha}"),
                None if r.interrupted => plateau_shell::errln!("plateau: interrupted: no first bad commit named"),
                None => plateau_shell::errln!(
                    "plateau: skipped candidates leave a range: the first bad commit is one of {}",
                    r.range.iter().map(|c| bisect::short(c)).collect::<Vec<_>>().join(", ")
                ),
            }
            let soaked = r.candidates.iter().filter(|c| c.skipped.is_none()).count();
            let skipped = r.candidates.len() - soaked;
            plateau_shell::errln!(
                "plateau: {soaked} soaked, {skipped} skipped, in {:.0} s; bisect.json, story.md and report.html in {}",
                r.wall_s,
                o.out.display()
            );
            r.exit_code
        }
        Err(BisectError::Input(m)) => {
            plateau_shell::errln!("plateau: {m}");
            USAGE
        }
        Err(BisectError::Harness(m)) => {
            plateau_shell::errln!("plateau: {m}");
            HARNESS
        }
    }
}

/// The soak of a failing run, for each candidate: its scenario (or the shrunk minimal.toml), seed,
/// length and flags, the repository's path made {worktree} and the target's port {port}.
fn command_of(run_dir: &Path, repo: &Path, spawn: Option<String>, trust: bool) -> Result<Vec<String>, String> {
    let mut origin = super::shrink::origin(run_dir)?;
    origin.trusted(spawn, trust, run_dir)?;
    let run = plateau_soak::analysis::load_run(run_dir)?;
    if let Some(why) = &run.judged_again {
        plateau_shell::errln!("plateau: {why}: judged again from samples.jsonl");
    }
    let verdict = run.verdict;
    let top = bisect::git::toplevel(repo)?;
    let top = top.display().to_string();
    let in_worktree = |s: &str| s.replace(&top, "{worktree}");
    let minimal = run_dir.join("shrink").join("minimal.toml");
    let scenario = if minimal.is_file() { minimal.display().to_string() } else { in_worktree(&origin.scenario) };
    let mut c = vec!["run".to_string(), scenario];
    c.extend(["--seed".to_string(), verdict.seed.to_string()]);
    if !minimal.is_file() {
        c.extend(["--iterations".to_string(), verdict.iterations.to_string()]);
    }
    // The flags as the run was given them (injections, warm-up, tolerance, the target's settings).
    c.extend(origin.flags.iter().map(|f| in_worktree(f)));
    if let Some(url) = &origin.target {
        let port =
            url.rsplit_once(':').map(|p| p.1.trim_end_matches('/')).filter(|p| p.bytes().all(|b| b.is_ascii_digit()));
        let spawn = origin.spawn.as_deref().map(in_worktree);
        match (port, spawn) {
            (Some(p), Some(s)) if s.contains(p) => {
                c.extend(["--target".into(), url.replace(p, "{port}"), "--spawn".into(), s.replace(p, "{port}")]);
            }
            (_, Some(s)) => c.extend(["--target".into(), url.clone(), "--spawn".into(), s]),
            (_, None) => c.extend(["--target".into(), url.clone()]),
        }
    }
    Ok(c)
}
