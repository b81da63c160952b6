//! How long a `plateau run` runs: the length a run against a server takes (the scenario's target
//! length, or a deployment's own), and the cap of `--until-decided`.

use plateau_soak::scenario::Scenario;

use super::USAGE;

/// The cap of `--until-decided`: `--max-iterations`, else the scenario's; one below the planned
/// length is said, and exit 2.
pub(super) fn decided_cap(
    s: &Scenario,
    iterations: Option<u64>,
    max: Option<u64>,
    until_decided: bool,
) -> Result<u64, u8> {
    // clap's `requires` takes a flag's default (false) as given: the pairing is checked here.
    if let (Some(m), false) = (max, until_decided) {
        plateau_shell::errln!(
            "plateau: --max-iterations {m} is the cap of --until-decided, and this run does not go on until decided: give --until-decided, or drop --max-iterations (--iterations sets the run's length)"
        );
        return Err(USAGE);
    }
    let planned = iterations.unwrap_or(s.soak.iterations);
    let cap = max.unwrap_or_else(|| s.soak.until_decided_cap(planned));
    if until_decided && cap < planned {
        plateau_shell::errln!(
            "plateau: --max-iterations {cap} is below the run's planned length ({planned} iterations)"
        );
        return Err(USAGE);
    }
    Ok(cap)
}

/// The soak section as a run against a server reads it: the scenario's target length, unless the
/// deployment says how long a soak over it runs (real servers, seconds an iteration): that has the
/// last word over the scenario's, a scenario's duration included (the run then goes by the
/// deployment's iterations, as announced); flags still win over both (the caller applies them).
pub(super) fn target_length(
    soak: &plateau_soak::scenario::SoakSection,
    deployment: Option<plateau_soak::external::topology::Length>,
    quiet: bool,
) -> plateau_soak::scenario::SoakSection {
    let mut s = soak.for_target();
    if let Some(l) = deployment {
        if !quiet {
            let scenario_s = match &s.duration {
                Some(d) => format!("runs for {d}, warm-up {}", s.warmup_iterations),
                None => format!("{}, warm-up {}", s.iterations, s.warmup_iterations),
            };
            plateau_shell::errln!(
                "plateau: {} iterations, warm-up {}: the topology's [soak] (the scenario's: {scenario_s})",
                l.iterations,
                l.warmup_iterations
            );
        }
        s.iterations = l.iterations;
        s.warmup_iterations = l.warmup_iterations;
        s.duration = None;
    }
    s
}

#[cfg(test)]
mod tests {
    use plateau_soak::external::topology::Length;
    use plateau_soak::scenario::SoakSection;

    /// A deployment's `[soak]` over a scenario that runs by duration: the run goes by the
    /// deployment's iterations it announces, not by the duration.
    #[test]
    fn a_deployment_s_length_replaces_a_scenario_s_duration() {
        let soak = SoakSection { duration: Some("10m".into()), ..SoakSection::default() };
        let s = super::target_length(&soak, Some(Length { iterations: 80, warmup_iterations: 40 }), true);
        assert_eq!((s.iterations, s.warmup_iterations, s.duration), (80, 40, None));
        let s = super::target_length(&soak, None, true);
        assert_eq!(s.duration.as_deref(), Some("10m"));
    }
}
