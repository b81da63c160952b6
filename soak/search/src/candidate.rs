//! A shrink's candidates: each a scenario (TOML) run by `plateau run` in a child process with the
//! original run's seed, injections and target, judged by its own verdict.json.
//!
//! Lifecycle: a batch of candidates comes in (one ddmin round); each is rendered to text, and a
//! text seen before is answered from the record without running; a text that is not a valid
//! scenario is recorded as such (it cannot fail the same way); the rest run `jobs` at a time,
//! each in candidates/NNN/ of the shrink's directory, numbered in the batch's order so that the
//! record reads the same however many ran at once. After the budget runs out nothing more runs:
//! candidates are answered "not run", which no ddmin step takes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use plateau_reports::{Status, Verdict};
use toml::Table;

use plateau_shell::children::{Ended, INTERRUPTED};

use super::Origin;

/// What failed in the run being shrunk, and so what a candidate must fail on to fail the same way:
/// the exact layer's failures (registries, idle self-checks) where there are any, since they are
/// decided without statistics at the first iteration they appear; else the failing gauges. With
/// no metrics named, any failure of the exact layer (`exact`) or any failure at all.
#[derive(Debug, Clone)]
pub struct Signature {
    pub metrics: Vec<String>,
    pub exact: bool,
}

impl Signature {
    pub fn of(v: &Verdict) -> Option<Signature> {
        let failing = |exact: bool| -> Vec<String> {
            v.metrics
                .iter()
                .filter(|m| m.status == Status::Fail && is_exact(&m.kind) == exact)
                .map(|m| m.name.clone())
                .collect()
        };
        let exact = failing(true);
        if !exact.is_empty() {
            return Some(Signature { metrics: exact, exact: true });
        }
        // The most specific failing gauge: memory outside the allocator, else the live heap, else
        // whatever failed (a server's process memory). A gauge that follows from another (RSS
        // from the heap) would let a candidate that fails another way (a cache filling slowly in
        // a small workload) pass for this leak.
        let gauges = failing(false);
        let specific = ["anon_outside_heap", "jemalloc.allocated"]
            .iter()
            .map(|tail| gauges.iter().filter(|g| g.ends_with(tail)).cloned().collect::<Vec<_>>())
            .find(|g| !g.is_empty())
            .unwrap_or(gauges);
        (!specific.is_empty()).then_some(Signature { metrics: specific, exact: false })
    }

    /// Any failure of the exact layer.
    pub fn any_exact() -> Signature {
        Signature { metrics: Vec::new(), exact: true }
    }

    /// Any failure at all, of the exact layer or a gauge (`plateau fuzz`: what a case must not do).
    pub fn any() -> Signature {
        Signature { metrics: Vec::new(), exact: false }
    }

    fn covers(&self, m: &plateau_reports::MetricVerdict) -> bool {
        if self.metrics.is_empty() {
            !self.exact || is_exact(&m.kind)
        } else {
            self.metrics.contains(&m.name)
        }
    }

    /// How a verdict judged the signature's metrics ("registry.sequences: pass"); for any
    /// exact-layer failure, the exact-layer metrics it failed on.
    pub fn judged(&self, v: &Verdict) -> Vec<String> {
        v.metrics
            .iter()
            .filter(|m| self.covers(m) && (m.status == Status::Fail || !self.metrics.is_empty()))
            .map(|m| format!("{}: {}", m.name, m.status.as_str()))
            .collect()
    }

    /// The signature's metrics a verdict fails on.
    pub fn matched(&self, v: &Verdict) -> Vec<String> {
        v.metrics.iter().filter(|m| m.status == Status::Fail && self.covers(m)).map(|m| m.name.clone()).collect()
    }
}

/// The exact layer's kinds: decided without statistics.
fn is_exact(kind: &str) -> bool {
    matches!(kind, "per_request" | "bounded" | "counter" | "check")
}

/// One candidate's result, as the story and shrink.json give it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Record {
    pub id: usize,
    /// What this candidate changed from the best failing scenario so far.
    pub change: String,
    /// pass, fail, inconclusive; "invalid" (not a scenario), "error" (exit 2 or 3), or
    /// "not run" (the budget was spent, or plateau was told to stop).
    pub verdict: String,
    /// It failed on a metric of the signature.
    pub same_way: bool,
    /// The metrics it failed on.
    pub failing: Vec<String>,
    /// The signature's metrics and how this candidate judged them ("registry.sequences: pass").
    pub signature: Vec<String>,
    pub iterations: u64,
    pub secs: f64,
    /// Why it did not run or did not end in a verdict.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub note: String,
    /// The metrics its control run (the same candidate without the injections) failed on: the
    /// server or engine grows on its own there, a finding of its own.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub control_failing: Vec<String>,
}

impl Record {
    /// Whether the candidate ran to a verdict: only then does it say anything about its scenario.
    pub fn judged(&self) -> bool {
        matches!(self.verdict.as_str(), "pass" | "fail" | "inconclusive")
    }
}

/// How candidates run: with the original run's seed, flags and target, into `dir`.
pub struct Setup<'a> {
    pub exe: PathBuf,
    pub origin: &'a Origin,
    pub seed: u64,
    pub signature: Signature,
    pub dir: PathBuf,
    /// Candidates running at once (at least 1).
    pub jobs: usize,
    /// No candidate starts after this.
    pub deadline: Instant,
    /// Set by SIGTERM or SIGINT (`plateau_shell::children`): running candidates are stopped, and
    /// no more start.
    pub stop: Arc<AtomicBool>,
    pub quiet: bool,
    /// How a progress line names a candidate: "shrink: candidate", "fuzz: case".
    pub label: &'static str,
    /// Each child goes on past its length while its verdict is undecided (`run --until-decided`,
    /// up to four times the length): a fuzz case is judged as a run is.
    pub until_decided: bool,
}

/// Runs candidates and keeps their record.
pub struct Runner<'a> {
    pub setup: Setup<'a>,
    pub records: Vec<Record>,
    /// Candidate text to its record's index.
    seen: BTreeMap<String, usize>,
    /// The budget ran out at least once: the result may not be minimal.
    pub out_of_budget: bool,
    /// plateau was told to stop (SIGTERM, SIGINT): what was decided so far is all there is.
    pub interrupted: bool,
}

/// What one child run needs, prepared before the batch runs in parallel.
struct Job {
    record: usize,
    text: String,
    iterations: u64,
}

impl<'a> Runner<'a> {
    pub fn new(setup: Setup<'a>) -> Self {
        Runner { setup, records: Vec::new(), seen: BTreeMap::new(), out_of_budget: false, interrupted: false }
    }

    /// Judges a batch: for each (change, scenario), whether it fails the same way. Returns the
    /// record index of each too.
    pub fn judge(&mut self, batch: &[(String, Table)]) -> Vec<(bool, usize)> {
        let mut jobs = Vec::new();
        let mut answer = Vec::with_capacity(batch.len());
        for (change, doc) in batch {
            let text = super::features::render(doc);
            if let Some(&k) = self.seen.get(&text) {
                answer.push(k);
                continue;
            }
            let iterations = super::features::length(doc).unwrap_or(0);
            let mut rec = Record {
                id: self.records.len(),
                change: change.clone(),
                verdict: String::new(),
                same_way: false,
                failing: Vec::new(),
                signature: Vec::new(),
                iterations,
                secs: 0.0,
                note: String::new(),
                control_failing: Vec::new(),
            };
            if let Err(e) = plateau_scenario::Scenario::parse(&text, "candidate.toml") {
                rec.verdict = "invalid".into();
                rec.note = e.to_string();
            } else if self.setup.stop.load(Ordering::SeqCst) {
                rec.verdict = "not run".into();
                rec.note = INTERRUPTED.into();
                self.interrupted = true;
            } else if Instant::now() >= self.setup.deadline {
                rec.verdict = "not run".into();
                rec.note = "the budget was spent".into();
                self.out_of_budget = true;
            } else {
                jobs.push(Job { record: rec.id, text: text.clone(), iterations });
            }
            self.seen.insert(text, rec.id);
            answer.push(rec.id);
            self.records.push(rec);
        }
        self.run_all(jobs);
        self.interrupted |= self.setup.stop.load(Ordering::SeqCst);
        answer.into_iter().map(|k| (self.records[k].same_way, k)).collect()
    }

    /// Runs the jobs `self.jobs` at a time and fills their records.
    fn run_all(&mut self, jobs: Vec<Job>) {
        let next = AtomicUsize::new(0);
        let done: Vec<Mutex<Option<Record>>> = jobs.iter().map(|_| Mutex::new(None)).collect();
        let this = &self.setup;
        let records = &self.records;
        std::thread::scope(|scope| {
            for _ in 0..this.jobs.max(1).min(jobs.len()) {
                scope.spawn(|| loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let Some(job) = jobs.get(k) else { break };
                    let rec = this.run_one(records[job.record].clone(), job);
                    if !this.quiet {
                        plateau_shell::errln!(
                            "plateau: {} {} ({}): {}{} in {:.1} s",
                            this.label,
                            rec.id,
                            rec.change,
                            rec.verdict,
                            if rec.same_way { ", fails the same way" } else { "" },
                            rec.secs
                        );
                    }
                    *done[k].lock().expect("no job panics holding the lock") = Some(rec);
                });
            }
        });
        for slot in done {
            if let Some(rec) = slot.into_inner().expect("no job panics holding the lock") {
                let id = rec.id;
                self.records[id] = rec;
            }
        }
    }
}

impl Setup<'_> {
    fn run_one(&self, mut rec: Record, job: &Job) -> Record {
        let dir = self.dir.join("candidates").join(format!("{:03}", rec.id));
        let scenario = dir.join("scenario.toml");
        if let Err(e) = std::fs::create_dir_all(&dir).and_then(|_| std::fs::write(&scenario, &job.text)) {
            rec.verdict = "error".into();
            rec.note = format!("{}: {e}", dir.display());
            return rec;
        }
        let t0 = Instant::now();
        let judged = self.run_child(&scenario, job.iterations, &dir.join("run"), &self.origin.flags);
        rec.secs = t0.elapsed().as_secs_f64();
        let v = match judged {
            Ok(v) => v,
            Err(e) => {
                rec.verdict = if e == INTERRUPTED { "not run" } else { "error" }.into();
                rec.note = e;
                return rec;
            }
        };
        rec.failing = v.metrics.iter().filter(|m| m.status == Status::Fail).map(|m| m.name.clone()).collect();
        rec.same_way = !self.signature.matched(&v).is_empty();
        rec.signature = self.signature.judged(&v);
        rec.verdict = v.verdict.as_str().to_string();
        rec.iterations = v.iterations;
        // A gauge that fails with the injections switched off too is the workload's growth (a
        // cache a small workload fills slowly), not the leak's: the control run tells them apart.
        let clean_flags = without_injections(&self.origin.flags);
        if rec.same_way && !self.signature.exact && clean_flags.len() < self.origin.flags.len() {
            let control = self.run_child(&scenario, job.iterations, &dir.join("control"), &clean_flags);
            rec.secs = t0.elapsed().as_secs_f64();
            match control {
                Ok(c) if !self.signature.matched(&c).is_empty() => {
                    rec.same_way = false;
                    rec.control_failing =
                        c.metrics.iter().filter(|m| m.status == Status::Fail).map(|m| m.name.clone()).collect();
                    rec.note = format!(
                        "{} fails without the injection too: the workload's own growth, not the leak's",
                        self.signature.matched(&c).join(", ")
                    );
                }
                Ok(_) => {}
                Err(e) => {
                    rec.same_way = false;
                    rec.note = format!("its control run without the injection did not end in a verdict: {e}");
                }
            }
        }
        rec
    }

    /// Runs one child `plateau run` of `scenario` with `flags` into `out` and reads its verdict.
    fn run_child(&self, scenario: &Path, iterations: u64, out: &Path, flags: &[String]) -> Result<Verdict, String> {
        let mut cmd = Command::new(&self.exe);
        cmd.arg("run").arg(scenario).args(["--seed", &self.seed.to_string()]);
        cmd.args(["--iterations", &iterations.max(1).to_string(), "--quiet", "--no-replay"]);
        cmd.arg("--out").arg(out).args(flags);
        if self.signature.exact || self.until_decided {
            // An exact-layer failure is decided at the first quiescent point that shows it.
            cmd.arg("--stop-on-exact-failure");
        }
        if self.until_decided {
            cmd.arg("--until-decided");
        }
        if self.origin.target.is_some() {
            let (url, spawn) = self.origin.own_server();
            cmd.args(["--target", &url]);
            if let Some(s) = spawn {
                cmd.args(["--spawn", &s]);
            }
        }
        let ended = plateau_shell::children::run(&mut cmd, true, &self.stop)
            .map_err(|e| format!("cannot run {}: {e}", self.exe.display()))?;
        let Ended::Exited { status, stderr, .. } = ended else { return Err(INTERRUPTED.into()) };
        match (status.code(), read_verdict(out)) {
            (Some(0 | 1 | 4), Ok(v)) => Ok(v),
            (code, _) => {
                let err = String::from_utf8_lossy(&stderr);
                Err(format!(
                    "exit {}: {}",
                    code.map_or("by a signal".to_string(), |c| c.to_string()),
                    err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("")
                ))
            }
        }
    }
}

/// The flags without their `--inject NAME` pairs.
fn without_injections(flags: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(flags.len());
    let mut it = flags.iter();
    while let Some(f) = it.next() {
        if f == "--inject" {
            it.next();
        } else {
            out.push(f.clone());
        }
    }
    out
}

/// A run directory's verdict, through the one loader: verdict.json while it judged exactly the
/// samples beside it, else judged again (and said so).
pub fn read_verdict(dir: &Path) -> Result<Verdict, String> {
    let run = plateau_analysis::load_run(dir)?;
    if let (Some(why), true) = (&run.judged_again, run.had_verdict) {
        plateau_shell::errln!("plateau: {why}: judged again from samples.jsonl");
    }
    Ok(run.verdict)
}
