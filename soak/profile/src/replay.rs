//! The profiled replay, from the parent's side: run the same scenario, seed and injections again
//! in a child `plateau` with jemalloc's profiler enabled, have it dump the live heap at the end of
//! warm-up, in the middle and at the end, and turn the growth of both halves into sites (see the
//! parent module).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::control::REPLAY_MALLOC_CONF;
use super::{growth, write_files, GrowthRecord};

/// A replay to run.
pub struct ReplaySpec<'a> {
    /// The `plateau` binary (this one).
    pub exe: &'a Path,
    /// The scenario as the user named it (a path or a shipped name).
    pub scenario: &'a str,
    pub seed: u64,
    pub injections: &'a [String],
    /// The first dump is taken at this quiescent point, the second at `end_iter`.
    pub start_iter: u64,
    pub end_iter: u64,
    pub run_dir: &'a Path,
    /// The heap metric to explain and its growth in the run, per iteration.
    pub metric: &'a str,
    pub run_bytes_per_iter: f64,
    pub requests_per_iter: Option<f64>,
}

/// A replay's growth within this factor of the run's reproduces it: the same allocations, seen
/// by the profiler instead of the allocator's statistics (which also count allocator metadata
/// and size-class rounding).
const REPRODUCED_WITHIN: f64 = 2.0;

/// Whether a replay's growth reproduces the run's: both positive and within a factor `within`.
pub fn reproduces(replay_bytes_per_iter: f64, run_bytes_per_iter: f64, within: f64) -> bool {
    let ratio = replay_bytes_per_iter / run_bytes_per_iter.max(f64::MIN_POSITIVE);
    run_bytes_per_iter > 0.0 && (1.0 / within..=within).contains(&ratio)
}

/// `plateau run` arguments of a profiled replay: the same scenario and seed, `end` iterations, the
/// warm-up and the profile window ending at the window's edges, quiet, into `out`.
pub fn window_run_args(scenario: &str, seed: u64, (start, end): (u64, u64), out: &Path) -> Vec<String> {
    vec![
        "run".into(),
        scenario.into(),
        "--seed".into(),
        seed.to_string(),
        "--iterations".into(),
        end.to_string(),
        "--warmup".into(),
        start.to_string(),
        "--quiet".into(),
        "--profile-window".into(),
        format!("{start}:{end}"),
        "--out".into(),
        out.display().to_string(),
    ]
}

/// Runs a replay's `plateau run` child to its end: Ok when it exited 0, 1 or 4 (whatever its own
/// verdict), else the error with its last line of output.
pub fn run_to_its_end(cmd: &mut Command) -> Result<(), String> {
    let exe = cmd.get_program().to_string_lossy().into_owned();
    let o = cmd.output().map_err(|e| format!("the profiled replay did not start ({exe}): {e}"))?;
    if matches!(o.status.code(), Some(0 | 1 | 4)) {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&o.stderr);
    Err(format!(
        "the profiled replay failed (exit {:?}): {}",
        o.status.code(),
        err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("")
    ))
}

impl ReplaySpec<'_> {
    fn args(&self, out: &Path) -> Vec<String> {
        let mut a = window_run_args(self.scenario, self.seed, (self.start_iter, self.end_iter), out);
        a.extend(["--sample-interval-ms".to_string(), "0".into()]);
        for i in self.injections {
            a.extend(["--inject".to_string(), i.clone()]);
        }
        a
    }

    /// The replay as a person would type it.
    pub fn command(&self) -> String {
        format!("MALLOC_CONF={REPLAY_MALLOC_CONF} plateau {}", self.args(&self.run_dir.join("replay")).join(" "))
    }

    /// Runs the replay and writes growth.txt, growth.pb.gz, growth.svg and growth.json into the
    /// run directory. An error means the replay could not be run or read (the caller exits 3).
    pub fn run(&self) -> Result<GrowthRecord, String> {
        let out: PathBuf = self.run_dir.join("replay");
        let _ = std::fs::remove_dir_all(&out);
        run_to_its_end(Command::new(self.exe).args(self.args(&out)).env("MALLOC_CONF", REPLAY_MALLOC_CONF))?;
        let g = growth(&out, self.start_iter, self.end_iter, self.exe)?;
        let command = self.command();
        write_files(self.run_dir, &g, self.requests_per_iter, &command)?;
        let replay = g.bytes_per_iter();
        let reproduced = reproduces(replay, self.run_bytes_per_iter, REPRODUCED_WITHIN);
        let record = GrowthRecord {
            metric: self.metric.to_string(),
            start_iter: self.start_iter,
            end_iter: self.end_iter,
            replay_bytes_per_iter: replay,
            run_bytes_per_iter: self.run_bytes_per_iter,
            reproduced,
            within: REPRODUCED_WITHIN,
            command,
            // Listed either way; the verdict blames them only if the replay reproduced a failure.
            sites: g.verdict_sites(self.requests_per_iter, 5),
            grew_once: g.once_sites(self.requests_per_iter, 3),
            note: None,
            // In-process the gauge is the live heap itself: there is nothing to weigh it against.
            live_heap_bytes_per_iter: None,
            live_heap_source: None,
            also: Vec::new(),
        };
        super::write_record(self.run_dir, &record)?;
        Ok(record)
    }
}
