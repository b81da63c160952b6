//! samples.jsonl, version 1: line 1 is a header naming every metric with its kind and unit; every
//! further line is one sample. Readers ignore fields they do not know; every error names the file,
//! the line and the field.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub const SAMPLES_SCHEMA: &str = "plateau.samples.v1";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Gauge,
    PerRequest,
    Bounded,
    Counter,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Gauge => "gauge",
            Kind::PerRequest => "per_request",
            Kind::Bounded => "bounded",
            Kind::Counter => "counter",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricSpec {
    pub kind: Kind,
    pub unit: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<u64>,
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
}

/// One sample, columnar: `values[i]` belongs to `Samples::names[i]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub t: f64,
    pub iter: u64,
    pub quiescent: bool,
    pub values: Vec<Option<f64>>,
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
        let header: Header =
            serde_json::from_value(v).map_err(|e| err(1, &header_field(&e.to_string()), e.to_string()))?;
        for (name, spec) in &header.metrics {
            if spec.kind == Kind::Bounded && spec.capacity.is_none() {
                return Err(err(1, &format!("metrics.{name}.capacity"), "a bounded metric needs a capacity".into()));
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
                    let values = names.iter().map(|m| s.values.get(m).copied()).collect();
                    rows.push(Row { t: s.t, iter: s.iter, quiescent: s.quiescent, values });
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
        Ok(Samples { header, names, rows, truncated_tail })
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
    let checks: [(&str, fn(&serde_json::Value) -> bool, &str); 4] = [
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
    for f in ["scenario", "seed", "backend", "metrics", "kind", "unit", "capacity"] {
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
    fn a_cut_short_last_line_is_tolerated_and_flagged() {
        let s = parse(&format!(
            "{HEADER}\n{{\"t\":0.5,\"iter\":1,\"quiescent\":true,\"values\":{{\"a\":1}}}}\n{{\"t\":1.0,\"it"
        ))
        .unwrap();
        assert!(s.truncated_tail);
        assert_eq!(s.rows.len(), 1);
    }
}
