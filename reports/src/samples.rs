//! samples.jsonl, version 1: line 1 is a header naming every metric with its kind and unit; every
//! further line is one sample. Readers ignore fields they do not know; every error names the file,
//! the line and the field.

use std::collections::BTreeMap;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::lines::BoundedLines;
pub use crate::lines::MAX_LINE_BYTES;
pub use crate::run_end::{CallTimes, ControlRecord, EndState, RunEnd};

pub const SAMPLES_SCHEMA: &str = "plateau.samples.v1";

/// What a metric is, and so how the detector judges it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A level that must not grow without levelling off: trend-tested after warm-up.
    Gauge,
    /// State that must be back to zero at every quiescent point.
    PerRequest,
    /// A level that must never exceed its `capacity`.
    Bounded,
    /// Monotonic and cumulative (requests added, tokens generated): plotted, checked to never
    /// decrease, not trend-tested.
    Counter,
    /// A level that is shown but not judged. Readers take a kind they do not know for this one.
    Observed,
}

impl Kind {
    pub const ALL: [Kind; 5] = [Kind::Gauge, Kind::PerRequest, Kind::Bounded, Kind::Counter, Kind::Observed];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Gauge => "gauge",
            Kind::PerRequest => "per_request",
            Kind::Bounded => "bounded",
            Kind::Counter => "counter",
            Kind::Observed => "observed",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// The units a samples file may use: values are plain numbers of one of them.
pub const UNITS: [&str; 2] = ["bytes", "count"];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricSpec {
    pub kind: Kind,
    pub unit: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<u64>,
    /// The step the value moves in, where the writer knows it (a page for RSS, 1 for counts):
    /// the detector never calls growth smaller than a few quanta a trend. plateau's own field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantum: Option<f64>,
    /// The gauge that bounds this one from above, where the writer knows it: the file-backed
    /// pages a process has resident (`proc.rss_file`) live inside its file mappings
    /// (`proc.file_bytes`). Growth under a bound that does not itself grow is pages brought in,
    /// not memory taken. plateau's own field; the detector knows the v1 families' bounds without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub within: Option<String>,
    /// What the metric is to the detector beyond its kind: `requests` marks the counter of
    /// requests the workload sent (per-request tolerances and costs are computed from it).
    /// plateau's own field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// The live heap this gauge is an overhead on, where the writer knows it: the allocator's
    /// bookkeeping and pages, the page tables and anonymous pages move with what the program
    /// holds (`jemalloc.allocated`) and with how it holds it. Growth here while that heap
    /// levels off is judged as fragmentation that must slow down (see `relations.rs`).
    /// plateau's own field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overhead_of: Option<String>,
    /// With `overhead_of`: the other levels this gauge also holds besides the heap's overhead
    /// (for RSS: memory outside the heap, file and shared pages). Growth is the heap's overhead
    /// only while these levelled off too. plateau's own field.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub overhead_with: Vec<String>,
    /// For an address-space gauge: the gauges of the address space another part of the program
    /// reserves inside it (the allocator's `mapped` and `retained`). Growth that is all theirs,
    /// while the rest stays level, is addresses kept for reuse, not memory. plateau's own field.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reserved_by: Vec<String>,
}

impl MetricSpec {
    /// Whether the writer declared any relation to another metric.
    pub fn declares_relations(&self) -> bool {
        self.within.is_some() || self.overhead_of.is_some() || !self.reserved_by.is_empty()
    }
}

/// The role of the counter of requests sent (see [`MetricSpec::role`]).
pub const ROLE_REQUESTS: &str = "requests";

impl MetricSpec {
    pub fn new(kind: Kind, unit: &str) -> MetricSpec {
        MetricSpec {
            kind,
            unit: unit.to_string(),
            capacity: None,
            quantum: None,
            within: None,
            role: None,
            overhead_of: None,
            overhead_with: Vec::new(),
            reserved_by: Vec::new(),
        }
    }
}

/// The header: what the file holds, and what its verdict is judged with. A verdict is one
/// function of the samples: the warm-up, the tolerance and the planned length are recorded here
/// when the run starts, and how it ended in its last line ([`RunEnd`]), so that every command
/// that judges the file again judges it the same way.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Header {
    pub schema: String,
    pub scenario: String,
    pub seed: u64,
    pub backend: String,
    pub metrics: BTreeMap<String, MetricSpec>,
    /// Quiescent iterations the trend test skips (plateau's own field; absent elsewhere).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup_iterations: Option<u64>,
    /// Leak injections switched on for the run (plateau's own field).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub injections: Vec<String>,
    /// Plants (must-pass caches in the engine) switched on for the run (plateau's own field).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub plants: Vec<String>,
    /// The byte growth the run accepts, as the user or the scenario gave it (`64B/request`,
    /// `1KiB/iteration`, `0`); absent: the detector's default. plateau's own field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerance: Option<String>,
    /// The run's planned length in iterations (absent for a run bound by time alone): samples
    /// that stop short of it with no end record are an unfinished run. plateau's own field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planned_iterations: Option<u64>,
    /// A run bound by time: its planned duration in seconds. plateau's own field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planned_duration_s: Option<f64>,
}

/// One sample as written on a line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleLine {
    pub t: f64,
    pub iter: u64,
    pub quiescent: bool,
    pub values: BTreeMap<String, f64>,
    /// What taking this sample cost, per probe, in microseconds (plateau's own field).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cost_us: BTreeMap<String, f64>,
    /// The engine's idle self-check at a quiescent point: each failed check's name and what it
    /// found (plateau's own field; absent when every check held).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub checks: BTreeMap<String, String>,
    /// Set on the last line only: how the run ended (see [`RunEnd`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<RunEnd>,
}

/// One sample, columnar: `values[i]` belongs to `Samples::names[i]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub t: f64,
    pub iter: u64,
    pub quiescent: bool,
    pub values: Vec<Option<f64>>,
    /// Failed idle checks at this sample (see [`SampleLine::checks`]).
    pub checks: BTreeMap<String, String>,
}

impl Row {
    pub fn new(t: f64, iter: u64, quiescent: bool, values: Vec<Option<f64>>) -> Row {
        Row { t, iter, quiescent, values, checks: BTreeMap::new() }
    }
}

/// A whole samples file in memory.
#[derive(Debug, Clone, PartialEq)]
pub struct Samples {
    pub header: Header,
    /// Metric names in header order (sorted).
    pub names: Vec<String>,
    pub rows: Vec<Row>,
    /// Set when the last line was cut short (a run killed mid-write); the rows before it are kept.
    pub truncated_tail: bool,
    /// What the reader accepted but a person should know (a kind it does not know, read as
    /// `observed`; relations implied by the v1 families).
    pub warnings: Vec<String>,
    /// How the run ended, when its writer recorded it (the last line).
    pub end: Option<RunEnd>,
}

#[derive(Debug, thiserror::Error)]
#[error("{}:{line}: {field}: {message}", path.display())]
pub struct SamplesError {
    pub path: PathBuf,
    pub line: usize,
    pub field: String,
    pub message: String,
}

impl Samples {
    /// Samples made in memory (by the simulator, or a synthetic series) rather than read from a
    /// file: the names are the header's metrics in their sorted order, each row holds a value slot
    /// for every one of them, and the run ended whole with nothing to warn of.
    pub fn in_memory(header: Header, rows: Vec<Row>) -> Samples {
        let names: Vec<String> = header.metrics.keys().cloned().collect();
        assert!(rows.iter().all(|r| r.values.len() == names.len()), "a row holds a value slot for each metric");
        Samples { header, names, rows, truncated_tail: false, warnings: Vec::new(), end: None }
    }

    pub fn index(&self, name: &str) -> Option<usize> {
        self.names.binary_search_by(|n| n.as_str().cmp(name)).ok()
    }

    /// The (iter, value) series of one metric at quiescent points.
    pub fn quiescent_series(&self, i: usize) -> Vec<(u64, f64)> {
        self.rows.iter().filter(|r| r.quiescent).filter_map(|r| r.values[i].map(|v| (r.iter, v))).collect()
    }

    /// Reads a samples file: a regular file of at most [`MAX_FILE_BYTES`] (a FIFO would block
    /// and a device such as /dev/zero never ends, so both are refused before they are opened).
    pub fn read(path: &Path) -> Result<Samples, SamplesError> {
        let err = |message: String| SamplesError { path: path.to_path_buf(), line: 0, field: "file".into(), message };
        let meta = std::fs::metadata(path).map_err(|e| err(e.to_string()))?;
        if !meta.is_file() {
            return Err(err("not a regular file (a directory, FIFO or device): give a samples.jsonl file".into()));
        }
        if meta.len() > MAX_FILE_BYTES {
            return Err(err(format!(
                "{} bytes, past the {} GiB a samples file may hold",
                meta.len(),
                MAX_FILE_BYTES >> 30
            )));
        }
        let f = std::fs::File::open(path).map_err(|e| err(e.to_string()))?;
        Samples::parse(BufReader::new(f.take(MAX_FILE_BYTES + 1)), path)
    }

    pub fn parse(reader: impl Read, path: &Path) -> Result<Samples, SamplesError> {
        let err = |line: usize, field: &str, message: String| SamplesError {
            path: path.to_path_buf(),
            line,
            field: field.to_string(),
            message,
        };
        let mut lines = BoundedLines::new(BufReader::new(reader));
        let first = match lines.next() {
            None => return Err(err(1, "header", "the file is empty: no header line".into())),
            Some(l) => l.map_err(|e| err(1, "header", e))?,
        };
        let v: serde_json::Value =
            serde_json::from_str(&first).map_err(|e| err(1, "header", format!("not JSON: {e}")))?;
        match v.get("schema").and_then(|s| s.as_str()) {
            Some(SAMPLES_SCHEMA) => {}
            Some(other) => {
                return Err(err(1, "schema", format!("`{other}` is not supported; this reader takes {SAMPLES_SCHEMA}")))
            }
            None => return Err(err(1, "schema", format!("missing; expected \"{SAMPLES_SCHEMA}\""))),
        }
        let mut v = v;
        let mut warnings = Vec::new();
        if let Some(metrics) = v.get_mut("metrics").and_then(|m| m.as_object_mut()) {
            for (name, spec) in metrics.iter_mut() {
                let Some(kind) = spec.get("kind").and_then(|k| k.as_str()) else { continue };
                if Kind::parse(kind).is_none() {
                    warnings.push(format!(
                        "metrics.{name}.kind: `{kind}` is not a kind this reader knows; shown, not judged (as `observed`)"
                    ));
                    spec["kind"] = serde_json::Value::from("observed");
                }
            }
        }
        let mut header: Header =
            serde_json::from_value(v).map_err(|e| err(1, &header_field(&e.to_string()), e.to_string()))?;
        check_header(&header).map_err(|(field, message)| err(1, &field, message))?;
        warnings.extend(crate::relations::imply_v1(&mut header));
        // With the relations v1 implies: a cycle through one of them is as bad.
        if let Some(cycle) = crate::relations::cycle(&header) {
            return Err(err(
                1,
                &format!("metrics.{}", cycle[0]),
                format!(
                    "its relations form a cycle ({}): a gauge judged against another that is judged against it explains nothing",
                    cycle.join(" -> ")
                ),
            ));
        }
        let names: Vec<String> = header.metrics.keys().cloned().collect();
        let mut rows: Vec<Row> = Vec::new();
        let mut end: Option<(usize, RunEnd)> = None;
        let mut pending: Option<(usize, String)> = None;
        let mut negative_derived: BTreeMap<String, (usize, usize)> = BTreeMap::new();
        for (i, line) in lines.enumerate() {
            let n = i + 2;
            let line = line.map_err(|e| err(n, "line", e))?;
            if let Some((pn, pl)) = pending.take() {
                // A bad line followed by more lines is not a cut-short tail: report it.
                return Err(bad_line(&err, pn, &pl));
            }
            if line.trim().is_empty() {
                continue;
            }
            if let Some((en, _)) = &end {
                return Err(err(n, "end", format!("a sample after the run's end record (line {en})")));
            }
            match serde_json::from_str::<SampleLine>(&line) {
                Ok(s) => {
                    check_order(&s, rows.last()).map_err(|(field, m)| err(n, field, m))?;
                    if let Some(e) = s.end {
                        end = Some((n, e));
                        continue;
                    }
                    check_values(&s, &header).map_err(|(field, m)| err(n, &field, m))?;
                    crate::derived::note_negative(&s.values, n, &mut negative_derived);
                    let values = names.iter().map(|m| s.values.get(m).copied()).collect();
                    rows.push(Row { t: s.t, iter: s.iter, quiescent: s.quiescent, values, checks: s.checks });
                }
                Err(_) => pending = Some((n, line)),
            }
        }
        let truncated_tail = match pending {
            Some((_, l)) if serde_json::from_str::<serde_json::Value>(&l).is_err() && !rows.is_empty() => true,
            Some((n, l)) => return Err(bad_line(&err, n, &l)),
            None => false,
        };
        if rows.is_empty() {
            return Err(err(2, "sample", "no samples after the header".into()));
        }
        warnings.extend(negative_derived.into_iter().map(|(name, (first, count))| {
            format!(
                "values.{name}: negative in {count} samples from line {first} (a gauge derived as a difference of two measures, which older plateaus wrote negative): read as written"
            )
        }));
        Ok(Samples { header, names, rows, truncated_tail, warnings, end: end.map(|e| e.1) })
    }

    /// The last iteration sampled.
    pub fn last_iter(&self) -> u64 {
        self.rows.iter().map(|r| r.iter).max().unwrap_or(0)
    }

    /// The file as a v1 writer writes it: the header, one line per sample (missing values left
    /// out), and the end record when there is one. [`Samples::parse`] reads it back as it was.
    pub fn to_jsonl(&self) -> String {
        let mut out = serde_json::to_string(&self.header).expect("a header is plain data") + "\n";
        let mut line = |s: &SampleLine| {
            out += &serde_json::to_string(s).expect("a sample is plain data");
            out.push('\n');
        };
        for r in &self.rows {
            let values = self.names.iter().zip(&r.values).filter_map(|(n, v)| v.map(|v| (n.clone(), v))).collect();
            line(&SampleLine {
                t: r.t,
                iter: r.iter,
                quiescent: r.quiescent,
                values,
                cost_us: BTreeMap::new(),
                checks: r.checks.clone(),
                end: None,
            });
        }
        if let (Some(end), Some(last)) = (&self.end, self.rows.last()) {
            line(&SampleLine {
                t: last.t + 1e-3,
                iter: last.iter,
                quiescent: false,
                values: BTreeMap::new(),
                cost_us: BTreeMap::new(),
                checks: BTreeMap::new(),
                end: Some(end.clone()),
            });
        }
        out
    }
}

/// A samples file may hold at most this many bytes: a sample a second for a year of metrics at
/// 100 KiB a line is still under it, and a reader that takes more than it reads without end.
pub const MAX_FILE_BYTES: u64 = 64 << 30;

/// A value's magnitude at most: 2^53 bytes is 8 PiB, past any process's memory, and up to it an
/// f64 holds every integer exactly, so slopes and sums stay finite and exact enough to judge.
pub const MAX_VALUE: f64 = 9_007_199_254_740_992.0;

#[path = "samples_checks.rs"]
mod checks;
use checks::{bad_line, check_header, check_order, check_values, header_field};

#[cfg(test)]
#[path = "samples_tests.rs"]
mod tests;
