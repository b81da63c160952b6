//! The scenario's `[sim]` section: the simulated cluster. The scenario format (plateau-scenario) keeps
//! the section as written; the simulator reads and checks it here, naming the field and its line.

use plateau_scenario::{closest, locate_key, Scenario};
use serde::Deserialize;

/// How many nodes of each role, how long a run is, which fault profile applies and the timing
/// the cost model uses.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimSection {
    pub prefill_nodes: usize,
    pub decode_nodes: usize,
    pub monolithic_nodes: usize,
    /// Scenario iterations per simulated run (each ends at a quiescent point). The default, 100,
    /// sees a slow in-flight leak with no false alarm: the gauges' trend starts after the soak's
    /// warm-up of 20 quiescent iterations. `untracked-heap` (a few hundred bytes a node per
    /// iteration) is missed on 2 of 20 seeds at 40 iterations and caught on every seed from 60;
    /// at 60, one clean seed of 1,000 (526) fails on a table that doubled after a backlog and has
    /// not yet shown the run that it stopped; at 100, none of 1,000 fails. `sim/tests/sim.rs`
    /// holds both at the default.
    pub iterations: u64,
    /// Fault profile: none, light, default, heavy (plateau-sim list-faults).
    pub faults: String,
    /// The router gives up on a request after this long and reports it failed.
    pub request_timeout_ms: u64,
    /// Requests of one iteration arrive spread over this window.
    pub arrival_window_ms: u64,
    /// KV transfer bandwidth between nodes, in MB/s (10,000 is a 100 Gb/s link at 80%).
    pub kv_bandwidth_mb_per_s: u64,
}

impl Default for SimSection {
    fn default() -> Self {
        SimSection {
            prefill_nodes: 1,
            decode_nodes: 1,
            monolithic_nodes: 1,
            iterations: 100,
            faults: "default".into(),
            request_timeout_ms: 2_000,
            arrival_window_ms: 50,
            kv_bandwidth_mb_per_s: 10_000,
        }
    }
}

const FIELDS: [&str; 8] = [
    "prefill_nodes",
    "decode_nodes",
    "monolithic_nodes",
    "iterations",
    "faults",
    "request_timeout_ms",
    "arrival_window_ms",
    "kv_bandwidth_mb_per_s",
];

impl SimSection {
    /// Reads `s`'s `[sim]` section (defaults where it says nothing). Errors read
    /// `file:line: sim.field: what`.
    pub fn of(s: &Scenario) -> Result<SimSection, String> {
        let (file, text) = (s.file.as_str(), s.text.as_str());
        let at =
            |key: &'static str, what: String| format!("{file}:{}: sim.{key}: {what}", locate_key(text, "sim", key));
        if let Some(unknown) = s.sim.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            let hint = closest(unknown, &FIELDS).map(|c| format!("; did you mean `{c}`?")).unwrap_or_default();
            return Err(format!("{file}: sim: unknown field `{unknown}`{hint}"));
        }
        let sim: SimSection = toml::Value::Table(s.sim.clone())
            .try_into()
            .map_err(|e: toml::de::Error| format!("{file}: sim: {}", e.message()))?;
        if (sim.prefill_nodes == 0) != (sim.decode_nodes == 0) {
            return Err(at("prefill_nodes", "prefill_nodes and decode_nodes are both 0 or both at least 1".into()));
        }
        let nodes = sim.prefill_nodes + sim.decode_nodes + sim.monolithic_nodes;
        if nodes == 0 || nodes > 32 {
            return Err(at("monolithic_nodes", format!("{nodes} engine nodes: need 1 to 32")));
        }
        if !(1..=10_000).contains(&sim.iterations) {
            return Err(at("iterations", format!("{} is outside 1..=10000", sim.iterations)));
        }
        for (key, v, max) in [
            ("request_timeout_ms", sim.request_timeout_ms, 3_600_000),
            ("arrival_window_ms", sim.arrival_window_ms, 3_600_000),
            ("kv_bandwidth_mb_per_s", sim.kv_bandwidth_mb_per_s, 10_000_000),
        ] {
            if v == 0 || v > max {
                return Err(at(key, format!("{v} is outside 1..={max}")));
            }
        }
        Ok(sim)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_checked_and_located() {
        let text = "name = \"x\"\ndescription = \"d\"\n[sim]\niterations = 0\n[[phase]]\nkind = \"batch\"\n";
        let s = Scenario::parse(text, "f.toml").unwrap();
        assert_eq!(SimSection::of(&s).unwrap_err(), "f.toml:4: sim.iterations: 0 is outside 1..=10000");
        let text = text.replace("iterations = 0", "iteratoins = 3");
        let s = Scenario::parse(&text, "f.toml").unwrap();
        assert!(SimSection::of(&s).unwrap_err().contains("did you mean `iterations`"));
        let s = Scenario::parse("name = \"x\"\ndescription = \"d\"\n[[phase]]\nkind = \"batch\"\n", "g").unwrap();
        assert_eq!(SimSection::of(&s).unwrap(), SimSection::default());
    }
}
