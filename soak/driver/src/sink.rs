//! The samples file as a run writes it: the header, then one line per sample, each on disk when it
//! is written, through a fixed buffer (the harness keeps no growing state of its own, so its memory cannot
//! pass for the target's), with the run's clock and the timer of samples between quiescent points.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use plateau_reports::{Header, RunEnd, SampleLine};

use super::RunError;

/// What one sample holds: values by metric, the probes' cost, and failed idle self-checks.
#[derive(Debug, Default)]
pub struct Probe {
    pub values: BTreeMap<String, f64>,
    pub cost_us: BTreeMap<String, f64>,
    pub checks: BTreeMap<String, String>,
}

pub struct Sink {
    out: BufWriter<File>,
    path: PathBuf,
    start: Instant,
    last_sample: Instant,
    /// Timer samples between quiescent points, if any.
    interval: Option<Duration>,
}

impl Sink {
    /// Creates the samples file (an earlier one is truncated) and writes its header.
    pub fn create(path: &Path, header: &Header, interval: Option<Duration>) -> Result<Sink, RunError> {
        let file = File::create(path).map_err(|e| RunError::Input(format!("{}: {e}", path.display())))?;
        let mut out = BufWriter::with_capacity(64 * 1024, file);
        serde_json::to_writer(&mut out, header).map_err(|e| RunError::Harness(e.to_string()))?;
        out.write_all(b"\n").map_err(|e| RunError::Harness(e.to_string()))?;
        out.flush().map_err(|e| RunError::Harness(format!("{}: {e}", path.display())))?;
        let now = Instant::now();
        Ok(Sink { out, path: path.to_path_buf(), start: now, last_sample: now, interval })
    }

    /// Seconds since the run started.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// Whether a timer sample is due.
    pub fn timer_due(&self) -> bool {
        self.interval.is_some_and(|i| self.last_sample.elapsed() >= i)
    }

    pub fn write(&mut self, iter: u64, quiescent: bool, p: Probe) -> Result<(), RunError> {
        let line = SampleLine {
            t: self.start.elapsed().as_secs_f64(),
            iter,
            quiescent,
            values: p.values,
            cost_us: p.cost_us,
            checks: p.checks,
            end: None,
        };
        serde_json::to_writer(&mut self.out, &line).map_err(|e| self.io_err(e.into()))?;
        self.out.write_all(b"\n").map_err(|e| self.io_err(e))?;
        // On disk at once: a run is watched from outside while it goes (`tail -f`, a dashboard).
        self.out.flush().map_err(|e| self.io_err(e))?;
        self.last_sample = Instant::now();
        Ok(())
    }

    /// The samples' last line: how the run ended (a sample with no values, at the iteration it
    /// ended at), then everything is flushed to disk.
    pub fn write_end(&mut self, end: &RunEnd) -> Result<(), RunError> {
        let line = SampleLine {
            t: self.start.elapsed().as_secs_f64(),
            iter: end.iterations,
            quiescent: false,
            values: BTreeMap::new(),
            cost_us: BTreeMap::new(),
            checks: BTreeMap::new(),
            end: Some(end.clone()),
        };
        serde_json::to_writer(&mut self.out, &line).map_err(|e| self.io_err(e.into()))?;
        self.out.write_all(b"\n").map_err(|e| self.io_err(e))?;
        self.flush()
    }

    /// Everything written so far is on disk (before the samples are judged).
    pub fn flush(&mut self) -> Result<(), RunError> {
        self.out.flush().map_err(|e| self.io_err(e))
    }

    fn io_err(&self, e: std::io::Error) -> RunError {
        RunError::Harness(format!("{}: {e}", self.path.display()))
    }
}
