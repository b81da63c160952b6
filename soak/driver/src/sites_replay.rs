//! plateau's own engine's allocation sites, recorded by a replay of the run before its verdict is
//! drawn. The engine is deterministic, so the same scenario, seed, injections and length run again
//! allocate the same objects at the same iterations: a child `plateau run --record-sites` with
//! jemalloc's profiler recording every allocation from its first (`MALLOC_CONF`) writes each
//! site's live bytes at every quiescent point (sites.jsonl, `plateau_profile::live`), and the
//! run's directory takes its sites.jsonl; the one judge then draws the verdict once, with them.
//!
//! Why not in the run itself: the profiler perturbs what it measures. A sampled small object
//! takes a page run of its own (jemalloc promotes it), so the page-level gauges (`active`,
//! `resident`, RSS) move with which objects were sampled; and the sampler counts every byte the
//! thread allocates, the harness's clock-timed samples included, so which objects are sampled
//! depends on the clock and the run's heap is no longer the same page for page from one run of a
//! seed to the next. The judged run stays untouched; the replay is exact (every allocation).
//!
//! The replay runs only where sites could matter: the run's heap or process memory failed or is
//! undecided (or `--profile` asks for them), and the run finished (an interrupted run is not
//! replayed). The replay is checked
//! to be the run: its request and registry counts equal the run's at every quiescent point; a
//! replay that is not (or cannot run) leaves a note instead of sites, and the verdict says it.

use std::path::{Path, PathBuf};
use std::process::Command;

use plateau_reports::{Kind, Samples, Status};

use super::RunOptions;

/// The profiler's settings in the replay: active from the first allocation, every allocation.
pub const REPLAY_MALLOC_CONF: &str = "prof:true,prof_active:true,lg_prof_sample:0";

/// What a replay of the run needs to run the same engine again.
#[derive(Debug, Clone)]
pub struct SitesReplay {
    exe: PathBuf,
    /// `plateau run` arguments beside the length and the output: the scenario, seed, backend,
    /// injections and plants.
    args: Vec<String>,
    /// `--profile`: record the sites whatever the run's verdict.
    always: bool,
}

impl SitesReplay {
    /// The replay of the run `opts` describes (seed and backend as the run resolved them).
    pub fn of(opts: &RunOptions, seed: u64, backend: &str) -> Result<SitesReplay, String> {
        let exe = std::env::current_exe().map_err(|e| format!("this binary's path: {e}"))?;
        let mut args = vec![
            "run".to_string(),
            opts.scenario_source.clone(),
            "--seed".into(),
            seed.to_string(),
            "--backend".into(),
            backend.to_string(),
        ];
        for i in opts.injections.iter() {
            args.extend(["--inject".to_string(), i.name().to_string()]);
        }
        for p in opts.injections.plants() {
            args.extend(["--plant".to_string(), p.name().to_string()]);
        }
        Ok(SitesReplay { exe, args, always: opts.profile })
    }

    /// The replay's command for `iterations` and `warmup`, into `out`.
    fn command(&self, iterations: u64, warmup: u64, out: &Path) -> Vec<String> {
        let mut a = self.args.clone();
        a.extend([
            "--iterations".to_string(),
            iterations.to_string(),
            "--warmup".into(),
            warmup.to_string(),
            "--sample-interval-ms".into(),
            "0".into(),
            "--quiet".into(),
            "--no-replay".into(),
            "--record-sites".into(),
            "--out".into(),
            out.display().to_string(),
        ]);
        a
    }

    /// Before the verdict of the run in `dir` is drawn: replays it into `dir/replay` and takes its
    /// sites, where the run's byte gauges call for them (see the module's doc).
    pub fn record(&self, dir: &Path, iterations: u64, warmup: u64) {
        let samples = dir.join("samples.jsonl");
        let Ok((run, v)) = plateau_analysis::judge_run(&samples, &plateau_detector::Overrides::default()) else {
            return;
        };
        let open = v
            .metrics
            .iter()
            .any(|m| m.kind == "gauge" && m.unit == "bytes" && matches!(m.status, Status::Fail | Status::Inconclusive));
        if !(open || self.always) || iterations <= warmup {
            return;
        }
        plateau_shell::errln!("plateau: replaying the run to record plateau's own allocation sites (every allocation)");
        let out = dir.join("replay");
        let note = match self.replay(&out, iterations, warmup).and_then(|()| same_run(&run, &out)) {
            Ok(()) => match std::fs::copy(out.join(plateau_sites::SITES_FILE), dir.join(plateau_sites::SITES_FILE)) {
                Ok(_) => return,
                Err(e) => format!("the replay's sites could not be taken: {e}"),
            },
            Err(e) => e,
        };
        plateau_shell::errln!("plateau: no allocation site recorded: {note}");
        let written = plateau_sites::SitesWriter::create(&dir.join(plateau_sites::SITES_FILE))
            .and_then(|mut w| w.note(&format!("plateau's own heap: no site recorded: {note}")));
        if let Err(e) = written {
            plateau_shell::errln!("plateau: {e}");
        }
    }

    fn replay(&self, out: &Path, iterations: u64, warmup: u64) -> Result<(), String> {
        let _ = std::fs::remove_dir_all(out);
        let args = self.command(iterations, warmup, out);
        let o =
            Command::new(&self.exe).args(&args).env("MALLOC_CONF", REPLAY_MALLOC_CONF).output().map_err(|e| {
                format!("the replay that records the sites did not start ({}): {e}", self.exe.display())
            })?;
        if !matches!(o.status.code(), Some(0 | 1 | 4)) {
            let err = String::from_utf8_lossy(&o.stderr);
            return Err(format!(
                "the replay that records the sites failed (exit {:?}): {}",
                o.status.code(),
                err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("")
            ));
        }
        Ok(())
    }
}

/// Whether the replay in `out` ran the same engine as `run`: every counter of requests and every
/// per-request registry equal at every quiescent point both have.
fn same_run(run: &Samples, out: &Path) -> Result<(), String> {
    let replay = Samples::read(&out.join("samples.jsonl")).map_err(|e| format!("the replay's samples: {e}"))?;
    for (i, name) in run.names.iter().enumerate() {
        let spec = &run.header.metrics[name];
        if !matches!(spec.kind, Kind::Counter | Kind::PerRequest) {
            continue;
        }
        let Some(j) = replay.index(name) else { continue };
        let theirs: std::collections::BTreeMap<u64, f64> = replay.quiescent_series(j).into_iter().collect();
        for (it, v) in run.quiescent_series(i) {
            if let Some(w) = theirs.get(&it).filter(|w| **w != v) {
                return Err(format!(
                    "the replay is not the run: {name} was {v} at iteration {it} in the run and {w} in the replay"
                ));
            }
        }
    }
    Ok(())
}
