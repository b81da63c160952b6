//! What one simulated run is: the scenario (cluster shape, engine, workload), the fault profile,
//! the injections, the model backend and the seed; and the command line's seed ranges and shards.

use plateau_engine::Injections;
use plateau_scenario::Scenario;

use crate::faults::Profile;
use crate::section::SimSection;

/// The simulator's default scenario, embedded.
pub const DEFAULT_SCENARIO: &str = include_str!("../scenarios/cluster.toml");

pub fn default_scenario() -> Scenario {
    Scenario::parse(DEFAULT_SCENARIO, "<sim default cluster>").expect("the embedded scenario parses")
}

/// Which model backend the engine nodes run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    /// Pseudo-logits from a hash of the history: microseconds per step.
    Hash,
    /// The real CPU model of the scenario's preset.
    Cpu,
}

impl ModelKind {
    pub fn parse(s: &str) -> Result<ModelKind, String> {
        match s {
            "hash" => Ok(ModelKind::Hash),
            "cpu" => Ok(ModelKind::Cpu),
            other => Err(format!("model `{other}` is not one of hash, cpu")),
        }
    }
}

#[derive(Debug, Clone)]
pub struct RunSpec {
    pub scenario: Scenario,
    /// The scenario's `[sim]` section.
    pub sim: SimSection,
    pub profile: Profile,
    pub injections: Injections,
    pub model: ModelKind,
    pub iterations: u64,
}

impl RunSpec {
    /// Checks what the simulator cannot run, naming the field.
    pub fn new(
        scenario: Scenario,
        faults: Option<&str>,
        injections: Injections,
        model: ModelKind,
        iterations: Option<u64>,
    ) -> Result<RunSpec, String> {
        let sim = SimSection::of(&scenario)?;
        let profile = Profile::parse(faults.unwrap_or(&sim.faults)).map_err(|e| {
            if faults.is_some() {
                format!("--faults: {e}")
            } else {
                format!("scenario {}: sim.faults: {e}", scenario.name)
            }
        })?;
        if scenario.engine.weights.is_some() {
            return Err(format!(
                "scenario {}: engine.weights: the simulator runs seeded presets only (weights from a directory are for the soak)",
                scenario.name
            ));
        }
        let iterations = iterations.unwrap_or(sim.iterations);
        if !(1..=10_000).contains(&iterations) {
            return Err(format!("--iterations: {iterations} is outside 1..=10000"));
        }
        Ok(RunSpec { scenario, sim, profile, injections, model, iterations })
    }
}

/// `A..B` (B excluded) or a single seed `N`.
pub fn parse_seeds(s: &str) -> Result<std::ops::Range<u64>, String> {
    let num =
        |t: &str| t.trim().parse::<u64>().map_err(|_| format!("--seeds `{s}`: `{t}` is not a seed (a whole number)"));
    let range = match s.split_once("..") {
        Some((a, b)) => num(a)?..num(b)?,
        None => {
            let n = num(s)?;
            n..n.checked_add(1).ok_or_else(|| format!("--seeds `{s}`: too large"))?
        }
    };
    if range.is_empty() {
        return Err(format!("--seeds `{s}`: the range is empty (write A..B with A < B)"));
    }
    Ok(range)
}

/// `I/N`: this machine runs shard I (from 0) of N; seed k belongs to shard k mod N.
pub fn parse_shard(s: &str) -> Result<(u64, u64), String> {
    let bad = || format!("--shard `{s}`: write I/N with 0 <= I < N, for example 0/4");
    let (i, n) = s.split_once('/').ok_or_else(bad)?;
    let (i, n) = (i.trim().parse::<u64>().map_err(|_| bad())?, n.trim().parse::<u64>().map_err(|_| bad())?);
    if n == 0 || i >= n {
        return Err(bad());
    }
    Ok((i, n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_ranges_and_shards() {
        assert_eq!(parse_seeds("0..200").unwrap(), 0..200);
        assert_eq!(parse_seeds("7").unwrap(), 7..8);
        assert!(parse_seeds("5..5").unwrap_err().contains("empty"));
        assert!(parse_seeds("a..9").unwrap_err().contains("`a`"));
        assert_eq!(parse_shard("1/4").unwrap(), (1, 4));
        for bad in ["4/4", "1/0", "x/2", "3"] {
            assert!(parse_shard(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_default_scenario_and_bad_specs() {
        let s = default_scenario();
        assert!(RunSpec::new(s.clone(), None, Injections::none(), ModelKind::Hash, None).is_ok());
        let e = RunSpec::new(s, Some("chaos"), Injections::none(), ModelKind::Hash, None).unwrap_err();
        assert!(e.starts_with("--faults: unknown fault profile `chaos`"), "{e}");
    }
}
