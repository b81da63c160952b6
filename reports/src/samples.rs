//! samples.jsonl, version 1: line 1 is a header naming every metric with its kind and unit; every
//! further line is one sample. Readers ignore fields they do not know; every error names the file,
//! the line and the field.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

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
}

/// The role of the counter of requests sent (see [`MetricSpec::role`]).
pub const ROLE_REQUESTS: &str = "requests";

impl MetricSpec {
    pub fn new(kind: Kind, unit: &str) -> MetricSpec {
        MetricSpec { kind, unit: unit.to_string(), capacity: None, quantum: None, within: None, role: None }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// `observed`).
    pub warnings: Vec<String>,
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
    pub fn index(&self, name: &str) -> Option<usize> {
        self.names.binary_search_by(|n| n.as_str().cmp(name)).ok()
    }

    /// The (iter, value) series of one metric at quiescent points.
    pub fn quiescent_series(&self, i: usize) -> Vec<(u64, f64)> {
        self.rows.iter().filter(|r| r.quiescent).filter_map(|r| r.values[i].map(|v| (r.iter, v))).collect()
    }

    /// Reads a samples file.
    pub fn read(path: &Path) -> Result<Samples, SamplesError> {
        let err = |line: usize, field: &str, message: String| SamplesError {
            path: path.to_path_buf(),
            line,
            field: field.to_string(),
            message,
        };
        let f = std::fs::File::open(path).map_err(|e| err(0, "file", e.to_string()))?;
        Samples::parse(BufReader::new(f), path)
    }

    pub fn parse(reader: impl Read, path: &Path) -> Result<Samples, SamplesError> {
        let err = |line: usize, field: &str, message: String| SamplesError {
            path: path.to_path_buf(),
            line,
            field: field.to_string(),
            message,
        };
        let mut lines = BufReader::new(reader).lines();
        let first = match lines.next() {
            None => return Err(err(1, "header", "the file is empty: no header line".into())),
            Some(l) => l.map_err(|e| err(1, "header", e.to_string()))?,
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
        let header: Header =
            serde_json::from_value(v).map_err(|e| err(1, &header_field(&e.to_string()), e.to_string()))?;
        for (name, spec) in &header.metrics {
            if spec.kind == Kind::Bounded && spec.capacity.is_none() {
                return Err(err(1, &format!("metrics.{name}.capacity"), "a bounded metric needs a capacity".into()));
            }
            if !UNITS.contains(&spec.unit.as_str()) {
                return Err(err(
                    1,
                    &format!("metrics.{name}.unit"),
                    format!("`{}` is not a unit this format takes: write values in `bytes` or as a `count`", spec.unit),
                ));
            }
            if spec.quantum.is_some_and(|q| !(q.is_finite() && q > 0.0)) {
                return Err(err(1, &format!("metrics.{name}.quantum"), "must be a positive number".into()));
            }
        }
        let names: Vec<String> = header.metrics.keys().cloned().collect();
        let mut rows = Vec::new();
        let mut pending: Option<(usize, String)> = None;
        for (i, line) in lines.enumerate() {
            let n = i + 2;
            let line = line.map_err(|e| err(n, "line", e.to_string()))?;
            if let Some((pn, pl)) = pending.take() {
                // A bad line followed by more lines is not a cut-short tail: report it.
                return Err(bad_line(&err, pn, &pl));
            }
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<SampleLine>(&line) {
                Ok(s) => {
                    if let Some(prev) = rows.last() {
                        let prev: &Row = prev;
                        if s.t.partial_cmp(&prev.t) != Some(std::cmp::Ordering::Greater) {
                            return Err(err(
                                n,
                                "t",
                                format!("{} does not increase (the sample before has {})", s.t, prev.t),
                            ));
                        }
                        if s.iter < prev.iter {
                            return Err(err(
                                n,
                                "iter",
                                format!("{} is below the sample before's {}", s.iter, prev.iter),
                            ));
                        }
                    }
                    if !s.t.is_finite() {
                        return Err(err(n, "t", format!("{} is not a finite number of seconds", s.t)));
                    }
                    let values = names.iter().map(|m| s.values.get(m).copied()).collect();
                    rows.push(Row { t: s.t, iter: s.iter, quiescent: s.quiescent, values, checks: s.checks });
                }
                Err(_) => pending = Some((n, line)),
            }
        }
        let truncated_tail = match pending {
            Some((n, l)) if serde_json::from_str::<serde_json::Value>(&l).is_err() && !rows.is_empty() => {
                let _ = n;
                true
            }
            Some((n, l)) => return Err(bad_line(&err, n, &l)),
            None => false,
        };
        if rows.is_empty() {
            return Err(err(2, "sample", "no samples after the header".into()));
        }
        Ok(Samples { header, names, rows, truncated_tail, warnings })
    }
}

fn bad_line(err: &impl Fn(usize, &str, String) -> SamplesError, n: usize, line: &str) -> SamplesError {
    let v: serde_json::Value = match serde_json::from_str(line) {
        Ok(v) => v,
        Err(e) => return err(n, "sample", format!("not JSON: {e}")),
    };
    let Some(o) = v.as_object() else {
        return err(n, "sample", "not a JSON object".into());
    };
    type Check = (&'static str, fn(&serde_json::Value) -> bool, &'static str);
    let checks: [Check; 4] = [
        ("t", |x| x.is_number(), "a number of seconds"),
        ("iter", |x| x.is_u64(), "a non-negative integer"),
        ("quiescent", |x| x.is_boolean(), "true or false"),
        ("values", |x| x.is_object(), "an object of metric values"),
    ];
    for (field, ok, want) in checks {
        match o.get(field) {
            None => return err(n, field, "missing".into()),
            Some(x) if !ok(x) => return err(n, field, format!("{x} is not {want}")),
            Some(_) => {}
        }
    }
    for (name, x) in o["values"].as_object().expect("checked") {
        if !x.is_number() {
            return err(n, &format!("values.{name}"), format!("{x} is not a number"));
        }
    }
    err(n, "sample", "unreadable".into())
}

fn header_field(msg: &str) -> String {
    for f in ["scenario", "seed", "backend", "metrics", "kind", "unit", "capacity", "quantum"] {
        if msg.contains(&format!("`{f}`")) {
            return f.to_string();
        }
    }
    "header".into()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = r#"{"schema":"plateau.samples.v1","scenario":"s","seed":7,"backend":"cpu","metrics":{"a":{"kind":"gauge","unit":"bytes"},"b":{"kind":"bounded","unit":"count","capacity":4}}}"#;

    fn parse(text: &str) -> Result<Samples, SamplesError> {
        Samples::parse(text.as_bytes(), Path::new("x.jsonl"))
    }

    #[test]
    fn reads_the_contract_example_and_ignores_unknown_fields() {
        let s = parse(&format!(
            "{HEADER}\n{{\"t\":0.5,\"iter\":1,\"quiescent\":true,\"values\":{{\"a\":10,\"b\":2,\"zzz\":1}},\"extra\":3}}\n"
        ))
        .unwrap();
        assert_eq!(s.names, vec!["a", "b"]);
        assert_eq!(s.rows[0].values, vec![Some(10.0), Some(2.0)]);
        assert_eq!(s.quiescent_series(0), vec![(1, 10.0)]);
    }

    #[test]
    fn errors_name_line_and_field() {
        assert!(parse("").unwrap_err().to_string().contains("x.jsonl:1: header: the file is empty"));
        let e = parse(&HEADER.replace("v1", "v2")).unwrap_err().to_string();
        assert!(e.contains(":1: schema:") && e.contains("plateau.samples.v2"), "{e}");
        let e = parse(&format!("{HEADER}\n{{\"t\":1,\"iter\":\"x\",\"quiescent\":true,\"values\":{{}}}}\n{{}}\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains(":2: iter: \"x\" is not"), "{e}");
        let e = parse(&format!("{HEADER}\n")).unwrap_err().to_string();
        assert!(e.contains("no samples"), "{e}");
    }

    #[test]
    fn units_other_than_bytes_and_count_are_refused_by_metric() {
        let e = parse(&HEADER.replace(r#""unit":"bytes""#, r#""unit":"KiB""#)).unwrap_err().to_string();
        assert!(e.contains(":1: metrics.a.unit: `KiB`"), "{e}");
    }

    #[test]
    fn time_must_increase() {
        let row = |t: f64| format!("{{\"t\":{t},\"iter\":1,\"quiescent\":true,\"values\":{{}}}}");
        let e = parse(&format!("{HEADER}\n{}\n{}\n{}\n", row(0.5), row(0.7), row(0.7))).unwrap_err().to_string();
        assert!(e.contains("x.jsonl:4: t: 0.7 does not increase"), "{e}");
    }

    #[test]
    fn an_unknown_kind_is_observed_with_a_warning() {
        let s = parse(&format!(
            "{}\n{{\"t\":0.5,\"iter\":1,\"quiescent\":true,\"values\":{{\"a\":1}}}}\n",
            HEADER.replace(r#""kind":"gauge""#, r#""kind":"histogram""#)
        ))
        .unwrap();
        assert_eq!(s.header.metrics["a"].kind, Kind::Observed);
        assert!(s.warnings[0].contains("metrics.a.kind: `histogram`"), "{:?}", s.warnings);
    }

    #[test]
    fn a_cut_short_last_line_is_tolerated_and_flagged() {
        let s = parse(&format!(
            "{HEADER}\n{{\"t\":0.5,\"iter\":1,\"quiescent\":true,\"values\":{{\"a\":1}}}}\n{{\"t\":1.0,\"it"
        ))
        .unwrap();
        assert!(s.truncated_tail);
        assert_eq!(s.rows.len(), 1);
    }
}
