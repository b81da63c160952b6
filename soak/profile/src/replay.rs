//! The profiled replay, from the parent's side: run the same scenario and seed again in a child
//! `plateau run` over a window of the run, with a profiler on what grew, and turn the net change
//! of the live heap in both halves of the window into sites. Only a native server that plateau
//! starts is replayed (a preloaded jemalloc, in plateau-external): plateau's own engine and a
//! Python server record their sites as the run goes (plateau-sites). What a replay explains
//! ([`Explains`]: the failing gauge, its growth in the run over the window) and how its finding
//! is recorded ([`Explains::record`]: growth.txt, growth.pb.gz, growth.svg and growth.json,
//! whether it reproduced the run) are here.

use std::path::Path;
use std::process::Command;

use super::{write_files, write_record, Growth, GrowthRecord};

/// What a profiled replay explains: a gauge's growth in a run, over a window of its iterations.
#[derive(Debug, Clone, Copy)]
pub struct Explains<'a> {
    /// The run's directory, where the replay's findings go (and its own run, in `replay/`).
    pub run_dir: &'a Path,
    /// The window: the replay's profile starts at this quiescent point and ends at `end_iter`.
    pub start_iter: u64,
    pub end_iter: u64,
    /// The gauge the sites explain, and its growth in the run over the window, per iteration.
    pub metric: &'a str,
    pub run_bytes_per_iter: f64,
    pub requests_per_iter: Option<f64>,
}

/// What a replay's profiler saw beside the sites, for a gauge of a server's process memory.
pub struct LiveHeap {
    /// The whole live heap's change per iteration over the window (frees included).
    pub bytes_per_iter: f64,
    /// The profiler it came from.
    pub source: String,
    /// The other gauges of the process's memory it is weighed against too.
    pub also: Vec<String>,
}

impl Explains<'_> {
    /// Records what a replay found: growth.txt, growth.pb.gz and growth.svg from `growth`, and
    /// growth.json with whether the replay's rate reproduced the run's within a factor `within`.
    /// `window` is the window the replay marked (its quiescent points), `command` the replay as a
    /// person would type it.
    pub fn record(
        &self,
        growth: &Growth,
        window: (u64, u64),
        within: f64,
        command: String,
        live_heap: Option<LiveHeap>,
    ) -> Result<GrowthRecord, String> {
        write_files(self.run_dir, growth, self.requests_per_iter, &command)?;
        let replay = growth.bytes_per_iter();
        let (live_heap_bytes_per_iter, live_heap_source, also) = match live_heap {
            Some(l) => (Some(l.bytes_per_iter), Some(l.source), l.also),
            None => (None, None, Vec::new()),
        };
        let record = GrowthRecord {
            metric: self.metric.to_string(),
            start_iter: window.0,
            end_iter: window.1,
            replay_bytes_per_iter: replay,
            run_bytes_per_iter: self.run_bytes_per_iter,
            reproduced: reproduces(replay, self.run_bytes_per_iter, within),
            within,
            command,
            // Listed either way; the verdict blames them only if the replay reproduced a failure.
            sites: growth.verdict_sites(self.requests_per_iter, 5),
            grew_once: growth.once_sites(self.requests_per_iter, 3),
            note: None,
            live_heap_bytes_per_iter,
            live_heap_source,
            also,
        };
        write_record(self.run_dir, &record)?;
        Ok(record)
    }

    /// Records that no replay could name a site, and why (the verdict says it).
    pub fn record_failure(&self, why: String) -> Result<(), String> {
        let record = GrowthRecord {
            metric: self.metric.to_string(),
            start_iter: self.start_iter,
            end_iter: self.end_iter,
            note: Some(why),
            ..GrowthRecord::default()
        };
        write_record(self.run_dir, &record)
    }
}

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
