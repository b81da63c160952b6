//! `plateau bisect`: the commit that made a soak fail.
//!
//! Lifecycle of a bisect:
//! 1. Check the input: a git repository, two commits, the good one an ancestor of the bad one, a
//!    `run` command whose `--out` bisect chooses (bad input exits 2 before anything is soaked).
//! 2. List the candidates: the commits after the good end up to the bad end, on the paths between
//!    them, oldest first.
//! 3. Soak both ends (side by side with `--jobs 2` or more): the good end must pass and the bad end
//!    fail, else there is nothing to bisect (exit 2, with that end's verdict).
//! 4. Soak candidates as [`search::Search`] picks them, up to `--jobs` at once. Each candidate is
//!    checked out in a scratch `git worktree` (the user's checkout, index and HEAD are never
//!    touched), built with `--build` there, and soaked with `{worktree}` and `{port}` (a free port
//!    of its own) filled into the command. An undecided soak runs again with `--until-decided`;
//!    still undecided, a failed build or a harness failure skips the candidate, with why.
//! 5. Write bisect.json, story.md and report.html, and remove every worktree, whatever ended the
//!    bisect (success, failure, Ctrl-C between rounds).

// The harness's allocator in this crate's unit tests, as the `plateau` binary has it (the
// tests read jemalloc's statistics and arenas).
#[cfg(test)]
plateau_probes::install_harness_allocator!();

pub mod git;
pub mod search;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use plateau_shell::children::{Ended, INTERRUPTED};
use serde::Serialize;
use serde_json::Value;

use search::{Found, Outcome, Search};

/// Candidates a bisect may list: far more than a night's commits, and a bound on its work (a
/// search over them soaks about log2 of this many).
const MAX_CANDIDATES: usize = 10_000;

pub struct BisectOptions {
    pub repo: PathBuf,
    pub good: String,
    pub bad: String,
    /// Run in each worktree before its soak (`sh -c`).
    pub build: Option<String>,
    pub out: PathBuf,
    pub jobs: usize,
    /// `run SCENARIO ARGS...`, with `{worktree}` and `{port}` to fill.
    pub command: Vec<String>,
    /// The plateau that soaks each candidate.
    pub plateau: PathBuf,
    pub interrupt: Arc<AtomicBool>,
    pub quiet: bool,
}

#[derive(Debug)]
pub enum BisectError {
    /// Exit 2.
    Input(String),
    /// Exit 3.
    Harness(String),
}

/// One soaked candidate (or end), as bisect.json records it.
#[derive(Debug, Clone, Serialize)]
pub struct Soaked {
    pub commit: String,
    pub subject: String,
    /// pass, fail, inconclusive, or skipped.
    pub verdict: String,
    pub exit_code: Option<i32>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failing: Vec<String>,
    /// The first failing metric's rate (per iteration), where one failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_per_iteration: Option<f64>,
    pub wall_s: f64,
    pub run_dir: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
    /// The verdict's one line.
    pub summary: String,
    /// Every metric's rate, for the story's comparison (not written).
    #[serde(skip)]
    pub rates: Vec<(String, f64)>,
}

/// What a bisect found, as its exit code says: 0 a first bad commit, 4 a range left by skips
/// (or an interrupt), 3 no candidate could be judged at all.
#[derive(Debug, Serialize)]
pub struct Report {
    pub first_bad: Option<String>,
    /// Where skips left the answer: the first bad commit is one of these.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub range: Vec<String>,
    pub good: String,
    pub bad: String,
    pub candidates: Vec<Soaked>,
    pub interrupted: bool,
    pub wall_s: f64,
    pub exit_code: u8,
}

/// Checks the input and lists the candidates (step 1 and 2): the good and bad commits' ids and
/// the candidates, oldest first.
pub fn plan(o: &BisectOptions) -> Result<(PathBuf, String, String, Vec<String>), BisectError> {
    let top = git::toplevel(&o.repo).map_err(BisectError::Input)?;
    let good = git::commit(&top, "--good", &o.good).map_err(BisectError::Input)?;
    let bad = git::commit(&top, "--bad", &o.bad).map_err(BisectError::Input)?;
    if good == bad {
        return Err(BisectError::Input(format!("--good {} and --bad {} are the same commit", o.good, o.bad)));
    }
    if !git::is_ancestor(&top, &good, &bad) {
        return Err(BisectError::Input(format!(
            "--good {} is not an ancestor of --bad {}: bisect looks for the first bad commit after a good one",
            o.good, o.bad
        )));
    }
    match o.command.first().map(String::as_str) {
        Some("run") if o.command.len() >= 2 => {}
        _ => {
            return Err(BisectError::Input(
                "after --, give the soak: run SCENARIO ARGS... ({worktree} and {port} are filled per candidate)".into(),
            ))
        }
    }
    if o.command.iter().any(|a| a == "--out" || a.starts_with("--out=")) {
        return Err(BisectError::Input(
            "the soak's --out: bisect writes each candidate's run under its own --out".into(),
        ));
    }
    let list = git::candidates(&top, &good, &bad).map_err(BisectError::Harness)?;
    if list.len() > MAX_CANDIDATES {
        return Err(BisectError::Input(format!(
            "{} commits between --good and --bad, more than {MAX_CANDIDATES}: name closer ends",
            list.len()
        )));
    }
    if list.last() != Some(&bad) {
        return Err(BisectError::Harness(format!("git rev-list did not end at --bad {bad}")));
    }
    Ok((top, good, bad, list))
}

/// Runs the bisect (steps 3 to 5).
pub fn bisect(o: &BisectOptions) -> Result<Report, BisectError> {
    let t0 = Instant::now();
    let (top, good, bad, list) = plan(o)?;
    std::fs::create_dir_all(o.out.join("runs"))
        .map_err(|e| BisectError::Input(format!("--out {}: {e}", o.out.display())))?;
    let scratch = o.out.join("worktrees");
    let runner = Runner { o, top: &top, scratch: &scratch, git_lock: Mutex::new(()) };
    say(o, &format!("bisect: {} candidates between {} and {}", list.len(), short(&good), short(&bad)));
    // The ends first: the good end must pass and the bad end fail.
    let ends = runner.soak_all(&[(&good, "good"), (&bad, "bad")]);
    let (good_end, bad_end) = (&ends[0], &ends[1]);
    for (end, flag, rev, want) in [(good_end, "--good", &o.good, "pass"), (bad_end, "--bad", &o.bad, "fail")] {
        if end.verdict != want && !o.interrupt.load(Ordering::SeqCst) {
            return Err(BisectError::Input(format!(
                "{flag} {rev} ({}) did not {want} its soak: {} (exit {}): {}; its run is in {}",
                short(&end.commit),
                end.verdict,
                end.exit_code.map_or("none".into(), |c| c.to_string()),
                end.skipped.as_deref().unwrap_or(&end.summary),
                end.run_dir
            )));
        }
    }
    let mut soaked: Vec<(Option<usize>, Soaked)> =
        vec![(None, ends[0].clone()), (Some(list.len() - 1), ends[1].clone())];
    let mut s = Search::new(list.len());
    s.record(list.len() - 1, Outcome::Bad);
    let mut interrupted = o.interrupt.load(Ordering::SeqCst);
    while !interrupted {
        let next = s.next(o.jobs);
        if next.is_empty() {
            break;
        }
        if o.interrupt.load(Ordering::SeqCst) {
            interrupted = true;
            break;
        }
        let probes: Vec<(&String, &str)> = next.iter().map(|&i| (&list[i], "candidate")).collect();
        let results = runner.soak_all(&probes);
        // A soak cut short by the stop says nothing of its commit: it is not recorded.
        if o.interrupt.load(Ordering::SeqCst) {
            interrupted = true;
            break;
        }
        for (i, r) in next.iter().zip(results) {
            let outcome = match (r.verdict.as_str(), &r.skipped) {
                ("pass", _) => Outcome::Good,
                ("fail", _) => Outcome::Bad,
                (_, why) => Outcome::Skip(why.clone().unwrap_or_else(|| r.verdict.clone())),
            };
            s.record(*i, outcome);
            soaked.push((Some(*i), r));
        }
    }
    let found = if interrupted { None } else { s.found() };
    let (first_bad, range, exit_code) = match &found {
        Some(Found::FirstBad(i)) => (Some(list[*i].clone()), Vec::new(), 0),
        Some(Found::Range { from, to }) => {
            let judged_any = soaked.iter().any(|(i, r)| i.is_some_and(|i| i + 1 < list.len()) && r.skipped.is_none());
            let tried = soaked.iter().filter(|(i, _)| i.is_some_and(|i| i + 1 < list.len())).count();
            (None, list[*from..=*to].to_vec(), if !judged_any && tried > 0 { 3 } else { 4 })
        }
        None => (None, Vec::new(), 4),
    };
    let mut candidates: Vec<Soaked> = Vec::new();
    soaked.sort_by_key(|(i, _)| i.map_or(-1, |i| i as i64));
    candidates.extend(soaked.into_iter().map(|(_, r)| r));
    let report =
        Report { first_bad, range, good, bad, candidates, interrupted, wall_s: t0.elapsed().as_secs_f64(), exit_code };
    write_outputs(o, &top, &report).map_err(BisectError::Harness)?;
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(report)
}

fn say(o: &BisectOptions, line: &str) {
    if !o.quiet {
        plateau_shell::errln!("plateau: {line}");
    }
}

pub fn short(sha: &str) -> &str {
    &sha[..sha.len().min(10)]
}

struct Runner<'a> {
    o: &'a BisectOptions,
    top: &'a Path,
    scratch: &'a Path,
    /// Worktrees are added and removed one at a time: git locks its worktree list.
    git_lock: Mutex<()>,
}

impl Runner<'_> {
    /// Soaks each commit, up to `jobs` at once, in the order given.
    fn soak_all(&self, commits: &[(&String, &str)]) -> Vec<Soaked> {
        let mut out = Vec::with_capacity(commits.len());
        for chunk in commits.chunks(self.o.jobs.max(1)) {
            let results: Vec<Soaked> = std::thread::scope(|s| {
                let handles: Vec<_> = chunk.iter().map(|(sha, what)| s.spawn(move || self.soak(sha, what))).collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap_or_else(|_| panic!("a candidate's thread panicked")))
                    .collect()
            });
            out.extend(results);
        }
        out
    }

    /// One commit: a worktree, its build, its soak (again with --until-decided when undecided).
    fn soak(&self, sha: &str, what: &str) -> Soaked {
        let t0 = Instant::now();
        let run_dir = self.o.out.join("runs").join(short(sha));
        let mut r = Soaked {
            commit: sha.to_string(),
            subject: git::subject(self.top, sha),
            verdict: "skipped".into(),
            exit_code: None,
            failing: Vec::new(),
            rate_per_iteration: None,
            wall_s: 0.0,
            run_dir: run_dir.display().to_string(),
            skipped: None,
            summary: String::new(),
            rates: Vec::new(),
        };
        let result = self.soak_in_worktree(sha, &run_dir, &mut r);
        if let Err(why) = result {
            r.verdict = "skipped".into();
            r.skipped = Some(why);
        }
        r.wall_s = t0.elapsed().as_secs_f64();
        let how = r.skipped.as_ref().map_or(r.verdict.clone(), |w| format!("skipped: {w}"));
        say(self.o, &format!("{what} {} {:?}: {how} ({:.0} s)", short(sha), r.subject, r.wall_s));
        r
    }

    fn soak_in_worktree(&self, sha: &str, run_dir: &Path, r: &mut Soaked) -> Result<(), String> {
        std::fs::create_dir_all(self.scratch).map_err(|e| format!("{}: {e}", self.scratch.display()))?;
        let wt = {
            let _g = self.git_lock.lock().map_err(|_| "the worktree lock".to_string())?;
            git::Worktree::add(self.top, sha, &self.scratch.join(short(sha)))?
        };
        let logs = run_dir.with_extension("logs");
        std::fs::create_dir_all(&logs).map_err(|e| format!("{}: {e}", logs.display()))?;
        if let Some(build) = &self.o.build {
            let log = logs.join("build.log");
            let file = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
            let mut cmd = Command::new("sh");
            cmd.arg("-c").arg(build).current_dir(&wt.path);
            cmd.stdout(file.try_clone().map_err(|e| e.to_string())?).stderr(file);
            let status = self.run_child(&mut cmd, "--build")?;
            if !status.success() {
                return Err(format!("--build failed ({status}); its log: {}", log.display()));
            }
        }
        let mut code = self.run_plateau(&wt.path, run_dir, &logs.join("soak.log"), false)?;
        let mut dir = run_dir.to_path_buf();
        if code == 4 && !self.o.command.iter().any(|a| a == "--until-decided") {
            dir = run_dir.with_extension("longer");
            code = self.run_plateau(&wt.path, &dir, &logs.join("soak-longer.log"), true)?;
        }
        drop(wt);
        r.exit_code = Some(code);
        r.run_dir = dir.display().to_string();
        let verdict: Option<Value> =
            std::fs::read_to_string(dir.join("verdict.json")).ok().and_then(|t| serde_json::from_str(&t).ok());
        if let Some(v) = &verdict {
            r.summary = v["summary"].as_str().unwrap_or_default().to_string();
            for m in v["metrics"].as_array().into_iter().flatten() {
                let name = m["name"].as_str().unwrap_or_default().to_string();
                if let Some(rate) = m["trend"]["slope_per_iter"].as_f64() {
                    r.rates.push((name.clone(), rate));
                }
                if m["status"] == "fail" {
                    r.failing.push(name);
                }
            }
            r.rate_per_iteration = r.failing.first().and_then(|f| r.rates.iter().find(|(n, _)| n == f)).map(|x| x.1);
        }
        match code {
            0 => r.verdict = "pass".into(),
            1 => r.verdict = "fail".into(),
            4 => return Err(format!("undecided after --until-decided: {}", r.summary)),
            2 => {
                return Err(format!(
                    "the soak refused its input here (exit 2); its log: {}",
                    logs.join("soak.log").display()
                ))
            }
            c => {
                return Err(format!(
                    "the soak failed (exit {c}): {}",
                    if r.summary.is_empty() { "no verdict" } else { &r.summary }
                ))
            }
        }
        Ok(())
    }

    /// `cmd` until it exits, or until bisect is told to stop: then an error saying so, never an
    /// exit status (an interrupted soak read as undecided would be soaked again, longer).
    fn run_child(&self, cmd: &mut Command, what: &str) -> Result<std::process::ExitStatus, String> {
        match plateau_shell::children::run(cmd, false, &self.o.interrupt) {
            Ok(Ended::Exited { status, .. }) => Ok(status),
            Ok(Ended::Stopped) => Err(INTERRUPTED.into()),
            Err(e) => Err(format!("{what}: {e}")),
        }
    }

    /// `plateau run ...` for one worktree into `out`; its exit code.
    fn run_plateau(&self, worktree: &Path, out: &Path, log: &Path, longer: bool) -> Result<i32, String> {
        let port = free_port()?;
        let wt = worktree.display().to_string();
        let mut args: Vec<String> =
            self.o.command.iter().map(|a| a.replace("{worktree}", &wt).replace("{port}", &port.to_string())).collect();
        args.extend(["--out".to_string(), out.display().to_string(), "--quiet".to_string()]);
        if longer {
            args.push("--until-decided".into());
        }
        let file = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
        let mut cmd = Command::new(&self.o.plateau);
        cmd.args(&args).stdout(file.try_clone().map_err(|e| e.to_string())?).stderr(file);
        let status = self.run_child(&mut cmd, &self.o.plateau.display().to_string())?;
        status.code().ok_or_else(|| format!("the soak ended by a signal ({status}); its log: {}", log.display()))
    }
}

fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("a free port: {e}"))?;
    l.local_addr().map(|a| a.port()).map_err(|e| format!("a free port: {e}"))
}

/// bisect.json, story.md and report.html in `--out`.
fn write_outputs(o: &BisectOptions, top: &Path, r: &Report) -> Result<(), String> {
    let put = |name: &str, text: String| {
        let p = o.out.join(name);
        plateau_reports::fsutil::write_atomic(&p, text.as_bytes()).map_err(|e| format!("{}: {e}", p.display()))
    };
    put("bisect.json", serde_json::to_string_pretty(r).map_err(|e| e.to_string())? + "\n")?;
    put("story.md", story(top, r))?;
    put("report.html", html(r))
}

/// What a person reads first: the commit, its subject, and the growth it brought.
pub fn story(top: &Path, r: &Report) -> String {
    let mut s = String::from("# plateau bisect\n\n");
    match (&r.first_bad, r.interrupted) {
        (Some(sha), _) => {
            let first = r.candidates.iter().find(|c| &c.commit == sha);
            s.push_str(&format!("First bad commit: `{sha}`: {}\n\n", git::subject(top, sha)));
            if let Some(f) = first {
                let metric = f.failing.first().cloned().unwrap_or_default();
                let last_good = r.candidates.iter().rfind(|c| c.verdict == "pass");
                let before = last_good.and_then(|g| g.rates.iter().find(|(n, _)| *n == metric)).map(|x| x.1);
                s.push_str(&format!(
                    "It brought growth in {}: {} per iteration at the first bad commit, {} at the last good one ({}).\n\n",
                    if f.failing.is_empty() { "nothing named".to_string() } else { f.failing.join(", ") },
                    f.rate_per_iteration.map_or("an unmeasured rate".into(), |x| format!("{x:.0} B")),
                    before.map_or("no rate".into(), |x| format!("{x:.0} B")),
                    last_good.map_or("the good end".to_string(), |g| short(&g.commit).to_string())
                ));
            }
        }
        (None, true) => s.push_str("Interrupted before the first bad commit was known.\n\n"),
        (None, false) => s.push_str(&format!(
            "Skipped candidates leave a range: the first bad commit is one of {}.\n\n",
            r.range.iter().map(|c| format!("`{}`", short(c))).collect::<Vec<_>>().join(", ")
        )),
    }
    s.push_str("| commit | subject | verdict | failing | rate (B/iteration) | wall |\n|---|---|---|---|---|---|\n");
    for c in &r.candidates {
        s.push_str(&format!(
            "| `{}` | {} | {} | {} | {} | {:.0} s |\n",
            short(&c.commit),
            c.subject.replace('|', "\\|"),
            c.skipped.as_ref().map_or(c.verdict.clone(), |w| format!("skipped: {}", w.replace('|', "\\|"))),
            c.failing.join(", "),
            c.rate_per_iteration.map_or(String::new(), |x| format!("{x:.0}")),
            c.wall_s
        ));
    }
    s
}

/// A page linking each candidate's run directory and report.
fn html(r: &Report) -> String {
    use plateau_reports::html::escape;
    let head = match &r.first_bad {
        Some(sha) => format!("First bad commit: <code>{}</code>", escape(sha)),
        None if r.interrupted => "Interrupted".to_string(),
        None => format!("Undecided between {} commits (skips)", r.range.len()),
    };
    let rows: String = r
        .candidates
        .iter()
        .map(|c| {
            let run = Path::new(&c.run_dir);
            let rel = run.strip_prefix(run.parent().and_then(Path::parent).unwrap_or(run)).unwrap_or(run);
            format!(
                "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td><a href=\"{}/report.html\">report</a></td></tr>\n",
                escape(short(&c.commit)),
                escape(&c.subject),
                escape(&c.skipped.as_ref().map_or(c.verdict.clone(), |w| format!("skipped: {w}"))),
                escape(&c.failing.join(", ")),
                escape(&rel.display().to_string())
            )
        })
        .collect();
    format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\"><title>plateau bisect</title></head><body><h1>{head}</h1><table><tr><th>commit</th><th>subject</th><th>verdict</th><th>failing</th><th>run</th></tr>\n{rows}</table></body></html>\n"
    )
}
