//! `plateau shrink`: from a failing run, the smallest scenario that still fails the same way, and
//! what the leak needs.
//!
//! A run replays from its seed, so a soak can be reduced as a test case is. Lifecycle:
//! 1. Read the run: its verdict (seed, length, what failed: the [`Signature`]), the scenario as it
//!    was read (`scenario.toml`) and the command as typed (`command.json`, parsed by the CLI into
//!    an [`Origin`]: injections, flags, target).
//! 2. Run the original again at its length (candidate 0): it must fail the same way, or there is
//!    nothing to shrink from.
//! 3. For an exact-layer failure (a registry, an idle self-check: decided at the first iteration
//!    it appears, candidates stop there), halve the length first, so every later candidate is short.
//!    Not against an external server: there when an abort lands is a race, so such a failure keeps
//!    the planned length (a run that ended early, e.g. a sleep refused with orphans in flight, is
//!    replayed at the length it planned, not where it ended).
//! 4. Drop phases, by ddmin over the phases.
//! 5. Turn request features off (images, n>1, aborts by stage, stop tokens, max_tokens = 1,
//!    invalid requests, shared prefixes, deep sleep, weight updates, P/D), by ddmin over the
//!    features the remaining phases use; first all of them at once.
//! 6. Halve the requests of every batch phase while it still fails, then the length (for a gauge,
//!    down to the detector's resolution: warm-up plus its minimum of points).
//! 7. Check each phase and feature kept: without it alone the scenario passes (1-minimality, the
//!    story's "passes with n = 1").
//!
//! A candidate that becomes inconclusive, refuses to run or is invalid counts as not failing.
//! Outputs in the shrink's directory: minimal.toml, story.md, shrink.json, candidates/NNN/.

// The harness's allocator in this crate's unit tests, as the `plateau` binary has it (the
// tests read jemalloc's statistics and arenas).
#[cfg(test)]
plateau_probes::install_harness_allocator!();

mod candidate;
pub mod ddmin;
pub mod features;
pub mod fuzz;
mod story;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use toml::Table;

pub use candidate::{read_verdict, Record, Signature};
use candidate::{Runner, Setup};
use features::Feature;

/// The scenario as the run read it, written into the run directory.
pub const SCENARIO_FILE: &str = "scenario.toml";
/// The command line of the run, as a JSON list of arguments.
pub const COMMAND_FILE: &str = "command.json";

/// What a run was asked to be beyond its scenario, from its command line.
#[derive(Debug, Clone, Default)]
pub struct Origin {
    /// The scenario as given (a path or a shipped name).
    pub scenario: String,
    pub injections: Vec<String>,
    /// Flags passed on to every candidate as given (backend, injections, warm-up, tolerance,
    /// sampling, the target's settings), without the target and its command.
    pub flags: Vec<String>,
    pub target: Option<String>,
    pub spawn: Option<String>,
}

/// The flags of `plateau run` that start a process, shape what a started one runs, choose a
/// process to probe or a file to read: what a run directory records of them (command.json) is
/// never used by `shrink` or `bisect` unless the user trusts the directory (`--trust-run-dir`);
/// `--spawn` may also be given again. Every other flag of `run` is data (a test of the `plateau`
/// binary puts each of `run`'s flags in this list or among the data, so a new flag is decided).
pub const FLAGS_THAT_RUN: [&str; 5] = ["--spawn", "--topology", "--spawn-env", "--pid", "--metrics-map"];

/// What a flag of [`FLAGS_THAT_RUN`] would do, for the refusal.
fn what_it_runs(flag: &str) -> &'static str {
    match flag {
        "--topology" => "a deployment whose processes plateau starts",
        "--spawn-env" => "the environment of the server plateau starts: PATH, LD_PRELOAD, PYTHONPATH choose what runs",
        "--pid" => "a process of this machine to probe",
        "--metrics-map" => "a file of this machine to read",
        _ => "a command plateau runs",
    }
}

impl Origin {
    /// Takes a run directory's recorded command as safe to run again, or refuses: a run directory
    /// can come from anywhere (a CI artifact, a colleague's archive), and the `--spawn` command or
    /// `--topology` file its command.json records would run as the user. `spawn` (the user's
    /// `--spawn`, given again) replaces the recorded command; `trust` (`--trust-run-dir`) runs
    /// what is recorded. Errors name the command and both ways on.
    pub fn trusted(&mut self, spawn: Option<String>, trust: bool, run_dir: &std::path::Path) -> Result<(), String> {
        if let Some(s) = spawn {
            if self.target.is_none() {
                return Err(format!(
                    "--spawn: the run in {} soaked plateau's own engine, not a server",
                    run_dir.display()
                ));
            }
            self.spawn = Some(s);
        } else if let (Some(s), false) = (&self.spawn, trust) {
            return Err(format!(
                "{}: its command.json records --spawn '{s}': a command from a run directory is never run unasked; give it again with --spawn '...' (the same or another), or --trust-run-dir to run what the directory records",
                run_dir.display()
            ));
        }
        if trust {
            return Ok(());
        }
        let mut pairs = self.flags.iter().zip(self.flags.iter().skip(1));
        if let Some((flag, value)) = pairs.find(|(f, _)| FLAGS_THAT_RUN.contains(&f.as_str())) {
            return Err(format!(
                "{}: its command.json records {flag} '{value}' ({}): what a run directory records is never used unasked; give --trust-run-dir to use it",
                run_dir.display(),
                what_it_runs(flag)
            ));
        }
        Ok(())
    }

    /// The port of the target's URL, as written (`http://127.0.0.1:8000/...` gives "8000").
    fn port(&self) -> Option<&str> {
        let url = self.target.as_deref()?;
        let rest = url.split_once("://").map_or(url, |p| p.1);
        let host_port = rest.split('/').next()?;
        let port = host_port.rsplit_once(':')?.1;
        (!port.is_empty() && port.bytes().all(|b| b.is_ascii_digit())).then_some(port)
    }

    /// Whether each candidate can start its own server: the spawn command names the target's
    /// port, so a fresh port can be put in both.
    pub fn own_servers(&self) -> bool {
        match (self.port(), &self.spawn) {
            (Some(port), Some(cmd)) => !port_spans(cmd, port).is_empty(),
            _ => false,
        }
    }

    /// The target and spawn command for one candidate: a free port in both where the command
    /// names the port ([`Origin::own_servers`]), else as given.
    pub fn own_server(&self) -> (String, Option<String>) {
        let url = self.target.clone().unwrap_or_default();
        let (Some(port), Some(cmd), true) = (self.port(), &self.spawn, self.own_servers()) else {
            return (url, self.spawn.clone());
        };
        let Some(fresh) = free_port() else { return (url, self.spawn.clone()) };
        let fresh = fresh.to_string();
        let url = url.replacen(&format!(":{port}"), &format!(":{fresh}"), 1);
        let mut cmd = cmd.clone();
        for (a, b) in port_spans(&cmd, port).into_iter().rev() {
            cmd.replace_range(a..b, &fresh);
        }
        (url, Some(cmd))
    }
}

/// Where `port` stands in `cmd` as a whole number (not inside a longer one).
fn port_spans(cmd: &str, port: &str) -> Vec<(usize, usize)> {
    let b = cmd.as_bytes();
    cmd.match_indices(port)
        .map(|(i, _)| (i, i + port.len()))
        .filter(|&(a, z)| (a == 0 || !b[a - 1].is_ascii_digit()) && (z == b.len() || !b[z].is_ascii_digit()))
        .collect()
}

fn free_port() -> Option<u16> {
    std::net::TcpListener::bind("127.0.0.1:0").ok()?.local_addr().ok().map(|a| a.port())
}

pub struct ShrinkOptions {
    pub run_dir: PathBuf,
    pub out_dir: PathBuf,
    pub jobs: usize,
    pub budget: Duration,
    /// The `plateau` binary the candidates run.
    pub exe: PathBuf,
    pub quiet: bool,
    /// Set by SIGTERM or SIGINT: candidates stop, what was found so far is written (exit 4).
    pub stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

#[derive(Debug, thiserror::Error)]
pub enum ShrinkError {
    /// Not a failing run plateau can read (exit 2).
    #[error("{0}")]
    Input(String),
    /// The original did not fail again, or the candidates could not be run (exit 3).
    #[error("{0}")]
    Harness(String),
    /// The budget ran out before anything was decided (exit 4).
    #[error("{0}")]
    Undecided(String),
    /// The run fails without its injections too: the server or engine under test grows on its
    /// own, a finding of its own (exit 1), not a leak to shrink.
    #[error("{0}")]
    FailsOnItsOwn(String),
}

/// A finished shrink.
pub struct Shrunk {
    pub minimal: Table,
    pub records: Vec<Record>,
    pub story: String,
    pub out_of_budget: bool,
    /// plateau was told to stop before the search ended (exit 4).
    pub interrupted: bool,
    pub secs: f64,
}

/// The scenario document of a run directory: the copy the run wrote, else (a run from before it
/// wrote one) the shipped scenario it names.
pub fn read_scenario(run_dir: &Path, origin: &Origin) -> Result<Table, ShrinkError> {
    let copy = run_dir.join(SCENARIO_FILE);
    let present = std::fs::symlink_metadata(&copy).is_ok();
    let text = match present {
        // A run directory is data: its copy is read as any input is (a regular file, capped).
        true => plateau_reports::fsutil::read_input_text(&copy, plateau_scenario::MAX_SCENARIO_BYTES)
            .map_err(ShrinkError::Input)?,
        false => match plateau_scenario::SHIPPED.iter().find(|(n, _)| *n == origin.scenario) {
            Some((_, t)) => t.to_string(),
            None => {
                return Err(ShrinkError::Input(format!(
                    "{}: missing (a run by an older plateau?), and {} is not a shipped scenario",
                    copy.display(),
                    origin.scenario
                )))
            }
        },
    };
    text.parse::<Table>().map_err(|e| ShrinkError::Input(format!("{}: {e}", copy.display())))
}

/// The state of a shrink: the best (smallest failing) scenario so far.
struct Search<'a> {
    runner: Runner<'a>,
    best: Table,
}

impl Search<'_> {
    /// Judges `(change, scenario)` candidates as one batch; whether each fails the same way.
    fn judge(&mut self, batch: Vec<(String, Table)>) -> Vec<bool> {
        self.runner.judge(&batch).into_iter().map(|(f, _)| f).collect()
    }

    /// Halves what `halve` halves while the result still fails the same way.
    fn halve_while_failing(&mut self, what: &str, halve: impl Fn(&Table) -> Option<Table>) {
        // Each step halves a positive count: at most 64 steps.
        for _ in 0..64 {
            let Some(next) = halve(&self.best) else { break };
            if !self.judge(vec![(format!("halve the {what}"), next.clone())])[0] {
                break;
            }
            self.best = next;
        }
    }

    fn drop_phases(&mut self) {
        let all: Vec<usize> = (0..features::phase_count(&self.best)).collect();
        let base = self.best.clone();
        let kept = ddmin::ddmin(&all, |batch| {
            let docs = batch
                .iter()
                .map(|keep| {
                    (format!("keep phases {}", list(keep.iter().map(|i| i + 1))), features::with_phases(&base, keep))
                })
                .collect();
            self.judge(docs)
        });
        self.best = features::with_phases(&base, &kept);
    }

    fn turn_off_features(&mut self) {
        let all = features::features(&self.best);
        if all.is_empty() {
            return;
        }
        let base = self.best.clone();
        let change = |on: &[Feature]| {
            let off: Vec<String> = all.iter().filter(|f| !on.contains(f)).map(Feature::name).collect();
            format!("turn off {}", off.join(", "))
        };
        let without_all = features::without(&base, &all);
        if self.judge(vec![(change(&[]), without_all.clone())])[0] {
            self.best = without_all;
            return;
        }
        let kept = ddmin::ddmin(&all, |batch| {
            let docs = batch
                .iter()
                .map(|on| {
                    let off: Vec<Feature> = all.iter().filter(|f| !on.contains(f)).cloned().collect();
                    (change(on), features::without(&base, &off))
                })
                .collect();
            self.judge(docs)
        });
        let off: Vec<Feature> = all.iter().filter(|f| !kept.contains(f)).cloned().collect();
        self.best = features::without(&base, &off);
    }
}

/// The run's report.html drawn again, now linking the shrink's story and minimal scenario (its
/// verdict as it was written, replay sites included).
fn link_from_report(run_dir: &Path, verdict: &plateau_reports::Verdict) {
    let drawn = plateau_reports::Samples::read(&run_dir.join("samples.jsonl"))
        .map_err(|e| e.to_string())
        .and_then(|s| plateau_analysis::write_outputs(run_dir, &s, verdict).map_err(|e| e.to_string()));
    if let Err(e) = drawn {
        plateau_shell::errln!("plateau: shrink: warning: {}/report.html not redrawn: {e}", run_dir.display());
    }
}

/// The minimal scenario's name and description say what it is.
fn rename(doc: &mut Table, signature: &Signature, checks: &[story::Check]) {
    let name = doc.get("name").and_then(|v| v.as_str()).unwrap_or("scenario").to_string();
    let needs: Vec<&str> = checks.iter().filter(|c| !c.still_fails).map(|c| c.part.as_str()).collect();
    doc.insert("name".into(), format!("{name}-minimal").into());
    doc.insert(
        "description".into(),
        format!(
            "The smallest part of {name} found that still fails on {}; it needs: {}",
            signature.metrics.join(", "),
            if needs.is_empty() { "any of its requests".to_string() } else { needs.join("; ") }
        )
        .into(),
    );
}

fn list(items: impl Iterator<Item = usize>) -> String {
    items.map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
}

/// The length candidate 0 replays the run at: where it ended, or, for a run that ended before its
/// planned length with an exact-layer failure (a fuzz case stopped at it; a target that refused
/// to go on, e.g. a sleep refused with orphans in flight), the length it planned: candidates stop
/// at the first quiescent point that shows the failure, and against an external server when an
/// abort lands is a race, so the replay must not be cut where the original happened to show it.
fn replay_length(verdict: &plateau_reports::Verdict, signature: &Signature, original: &Table) -> u64 {
    let stopped = verdict.warnings.iter().any(|w| w.contains(plateau_driver::STOPPED_ON_EXACT_FAILURE))
        || (verdict.incomplete && signature.exact);
    let planned = features::length(original).filter(|_| stopped).unwrap_or(0);
    verdict.iterations.max(planned).max(1)
}

/// Candidate 0: the run as it was, from its seed. It must fail the same way again for anything
/// to be shrunk; a stop, a spent budget, a failure without the injections or another outcome
/// end the shrink here, each with its exit.
fn replay_original(search: &mut Search, start: &Table, out_dir: &Path) -> Result<(), ShrinkError> {
    let replayed = search.runner.judge(&[("the run as it was".into(), start.clone())]);
    let first = &search.runner.records[replayed[0].1];
    if first.verdict == "not run" && search.runner.interrupted {
        return Err(ShrinkError::Undecided(format!(
            "interrupted before the run was replayed (candidate 0 {}): nothing was shrunk",
            first.note
        )));
    }
    if first.verdict == "not run" {
        return Err(ShrinkError::Undecided(format!(
            "the budget ran out before the run was replayed (candidate 0 {}): nothing was shrunk; give a larger --budget",
            first.note
        )));
    }
    if !first.control_failing.is_empty() {
        return Err(ShrinkError::FailsOnItsOwn(format!(
            "the run fails without its injections too (on {}): the server or engine under test grows on its own; see {}",
            first.control_failing.join(", "),
            out_dir.join("candidates").join(format!("{:03}", first.id)).join("control").display()
        )));
    }
    if !replayed[0].0 {
        return Err(ShrinkError::Harness(format!(
            "the run did not fail the same way again from its seed (candidate 0: {}{}): nothing to shrink from; see {}",
            first.verdict,
            if first.note.is_empty() { String::new() } else { format!(", {}", first.note) },
            out_dir.join("candidates/000").display()
        )));
    }
    Ok(())
}

/// Shrinks the failing run in `opts.run_dir` (see the module's lifecycle).
pub fn shrink(origin: &Origin, opts: &ShrinkOptions) -> Result<Shrunk, ShrinkError> {
    let t0 = Instant::now();
    let verdict = read_verdict(&opts.run_dir).map_err(ShrinkError::Input)?;
    let signature = Signature::of(&verdict).ok_or_else(|| {
        ShrinkError::Input(format!(
            "{}: the run did not fail (verdict: {}): only a failing run can be shrunk",
            opts.run_dir.display(),
            verdict.verdict.as_str()
        ))
    })?;
    let original = read_scenario(&opts.run_dir, origin)?;
    let length = replay_length(&verdict, &signature, &original);
    let start = features::with_length(&original, length, verdict.seed);
    std::fs::create_dir_all(&opts.out_dir)
        .map_err(|e| ShrinkError::Input(format!("--out {}: {e}", opts.out_dir.display())))?;
    let jobs = if origin.target.is_some() && !origin.own_servers() { 1 } else { opts.jobs.max(1) };
    let setup = Setup {
        exe: opts.exe.clone(),
        origin,
        seed: verdict.seed,
        signature: signature.clone(),
        dir: opts.out_dir.clone(),
        jobs,
        deadline: t0 + opts.budget,
        stop: std::sync::Arc::clone(&opts.stop),
        quiet: opts.quiet,
        label: "shrink: candidate",
        until_decided: false,
    };
    let mut search = Search { runner: Runner::new(setup), best: start.clone() };
    replay_original(&mut search, &start, &opts.out_dir)?;
    // The detector's resolution: a gauge needs its warm-up and a minimum of points after it; an
    // exact-layer failure is decided at the first quiescent point that shows it.
    let floor = if signature.exact {
        1
    } else {
        verdict.warmup_iterations + plateau_detector::DetectorConfig::default().min_points as u64
    };
    let halve_length = |doc: &Table| {
        let l = features::length(doc)?;
        (l / 2 >= floor).then(|| features::with_length(doc, l / 2, verdict.seed))
    };
    // Against an external server when an abort lands is a race: a candidate cut to where one replay
    // happened to show an exact-layer failure would pass by luck and keep what the leak does not
    // need, so its length stays as planned (a failing candidate stops at its first showing anyway).
    let racy = signature.exact && origin.target.is_some();
    if signature.exact && !racy {
        search.halve_while_failing("length", halve_length);
    }
    search.drop_phases();
    search.turn_off_features();
    search.halve_while_failing("requests", features::halve_requests);
    if !racy {
        search.halve_while_failing("length", halve_length);
    }
    let checks = story::one_minimal_checks(&mut search, length, verdict.seed);
    rename(&mut search.best, &signature, &checks);
    let minimal = search.best.clone();
    let out_of_budget = search.runner.out_of_budget;
    let interrupted = search.runner.interrupted;
    let secs = t0.elapsed().as_secs_f64();
    let records = search.runner.records;
    let story = story::write(&story::Inputs {
        run_dir: &opts.run_dir,
        out_dir: &opts.out_dir,
        origin,
        signature: &signature,
        original: &start,
        minimal: &minimal,
        checks: &checks,
        records: &records,
        out_of_budget,
        interrupted,
        secs,
    })
    .map_err(ShrinkError::Harness)?;
    if opts.out_dir == opts.run_dir.join("shrink") {
        link_from_report(&opts.run_dir, &verdict);
    }
    Ok(Shrunk { minimal, records, story, out_of_budget, interrupted, secs })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_candidate_gets_its_own_port_where_the_command_names_it() {
        let o = Origin {
            target: Some("http://127.0.0.1:8123".into()),
            spawn: Some("server --port 8123 --max 81234".into()),
            ..Origin::default()
        };
        assert!(o.own_servers());
        let (url, cmd) = o.own_server();
        let port = url.rsplit(':').next().expect("a port").to_string();
        assert_ne!(port, "8123");
        assert_eq!(cmd.as_deref(), Some(format!("server --port {port} --max 81234").as_str()));
        let shared = Origin { spawn: Some("server".into()), ..o.clone() };
        assert!(!shared.own_servers());
        assert_eq!(shared.own_server(), ("http://127.0.0.1:8123".to_string(), Some("server".to_string())));
    }
}
