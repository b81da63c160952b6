//! verdict.json, version 1: the run's verdict and, per judged metric, its status, the reason and
//! the figures behind it.

use serde::{Deserialize, Serialize};

pub const VERDICT_SCHEMA: &str = "plateau.verdict.v1";

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Pass,
    Warn,
    Fail,
}

/// The trend figures of a gauge.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trend {
    /// Theil–Sen slope, unit per iteration.
    pub slope_per_iter: f64,
    /// The same per hour of wall (or simulated) time.
    pub slope_per_hour: f64,
    /// Last value minus the first after warm-up (medians of the first and last tenth).
    pub growth_after_warmup: f64,
    /// Theil–Sen slope over the last half after warm-up: still growing or levelled off.
    pub tail_slope_per_iter: f64,
    /// "mann-kendall/hamed-rao".
    pub test: String,
    pub z: f64,
    pub p_value: f64,
    pub tail_p_value: f64,
    /// Quiescent points after warm-up that the test saw.
    pub points: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricVerdict {
    pub name: String,
    pub kind: String,
    pub unit: String,
    pub status: Status,
    pub reason: String,
    /// The first iteration at which the evidence was conclusive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_iter: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trend: Option<Trend>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_value: Option<f64>,
    /// Where the growth is: heap, outside the heap, a registry, a mapping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub schema: String,
    /// "pass" or "fail".
    pub verdict: Status,
    /// True when the run was interrupted or its samples cut short.
    pub incomplete: bool,
    pub scenario: String,
    pub seed: u64,
    pub backend: String,
    pub injections: Vec<String>,
    pub iterations: u64,
    pub warmup_iterations: u64,
    pub samples: usize,
    /// One line for people.
    pub summary: String,
    /// Growth attributed to the heap, outside it, or registries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attribution: Vec<String>,
    pub metrics: Vec<MetricVerdict>,
}

impl Verdict {
    pub fn failed(&self) -> bool {
        self.verdict == Status::Fail
    }
}
