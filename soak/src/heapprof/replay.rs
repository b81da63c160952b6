//! The profiled replay, from the parent's side: run the same scenario, seed and injections again
//! in a child `plateau` with jemalloc's profiler enabled, have it dump the live heap at the end of
//! warm-up and at the end, and turn the difference into sites (see the parent module).

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

impl ReplaySpec<'_> {
    fn args(&self, out: &Path) -> Vec<String> {
        let mut a: Vec<String> = vec![
            "run".into(),
            self.scenario.into(),
            "--seed".into(),
            self.seed.to_string(),
            "--iterations".into(),
            self.end_iter.to_string(),
            "--warmup".into(),
            self.start_iter.to_string(),
            "--sample-interval-ms".into(),
            "0".into(),
            "--quiet".into(),
            "--profile-window".into(),
            format!("{}:{}", self.start_iter, self.end_iter),
            "--out".into(),
            out.display().to_string(),
        ];
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
        let o = Command::new(self.exe)
            .args(self.args(&out))
            .env("MALLOC_CONF", REPLAY_MALLOC_CONF)
            .output()
            .map_err(|e| format!("the profiled replay did not start ({}): {e}", self.exe.display()))?;
        // 0, 1 or 4: it ran to its end (whatever its own verdict); 2 or 3: it did not.
        if !matches!(o.status.code(), Some(0 | 1 | 4)) {
            let err = String::from_utf8_lossy(&o.stderr);
            return Err(format!(
                "the profiled replay failed (exit {:?}): {}",
                o.status.code(),
                err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("")
            ));
        }
        let g =
            growth(&out.join("heap-start.prof"), &out.join("heap-end.prof"), self.start_iter, self.end_iter, self.exe)?;
        let command = self.command();
        write_files(self.run_dir, &g, self.requests_per_iter, &command)?;
        let replay = g.bytes_per_iter();
        let ratio = replay / self.run_bytes_per_iter.max(f64::MIN_POSITIVE);
        let reproduced =
            self.run_bytes_per_iter > 0.0 && (1.0 / REPRODUCED_WITHIN..=REPRODUCED_WITHIN).contains(&ratio);
        let record = GrowthRecord {
            metric: self.metric.to_string(),
            start_iter: self.start_iter,
            end_iter: self.end_iter,
            replay_bytes_per_iter: replay,
            run_bytes_per_iter: self.run_bytes_per_iter,
            reproduced,
            command,
            // Listed either way; the verdict blames them only if the replay reproduced a failure.
            sites: g.verdict_sites(self.requests_per_iter, 5),
        };
        let json = serde_json::to_vec_pretty(&record).map_err(|e| e.to_string())?;
        crate::fsutil::write_atomic(&self.run_dir.join("growth.json"), &json)
            .map_err(|e| format!("{}: {e}", self.run_dir.join("growth.json").display()))?;
        Ok(record)
    }
}
