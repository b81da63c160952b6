//! `/metrics` of `plateau serve`, in Prometheus text format.
//!
//! Every engine registry and counter, and the server's own allocator statistics, are one family,
//! `plateau_metric`, whose labels say what plateau needs to judge it: `name` (the engine's own
//! name), `kind` (gauge, per_request, bounded, counter), `unit`, and `capacity` or `quantum` where
//! they apply. A soak of this server (`plateau run --target`) reads them back as they are, so its
//! verdict names the same registries an in-process soak names. `plateau_requests_in_flight` is the
//! in-flight gauge that says the server is quiescent; `plateau_idle_violations` counts the engine's
//! failed idle self-checks while nothing is in flight; `plateau_settled` says whether the
//! allocator's unused pages have been given back since anything ran.

use std::collections::BTreeMap;
use std::fmt::Write;

use plateau_reports::MetricSpec;

use super::engine_loop::Snapshot;

/// The family every engine and allocator figure is written in.
pub const FAMILY: &str = "plateau_metric";
/// Requests the engine holds: zero when the server is quiescent.
pub const IN_FLIGHT: &str = "plateau_requests_in_flight";
/// The engine's failed idle self-checks (0 while requests are in flight: they are not taken then).
pub const IDLE_VIOLATIONS: &str = "plateau_idle_violations";
/// 1 when nothing ran since the allocator's unused pages were given back (the server is idle): the
/// process's page-level memory (RSS, resident) is then its live memory; 0 when it may hold freed
/// pages.
pub const SETTLED: &str = "plateau_settled";

/// The exposition text of one scrape: the engine's snapshot and the process's own figures
/// (`process`, with their specs).
pub fn render(snap: &Snapshot, process: &BTreeMap<String, f64>, specs: &BTreeMap<String, MetricSpec>) -> String {
    let mut out = String::with_capacity(8 * 1024);
    let _ = writeln!(out, "# HELP {FAMILY} An engine registry, counter or allocator figure of plateau serve; labels say how plateau judges it.");
    let _ = writeln!(out, "# TYPE {FAMILY} gauge");
    for m in &snap.stats {
        let spec = plateau_scenario::spec_of(m);
        line(&mut out, &m.name, &spec, m.value as f64);
    }
    for (name, value) in process {
        if let Some(spec) = specs.get(name) {
            line(&mut out, name, spec, *value);
        }
    }
    let _ = writeln!(
        out,
        "# HELP {IN_FLIGHT} Requests the engine holds.\n# TYPE {IN_FLIGHT} gauge\n{IN_FLIGHT} {}",
        snap.in_flight
    );
    let _ = writeln!(
        out,
        "# HELP {IDLE_VIOLATIONS} Failed idle self-checks of the engine.\n# TYPE {IDLE_VIOLATIONS} gauge"
    );
    let _ = writeln!(out, "{IDLE_VIOLATIONS} {}", snap.idle_violations.len());
    let _ = writeln!(out, "# HELP {SETTLED} 1 when the allocator's unused pages were given back since anything ran.");
    let _ = writeln!(out, "# TYPE {SETTLED} gauge\n{SETTLED} {}", u8::from(snap.settled));
    out
}

fn line(out: &mut String, name: &str, spec: &MetricSpec, value: f64) {
    let _ = write!(out, "{FAMILY}{{name=\"{name}\",kind=\"{}\",unit=\"{}\"", spec.kind.as_str(), spec.unit);
    if let Some(c) = spec.capacity {
        let _ = write!(out, ",capacity=\"{c}\"");
    }
    if let Some(q) = spec.quantum {
        let _ = write!(out, ",quantum=\"{q}\"");
    }
    let _ = writeln!(out, "}} {value}");
}
