//! A named figure of a backend or an engine (`stats()`), with what it means to the detector: the
//! samples' vocabulary, here so that a backend can report its device's figures (`gpu.*`).

/// What a metric means to the detector (samples.jsonl v1): decided by kind, never by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// Memory-like level: trend-tested.
    Gauge,
    /// Per-request state: must be zero at every quiescent point.
    PerRequest,
    /// Must never exceed `capacity`.
    Bounded { capacity: u64 },
    /// Grows by nature: plotted, never judged.
    Counter,
}

impl MetricKind {
    /// The contract's name for the kind.
    pub fn as_str(self) -> &'static str {
        match self {
            MetricKind::Gauge => "gauge",
            MetricKind::PerRequest => "per_request",
            MetricKind::Bounded { .. } => "bounded",
            MetricKind::Counter => "counter",
        }
    }
}

/// One named figure of `stats()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metric {
    /// Dot-separated family name, e.g. `registry.requests`.
    pub name: String,
    pub kind: MetricKind,
    /// `count` or `bytes`.
    pub unit: &'static str,
    pub value: u64,
}
