//! `plateau bisect`: the commit, or the release of a server, that made a soak fail (or, with
//! `--find fix`, the first that made it pass again).
//!
//! Lifecycle of a bisect:
//! 1. Check the input ([`subject::Subject::plan`]): a git repository and two commits, the old end
//!    an ancestor of the new one; or a list of releases, oldest first, and a setup command; a
//!    `run` command whose `--out` bisect chooses (bad input exits 2 before anything is soaked).
//! 2. List the candidates: the commits after the old end up to the new end, on the paths
//!    between them, oldest first; or the releases after the first up to the last.
//! 3. Soak both ends (side by side with `--jobs 2` or more): looking for a regression the old end
//!    must pass and the new end fail; looking for a fix, the other way round; else there is
//!    nothing to bisect (exit 2, with that end's verdict).
//! 4. Soak candidates as [`search::Search`] picks them, up to `--jobs` at once. Each candidate is
//!    made ready (a commit checked out in a scratch `git worktree`, the user's checkout, index and
//!    HEAD never touched, and built with `--build` there; a release set up by `--setup`, which
//!    prints the command that serves it) and soaked with `{worktree}`, or `{serve}` and
//!    `{version}`, and `{port}` (a free port of its own) filled into the command. An undecided
//!    soak runs again with `--until-decided`; still undecided, a failed build or setup or a
//!    harness failure skips the candidate, with why.
//! 5. Write bisect.json, story.md and report.html, and remove every worktree, whatever ended the
//!    bisect (success, failure, Ctrl-C between rounds).

// The harness's allocator in this crate's unit tests, as the `plateau` binary has it (the
// tests read jemalloc's statistics and arenas).
#[cfg(test)]
plateau_probes::install_harness_allocator!();

pub mod git;
pub mod index;
pub mod search;
mod story;
pub mod subject;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use plateau_reports::{Status, Verdict};
use plateau_shell::children::{Ended, INTERRUPTED};
use serde::Serialize;

use search::{Found, Outcome, Search};
pub use subject::Subject;
use subject::{Plan, Prepared};

/// Candidates a bisect may list: far more than a night's commits, and a bound on its work (a
/// search over them soaks about log2 of this many).
const MAX_CANDIDATES: usize = 10_000;

/// What the bisect looks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Find {
    /// The first candidate whose soak fails, after one that passes.
    Regression,
    /// The first candidate whose soak passes, after one that fails.
    Fix,
}

impl Find {
    pub fn name(self) -> &'static str {
        match self {
            Find::Regression => "regression",
            Find::Fix => "fix",
        }
    }

    /// The verdicts of the old end and of the new end.
    fn ends(self) -> (&'static str, &'static str) {
        match self {
            Find::Regression => ("pass", "fail"),
            Find::Fix => ("fail", "pass"),
        }
    }
}

pub struct BisectOptions {
    pub subject: Subject,
    pub find: Find,
    pub out: PathBuf,
    pub jobs: usize,
    /// `run SCENARIO ARGS...`, with `{worktree}` (or `{serve}` and `{version}`) and `{port}`.
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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub subject: String,
    /// pass, fail, inconclusive, or skipped.
    pub verdict: String,
    pub exit_code: Option<i32>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failing: Vec<String>,
    /// The first failing metric's rate (per iteration), where one failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_per_iteration: Option<f64>,
    /// The first failing metric's rate per request, where the run counted requests.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_per_request: Option<f64>,
    /// The allocation site its verdict named first for that metric.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub site: Option<String>,
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

impl Soaked {
    /// The commit or the release.
    pub fn id(&self) -> &str {
        self.commit.as_deref().or(self.version.as_deref()).unwrap_or_default()
    }
}

/// What a bisect found, as its exit code says: 0 the first candidate that changed, 4 a range
/// left by skips (or an interrupt), 3 no candidate could be judged at all.
#[derive(Debug, Serialize)]
pub struct Report {
    /// `regression` or `fix`.
    pub find: String,
    /// The first that fails (looking for a regression).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_bad: Option<String>,
    /// The first that passes again (looking for a fix).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_good: Option<String>,
    /// Where skips left the answer: the first that changed is one of these.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub range: Vec<String>,
    pub good: String,
    pub bad: String,
    pub candidates: Vec<Soaked>,
    pub interrupted: bool,
    pub wall_s: f64,
    pub exit_code: u8,
}

impl Report {
    /// The first candidate that changed, whichever way was sought.
    pub fn first(&self) -> Option<&String> {
        self.first_bad.as_ref().or(self.first_good.as_ref())
    }
}

/// Checks the input and lists the candidates (steps 1 and 2).
pub fn plan(o: &BisectOptions) -> Result<Plan, BisectError> {
    match o.command.first().map(String::as_str) {
        Some("run") if o.command.len() >= 2 => {}
        _ => {
            return Err(BisectError::Input(format!(
                "after --, give the soak: run SCENARIO ARGS... ({} and {{port}} are filled per candidate)",
                o.subject.placeholder()
            )))
        }
    }
    if o.command.iter().any(|a| a == "--out" || a.starts_with("--out=")) {
        return Err(BisectError::Input(
            "the soak's --out: bisect writes each candidate's run under its own --out".into(),
        ));
    }
    if o.subject.is_releases() && !o.command.iter().any(|a| a.contains("{serve}")) {
        return Err(BisectError::Input(
            "the soak never uses {serve} (the command --setup prints): every release would soak the same server; give --spawn \"{serve} ... {port}\"".into(),
        ));
    }
    o.subject.plan(MAX_CANDIDATES)
}

/// Runs the bisect (steps 3 to 5).
pub fn bisect(o: &BisectOptions) -> Result<Report, BisectError> {
    let t0 = Instant::now();
    let plan = plan(o)?;
    let (list, old, new) = (&plan.list, plan.old.clone(), plan.new_end().to_string());
    std::fs::create_dir_all(o.out.join("runs"))
        .map_err(|e| BisectError::Input(format!("--out {}: {e}", o.out.display())))?;
    let scratch = o.out.join("worktrees");
    let runner = Runner { o, plan: &plan, scratch: &scratch, git_lock: Mutex::new(()) };
    let what = if o.subject.is_releases() { "releases" } else { "candidates" };
    say(o, &format!("bisect: {} {what} after {} up to {}", list.len(), short(&old), short(&new)));
    // The ends first: the old end as it was, the new end changed.
    let ends = runner.soak_all(&[(&old, "old end"), (&new, "new end")]);
    let (want_old, want_new) = o.find.ends();
    for (end, first, want) in [(&ends[0], true, want_old), (&ends[1], false, want_new)] {
        if end.verdict != want && !o.interrupt.load(Ordering::SeqCst) {
            return Err(BisectError::Input(format!(
                "{} did not {want} its soak: {} (exit {}): {}; its run is in {} (looking for a {}: the older end must {want_old}, the newer {want_new})",
                o.subject.end(first, end.id()),
                end.verdict,
                end.exit_code.map_or("none".into(), |c| c.to_string()),
                end.skipped.as_deref().unwrap_or(&end.summary),
                end.run_dir,
                o.find.name()
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
        let probes: Vec<(&String, &str)> = next.iter().map(|&i| (&list[i], "candidate")).collect();
        let results = runner.soak_all(&probes);
        // A soak cut short by the stop says nothing of its candidate: it is not recorded.
        if o.interrupt.load(Ordering::SeqCst) {
            interrupted = true;
            break;
        }
        for (i, r) in next.iter().zip(results) {
            // The search's Good is "as the old end", its Bad "changed as the new end".
            let outcome = match (r.verdict.as_str(), &r.skipped) {
                (v, None) if v == want_old => Outcome::Good,
                (v, None) if v == want_new => Outcome::Bad,
                (_, why) => Outcome::Skip(why.clone().unwrap_or_else(|| r.verdict.clone())),
            };
            s.record(*i, outcome);
            soaked.push((Some(*i), r));
        }
    }
    let found = if interrupted { None } else { s.found() };
    let (first, range, exit_code) = match &found {
        Some(Found::FirstBad(i)) => (Some(list[*i].clone()), Vec::new(), 0),
        Some(Found::Range { from, to }) => {
            let judged_any = soaked.iter().any(|(i, r)| i.is_some_and(|i| i + 1 < list.len()) && r.skipped.is_none());
            let tried = soaked.iter().filter(|(i, _)| i.is_some_and(|i| i + 1 < list.len())).count();
            (None, list[*from..=*to].to_vec(), if !judged_any && tried > 0 { 3 } else { 4 })
        }
        None => (None, Vec::new(), 4),
    };
    soaked.sort_by_key(|(i, _)| i.map_or(-1, |i| i as i64));
    let candidates: Vec<Soaked> = soaked.into_iter().map(|(_, r)| r).collect();
    let (good, bad) = if o.find == Find::Regression { (old, new) } else { (new, old) };
    let (first_bad, first_good) = if o.find == Find::Regression { (first, None) } else { (None, first) };
    let report = Report {
        find: o.find.name().into(),
        first_bad,
        first_good,
        range,
        good,
        bad,
        candidates,
        interrupted,
        wall_s: t0.elapsed().as_secs_f64(),
        exit_code,
    };
    story::write_outputs(o, &plan, &report).map_err(BisectError::Harness)?;
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(report)
}

fn say(o: &BisectOptions, line: &str) {
    if !o.quiet {
        plateau_shell::errln!("plateau: {line}");
    }
}

/// A commit as people read it (its first 10 hex digits); a release whole.
pub fn short(id: &str) -> &str {
    if id.len() == 40 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
        &id[..10]
    } else {
        id
    }
}

struct Runner<'a> {
    o: &'a BisectOptions,
    plan: &'a Plan,
    scratch: &'a Path,
    /// Worktrees are added and removed one at a time: git locks its worktree list.
    git_lock: Mutex<()>,
}

impl Runner<'_> {
    /// Soaks each candidate, up to `jobs` at once, in the order given.
    fn soak_all(&self, ids: &[(&String, &str)]) -> Vec<Soaked> {
        let mut out = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(self.o.jobs.max(1)) {
            let results: Vec<Soaked> = std::thread::scope(|s| {
                let handles: Vec<_> = chunk.iter().map(|(id, what)| s.spawn(move || self.soak(id, what))).collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap_or_else(|_| panic!("a candidate's thread panicked")))
                    .collect()
            });
            out.extend(results);
        }
        out
    }

    /// One candidate: made ready, soaked (again with --until-decided when undecided).
    fn soak(&self, id: &str, what: &str) -> Soaked {
        let t0 = Instant::now();
        let run_dir = self.o.out.join("runs").join(short(id));
        let releases = self.o.subject.is_releases();
        let mut r = Soaked {
            commit: (!releases).then(|| id.to_string()),
            version: releases.then(|| id.to_string()),
            subject: self.o.subject.describe(self.plan, id),
            verdict: "skipped".into(),
            exit_code: None,
            failing: Vec::new(),
            rate_per_iteration: None,
            rate_per_request: None,
            site: None,
            wall_s: 0.0,
            run_dir: run_dir.display().to_string(),
            skipped: None,
            summary: String::new(),
            rates: Vec::new(),
        };
        if let Err(why) = self.prepare_and_soak(id, &run_dir, &mut r) {
            r.verdict = "skipped".into();
            r.skipped = Some(why);
        }
        r.wall_s = t0.elapsed().as_secs_f64();
        let how = r.skipped.as_ref().map_or(r.verdict.clone(), |w| format!("skipped: {w}"));
        let subject = if r.subject.is_empty() { String::new() } else { format!(" {:?}", r.subject) };
        say(self.o, &format!("{what} {}{subject}: {how} ({:.0} s)", short(id), r.wall_s));
        r
    }

    fn prepare_and_soak(&self, id: &str, run_dir: &Path, r: &mut Soaked) -> Result<(), String> {
        let logs = beside(run_dir, "logs");
        std::fs::create_dir_all(&logs).map_err(|e| format!("{}: {e}", logs.display()))?;
        let ready = self.o.subject.prepare(self.plan, id, self.scratch, &logs, &self.git_lock, &self.o.interrupt)?;
        let mut code = self.run_plateau(&ready, run_dir, &logs.join("soak.log"), false)?;
        let mut dir = run_dir.to_path_buf();
        if code == 4 && !self.o.command.iter().any(|a| a == "--until-decided") {
            dir = beside(run_dir, "longer");
            code = self.run_plateau(&ready, &dir, &logs.join("soak-longer.log"), true)?;
        }
        drop(ready);
        r.exit_code = Some(code);
        r.run_dir = dir.display().to_string();
        let verdict: Option<Verdict> = plateau_reports::fsutil::read_run_json(&dir.join("verdict.json"));
        if let Some(v) = &verdict {
            read_verdict(v, r);
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

    /// `plateau run ...` for one candidate into `out`; its exit code.
    fn run_plateau(&self, ready: &Prepared, out: &Path, log: &Path, longer: bool) -> Result<i32, String> {
        let port = free_port()?.to_string();
        let fill = |a: &String| {
            let filled = ready.fill.iter().fold(a.clone(), |acc, (k, v)| acc.replace(k, v));
            filled.replace("{port}", &port)
        };
        let mut args: Vec<String> = self.o.command.iter().map(fill).collect();
        args.extend(["--out".to_string(), out.display().to_string(), "--quiet".to_string()]);
        if longer {
            args.push("--until-decided".into());
        }
        let file = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
        let mut cmd = Command::new(&self.o.plateau);
        cmd.args(&args).stdout(file.try_clone().map_err(|e| e.to_string())?).stderr(file);
        let status = match plateau_shell::children::run(&mut cmd, false, &self.o.interrupt) {
            Ok(Ended::Exited { status, .. }) => status,
            Ok(Ended::Stopped) => return Err(INTERRUPTED.into()),
            Err(e) => return Err(format!("{}: {e}", self.o.plateau.display())),
        };
        status.code().ok_or_else(|| format!("the soak ended by a signal ({status}); its log: {}", log.display()))
    }
}

/// A candidate's verdict.json: its line, every metric's rate, and the first failing one's rate
/// per iteration and per request, and the first leaking site no known entry accepted.
fn read_verdict(v: &Verdict, r: &mut Soaked) {
    r.summary = v.summary.clone();
    for m in &v.metrics {
        if let Some(t) = &m.trend {
            r.rates.push((m.name.clone(), t.slope_per_iter));
        }
        if m.status == Status::Fail {
            if r.failing.is_empty() {
                r.rate_per_request = m.projected.as_ref().and_then(|p| p.per_request);
            }
            r.failing.push(m.name.clone());
        }
    }
    r.site = v.unknown_leaks().find_map(|s| s.site.clone());
    r.rate_per_iteration = r.failing.first().and_then(|f| r.rates.iter().find(|(n, _)| n == f)).map(|x| x.1);
}

/// `DIR.SUFFIX` beside a candidate's run directory: its name kept whole (a release's dots are no
/// extension: `1.3.0.logs`, never `1.3.logs`, which 1.3.1's would share).
fn beside(run_dir: &Path, suffix: &str) -> PathBuf {
    let mut name = run_dir.as_os_str().to_owned();
    name.push(format!(".{suffix}"));
    PathBuf::from(name)
}

fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("a free port: {e}"))?;
    l.local_addr().map(|a| a.port()).map_err(|e| format!("a free port: {e}"))
}
