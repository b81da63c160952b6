//! `plateau bisect`: the first commit (or release of a server) whose soak fails, between a good
//! and a bad one, or with `--find fix` the first that passes again (the library's `bisect`
//! module has the search).

use std::path::{Path, PathBuf};

use plateau_soak::bisect::{self, BisectError, BisectOptions, Find, Subject};

use super::{HARNESS, USAGE};

#[derive(clap::Args)]
pub struct Args {
    /// A failing run's directory: its command (or its shrunk minimal.toml, where the run was
    /// shrunk) is the soak, with the repository's path in it made {worktree} and the target's
    /// port {port}. Without it, give the soak after `--`.
    run_dir: Option<PathBuf>,
    /// The git repository to bisect (its checkout, index and HEAD are never touched: each
    /// candidate is checked out in a scratch worktree).
    #[arg(long, required_unless_present_any = ["versions", "versions_from_index"], conflicts_with = "versions")]
    repo: Option<PathBuf>,
    /// A commit (or, with --versions, a release) whose soak passes (default with --versions:
    /// the first listed, or the last with --find fix).
    #[arg(long)]
    good: Option<String>,
    /// A commit (or release) whose soak fails: later than --good looking for a regression,
    /// earlier looking for a fix (default with --versions: the last listed, or the first with
    /// --find fix).
    #[arg(long)]
    bad: Option<String>,
    /// A shell command run in each candidate's worktree before its soak (a failed build skips
    /// the candidate): `cargo build --release`, `pip install -e .`.
    #[arg(long, value_name = "CMD", conflicts_with = "versions")]
    build: Option<String>,
    /// Bisect the releases of a server instead of commits: V1,V2,... oldest first (the ends are
    /// the first and the last unless --good and --bad name others). Needs --setup.
    #[arg(long, value_name = "V1,V2,...", value_delimiter = ',', requires = "setup")]
    versions: Option<Vec<String>>,
    /// Bisect the final releases of PACKAGE that its index lists (`python3 -m pip index versions
    /// PACKAGE`: pre-releases and post releases left out) from the older end to the newer one,
    /// both named (--good and --bad). Needs --setup.
    #[arg(long, value_name = "PACKAGE", conflicts_with_all = ["versions", "repo"], requires_all = ["setup", "good", "bad"])]
    versions_from_index: Option<String>,
    /// With --versions: a shell command that prepares release {version} and prints, as its first
    /// line, the command that serves it (`scripts/external/setup-vllm.sh {version}`); the soak's
    /// {serve} is that command. Its output goes to each release's setup.log; a failed setup skips
    /// the release.
    #[arg(long, value_name = "CMD")]
    setup: Option<String>,
    /// What to find: `regression` (the first that fails after passing, default) or `fix` (the
    /// first that passes after failing: --bad is then the older end).
    #[arg(long, value_name = "regression|fix", default_value = "regression", value_parser = parse_find)]
    find: Find,
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
    /// The soak: `-- run SCENARIO ARGS...`, where {worktree} is the candidate's checkout (or, with
    /// --versions, {serve} the command that serves the release and {version} the release) and
    /// {port} a free port of its own (for --target and --spawn).
    #[arg(last = true, value_name = "RUN")]
    command: Vec<String>,
}

fn parse_find(s: &str) -> Result<Find, String> {
    match s {
        "regression" => Ok(Find::Regression),
        "fix" => Ok(Find::Fix),
        other => Err(format!("{other:?}: one of regression, fix")),
    }
}

pub fn main(a: Args) -> u8 {
    let Args {
        run_dir,
        repo,
        good,
        bad,
        build,
        versions,
        versions_from_index,
        setup,
        find,
        out,
        jobs,
        quiet,
        spawn,
        trust_run_dir,
        command,
    } = a;
    if run_dir.is_none() && (spawn.is_some() || trust_run_dir) {
        plateau_shell::errln!(
            "plateau: --spawn and --trust-run-dir apply to a run directory's soak; after --, give the soak whole"
        );
        return USAGE;
    }
    let interrupt = match super::stop_flag() {
        Ok(stop) => stop,
        Err(code) => return code,
    };
    let versions = match (versions, &versions_from_index) {
        (None, Some(package)) => {
            let (older, newer) = if find == Find::Fix { (&bad, &good) } else { (&good, &bad) };
            let (older, newer) = (older.as_deref().unwrap_or_default(), newer.as_deref().unwrap_or_default());
            match bisect::index::releases(package, older, newer, &interrupt) {
                Ok(v) => Some(v),
                Err(e) => {
                    plateau_shell::errln!("plateau: {e}");
                    return USAGE;
                }
            }
        }
        (v, _) => v,
    };
    let subject = match subject(repo.as_ref(), good, bad, build, versions, setup, find) {
        Ok(s) => s,
        Err(e) => {
            plateau_shell::errln!("plateau: {e}");
            return USAGE;
        }
    };
    let command = match (run_dir, command.is_empty(), &repo) {
        (Some(_), false, _) => {
            plateau_shell::errln!("plateau: bisect takes a run directory or a soak after --, not both");
            return USAGE;
        }
        (None, true, _) => {
            plateau_shell::errln!(
                "plateau: bisect needs the soak: `-- run SCENARIO ARGS...` (or a failing run's directory)"
            );
            return USAGE;
        }
        (None, false, _) => command,
        (Some(_), true, None) => {
            plateau_shell::errln!(
                "plateau: with --versions, give the soak after -- (its --spawn serves each release with {{serve}})"
            );
            return USAGE;
        }
        (Some(dir), true, Some(repo)) => match command_of(&dir, repo, spawn, trust_run_dir) {
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
    let out = match super::absolute(&out, "--out") {
        Ok(o) => o,
        Err(code) => return code,
    };
    let o = BisectOptions { subject, find, out, jobs: jobs as usize, command, plateau, interrupt, quiet };
    match bisect::bisect(&o) {
        Ok(r) => said(&o, &r),
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

/// A bisect's answer as people read it at the end; its exit code.
fn said(o: &BisectOptions, r: &bisect::Report) -> u8 {
    let what = format!(
        "first {} {}",
        if o.find == Find::Fix { "good" } else { "bad" },
        if o.subject.is_releases() { "release" } else { "commit" }
    );
    match r.first() {
        Some(id) => plateau_shell::errln!("plateau: {what}: {id}"),
        None if r.interrupted => plateau_shell::errln!("plateau: interrupted: no {what} named"),
        None => plateau_shell::errln!(
            "plateau: skipped candidates leave a range: the {what} is one of {}",
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

/// What to walk: commits of --repo, or --versions set up by --setup; the ends ordered old to new
/// by what is sought.
fn subject(
    repo: Option<&PathBuf>,
    good: Option<String>,
    bad: Option<String>,
    build: Option<String>,
    versions: Option<Vec<String>>,
    setup: Option<String>,
    find: Find,
) -> Result<Subject, String> {
    let (old, new) = match find {
        Find::Regression => (("--good", good), ("--bad", bad)),
        Find::Fix => (("--bad", bad), ("--good", good)),
    };
    match (repo, versions, setup) {
        (Some(repo), None, None) => {
            let need = |(flag, v): (&'static str, Option<String>)| {
                v.map(|v| (flag, v)).ok_or_else(|| format!("{flag} is required with --repo"))
            };
            Ok(Subject::Commits { repo: repo.clone(), old: need(old)?, new: need(new)?, build })
        }
        (None, Some(versions), Some(setup)) => {
            if !setup.contains("{version}") {
                return Err(format!(
                    "--setup {setup:?} never uses {{version}}: every release would be set up the same"
                ));
            }
            Ok(Subject::Releases { versions, first: old.1, last: new.1, setup })
        }
        _ => Err("bisect walks the commits of --repo or the releases of --versions (with --setup)".into()),
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
