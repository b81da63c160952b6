//! plateau-scenario: scenario scripts (TOML) and what they make, shared by the soak harness and
//! the simulator with no harness dependency (no allocator, no /proc, no threads, no sockets):
//! - the format: the engine setup, the soak length, and the phases each iteration runs
//!   (scenarios/README.md documents every field). Loading is strict: an unknown or misspelled
//!   field, a wrong type or an impossible value is an error naming file:line, the field and the
//!   closest known name;
//! - `workload`: the requests a scenario's phases make, deterministic from the seed;
//! - `spec_of`: how an engine metric is described in a samples file.

use std::path::Path;

use serde::Deserialize;

mod diagnostics;
mod metric_spec;
mod phases;
mod photo;
mod sections;
mod seeds;
mod validate;
pub mod workload;

pub use diagnostics::{closest, locate_key, ScenarioError};
use diagnostics::{explain, line_col, phase_error};
pub use metric_spec::spec_of;
pub use phases::{Abort, Batch, ImageFormatSpec, ImageSpec, Phase, Pressure, Sleep, Stage};
pub use sections::{EngineSection, PdMode, PdSection, SoakSection};
pub use validate::{
    MAX_ITERATIONS, MAX_NUM_SEQS, MAX_REQUESTS_PER_PHASE, MAX_SEQUENCES_PER_PHASE, MAX_SEQUENCE_TOKENS,
    MAX_TEMPLATE_WIDTH,
};
/// The scenarios shipped with plateau, embedded so that `plateau run NAME` and `plateau selftest`
/// work from any directory.
pub const SHIPPED: [(&str, &str); 8] = [
    ("pd-transfer", include_str!("../../../scenarios/pd-transfer.toml")),
    ("multimodal-repeat", include_str!("../../../scenarios/multimodal-repeat.toml")),
    ("n-sampling", include_str!("../../../scenarios/n-sampling.toml")),
    ("aborts", include_str!("../../../scenarios/aborts.toml")),
    ("rl-rollout", include_str!("../../../scenarios/rl-rollout.toml")),
    ("prefill-only", include_str!("../../../scenarios/prefill-only.toml")),
    ("mixed", include_str!("../../../scenarios/mixed.toml")),
    ("vlm-rollout", include_str!("../../../scenarios/vlm-rollout.toml")),
];

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    pub description: String,
    #[serde(default)]
    pub engine: EngineSection,
    #[serde(default)]
    pub soak: SoakSection,
    /// Prefill/decode disaggregation: when present, requests go through a prefill/decode pair.
    pub pd: Option<PdSection>,
    /// The simulated cluster (`[sim]`), read by plateau-sim alone: kept here as written.
    #[serde(default)]
    pub sim: toml::Table,
    #[serde(rename = "phase")]
    pub phases: Vec<Phase>,
    /// Where the scenario was read from (a path or `<shipped NAME>`) and its text, for errors
    /// about it found later (by another crate's section, by the engine).
    #[serde(skip)]
    pub file: String,
    #[serde(skip)]
    pub text: String,
}

pub fn parse_duration_secs(s: &str) -> Result<f64, String> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(s.len()));
    let v: f64 = num.parse().map_err(|_| format!("`{s}` is not a duration such as 90s, 10m or 2h"))?;
    let mult = match unit {
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => return Err(format!("`{s}`: unit must be s, m or h")),
    };
    if !(v > 0.0 && v * mult <= 366.0 * 86_400.0) {
        return Err(format!("`{s}` must be positive and at most a year"));
    }
    Ok(v * mult)
}

/// A scenario file may hold at most this many bytes: the shipped ones are a few KiB, and
/// validation bounds every size inside it.
pub const MAX_SCENARIO_BYTES: u64 = 1 << 20;

/// The text of a scenario file: a regular file (a FIFO would block the reader forever, a device
/// never ends) of at most [`MAX_SCENARIO_BYTES`], in UTF-8.
fn read_scenario_file(path: &Path) -> Result<String, String> {
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file (a directory, FIFO or device): give a .toml file".into());
    }
    if meta.len() > MAX_SCENARIO_BYTES {
        return Err(format!("{} bytes, past the {} KiB a scenario may hold", meta.len(), MAX_SCENARIO_BYTES >> 10));
    }
    let mut text = String::new();
    let f = std::fs::File::open(path).map_err(|e| e.to_string())?;
    std::io::Read::read_to_string(&mut std::io::Read::take(f, MAX_SCENARIO_BYTES + 1), &mut text)
        .map_err(|e| e.to_string())?;
    if text.len() as u64 > MAX_SCENARIO_BYTES {
        return Err(format!("grew past {} KiB while it was read", MAX_SCENARIO_BYTES >> 10));
    }
    Ok(text)
}

impl Scenario {
    /// The engine configuration of one node: the `[engine]` section, with the `[pd]` section's
    /// decode-side pull limit where there is one.
    pub fn engine_config(&self, injections: plateau_engine::Injections, seed: u64) -> plateau_engine::EngineConfig {
        let mut c = self.engine.to_config(injections, seed);
        if let Some(pd) = &self.pd {
            c.max_pulls_in_flight = pd.max_pulls_in_flight;
        }
        c
    }

    /// Loads a scenario from a path, or a shipped one by name.
    pub fn load(arg: &str) -> Result<(Scenario, String), ScenarioError> {
        let path = Path::new(arg);
        if !path.exists() {
            if let Some((_, text)) = SHIPPED.iter().find(|(n, _)| *n == arg) {
                return Ok((Scenario::parse(text, &format!("<shipped {arg}>"))?, format!("<shipped {arg}>")));
            }
        }
        let text = read_scenario_file(path).map_err(|message| ScenarioError {
            file: arg.to_string(),
            line: 0,
            column: 0,
            message: format!("cannot read the scenario: {message}"),
        })?;
        Ok((Scenario::parse(&text, arg)?, arg.to_string()))
    }

    pub fn parse(text: &str, file: &str) -> Result<Scenario, ScenarioError> {
        let mut s: Scenario = toml::from_str(text)
            .map_err(|e| {
                let (line, column) = e.span().map(|sp| line_col(text, sp.start)).unwrap_or((0, 0));
                phase_error(text, line).unwrap_or_else(|| (line, column, explain(e.message())))
            })
            .map_err(|(line, column, message)| ScenarioError { file: file.to_string(), line, column, message })?;
        s.validate(text, file)?;
        (s.file, s.text) = (file.to_string(), text.to_string());
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_scenarios_parse() {
        for (name, text) in SHIPPED {
            let s = Scenario::parse(text, name).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(s.name, name);
        }
    }

    #[test]
    fn typo_names_line_field_and_closest() {
        let text = "name = \"x\"\ndescription = \"d\"\n[engine]\nnum_kv_blockz = 3\n[[phase]]\nkind = \"batch\"\n";
        let e = Scenario::parse(text, "f.toml").unwrap_err().to_string();
        assert!(e.starts_with("f.toml:4:"), "{e}");
        assert!(e.contains("`num_kv_blockz`") && e.contains("did you mean `num_kv_blocks`"), "{e}");
        let text = "name = \"x\"\ndescription = \"d\"\n[[phase]]\nkind = \"bacth\"\n";
        let e = Scenario::parse(text, "f.toml").unwrap_err().to_string();
        assert!(e.contains("did you mean `batch`"), "{e}");
    }

    #[test]
    fn wrong_type_and_impossible_values() {
        let text = "name = \"x\"\ndescription = \"d\"\n[[phase]]\nkind = \"batch\"\nn = \"two\"\n";
        let e = Scenario::parse(text, "f.toml").unwrap_err().to_string();
        assert!(e.starts_with("f.toml:5:"), "{e}");
        let text = "name = \"x\"\ndescription = \"d\"\n[[phase]]\nkind = \"sleep\"\n[[phase]]\nkind = \"batch\"\ntop_p = 1.5\n";
        let e = Scenario::parse(text, "f.toml").unwrap_err().to_string();
        assert_eq!(e, "f.toml:7:1: phase[1].top_p: 1.5 is outside (0, 1]");
        let text = "name = \"x\"\ndescription = \"d\"\n[soak]\niterations = 0\n[[phase]]\nkind = \"batch\"\n";
        let e = Scenario::parse(text, "f.toml").unwrap_err().to_string();
        assert_eq!(e, "f.toml:4:1: soak.iterations: must be at least 1");
        let text = "name = \"x\"\ndescription = \"d\"\n[soak]\niterations = 100\nmax_iterations = 50\n[[phase]]\nkind = \"batch\"\n";
        let e = Scenario::parse(text, "f.toml").unwrap_err().to_string();
        assert_eq!(e, "f.toml:5:1: soak.max_iterations: 50 is below the run's planned length (100 iterations)");
        let text = "name = \"x\"\ndescription = \"d\"\n[soak]\niterations = 100\ntarget_iterations = 600\nmax_iterations = 400\n[[phase]]\nkind = \"batch\"\n";
        let e = Scenario::parse(text, "f.toml").unwrap_err().to_string();
        assert_eq!(
            e,
            "f.toml:6:1: soak.max_iterations: 400 is below the planned length of a run against a server (target_iterations = 600)"
        );
        let text = "name = \"x\"\ndescription = \"d\"\n[soak]\ntarget_iterations = 100\ntarget_warmup_iterations = 100\n[[phase]]\nkind = \"batch\"\n";
        let e = Scenario::parse(text, "f.toml").unwrap_err().to_string();
        assert_eq!(
            e,
            "f.toml:5:1: soak.target_warmup_iterations: a run against a server would skip 100 iterations of its 100: nothing would be judged"
        );
    }

    #[test]
    fn a_run_against_a_server_takes_the_target_length_where_one_is_given() {
        let text = "name = \"x\"\ndescription = \"d\"\n[soak]\niterations = 200\ntarget_iterations = 600\ntarget_warmup_iterations = 300\n[[phase]]\nkind = \"batch\"\n";
        let s = Scenario::parse(text, "f.toml").unwrap();
        let t = s.soak.for_target();
        assert_eq!((s.soak.iterations, s.soak.warmup_iterations), (200, 20));
        assert_eq!((t.iterations, t.warmup_iterations), (600, 300));
        // Without target figures a run against a server is the scenario's own length.
        let plain =
            Scenario::parse("name = \"x\"\ndescription = \"d\"\n[[phase]]\nkind = \"batch\"\n", "f.toml").unwrap();
        assert_eq!(plain.soak.for_target(), plain.soak);
    }

    #[test]
    fn disaggregated_scenarios_refuse_n_above_one_in_every_phase() {
        let text = "name = \"x\"\ndescription = \"d\"\n[pd]\n[[phase]]\nkind = \"pressure\"\nn = 2\n";
        let e = Scenario::parse(text, "f.toml").unwrap_err().to_string();
        assert!(e.contains("n = 1"), "{e}");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration_secs("10m"), Ok(600.0));
        assert_eq!(parse_duration_secs("1.5h"), Ok(5400.0));
        assert!(parse_duration_secs("10 parsecs").is_err());
        assert!(parse_duration_secs("0s").is_err());
        assert!(parse_duration_secs("100000000000000000000h").is_err());
    }
}
