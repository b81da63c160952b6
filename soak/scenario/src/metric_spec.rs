//! How an engine metric is described in a samples file, by the soak's probes and the simulator's
//! quiescent samples alike.

use plateau_engine::{Metric, MetricKind, REQUESTS_ADDED};
use plateau_reports::{Kind, MetricSpec, ROLE_REQUESTS};

/// The samples-file spec of an engine metric: its kind (what the detector judges it by), unit and
/// capacity. The soak's probes and the simulator's quiescent samples both describe metrics this way.
pub fn spec_of(m: &Metric) -> MetricSpec {
    let (kind, capacity) = match m.kind {
        MetricKind::Gauge => (Kind::Gauge, None),
        MetricKind::PerRequest => (Kind::PerRequest, None),
        MetricKind::Bounded { capacity } => (Kind::Bounded, Some(capacity)),
        MetricKind::Counter => (Kind::Counter, None),
    };
    // Registry and engine figures are exact: they move by one entry or one byte. The engine's
    // count of requests added (under any role prefix) is the run's measure of work.
    let counts_requests = m.name == REQUESTS_ADDED || m.name.ends_with(&format!(".{REQUESTS_ADDED}"));
    MetricSpec {
        capacity,
        quantum: Some(1.0),
        role: counts_requests.then(|| ROLE_REQUESTS.to_string()),
        ..MetricSpec::new(kind, m.unit)
    }
}
