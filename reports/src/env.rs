//! environment.json, version 1: where and from what a run came (the binary's version and commit,
//! the scenario file and its hash, seed, backend, model, machine, GPU). `run` writes it before the
//! first iteration; the report shows it and the history stores it, so that two nights that differ
//! can be told apart by more than their numbers.

use serde::{Deserialize, Serialize};

pub const ENVIRONMENT_SCHEMA: &str = "plateau.environment.v1";

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Environment {
    pub schema: String,
    /// plateau's version (Cargo) and the git commit it was built from ("unknown" outside git).
    pub version: String,
    pub commit: String,
    /// The command line as given.
    pub command: String,
    /// UTC start, `2026-12-01T01:33:33Z`.
    pub started_utc: String,
    pub scenario: String,
    /// The scenario as given: a path, or `shipped:NAME`.
    pub scenario_source: String,
    /// SHA-256 of the scenario text, hex.
    pub scenario_sha256: String,
    pub seed: u64,
    pub backend: String,
    /// Model preset (plateau's engine) or the served model (an external target).
    pub model: String,
    /// `--target` URL for an external server; absent for plateau's own engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    pub host: String,
    pub kernel: String,
    pub cpu_model: String,
    pub cpus: u64,
    pub memory_bytes: u64,
    /// The GPU seen (name and memory), or why none was ("not available: ...").
    pub gpu: String,
}

impl Environment {
    /// The figures a reader compares between nights, as (label, value) rows.
    pub fn rows(&self) -> Vec<(&'static str, String)> {
        let gib = self.memory_bytes as f64 / (1u64 << 30) as f64;
        let mut rows = vec![
            ("plateau", format!("{} (commit {})", self.version, self.commit)),
            ("command", self.command.clone()),
            ("started", self.started_utc.clone()),
            ("scenario", format!("{} ({})", self.scenario, self.scenario_source)),
            ("scenario sha256", self.scenario_sha256.clone()),
            ("seed", self.seed.to_string()),
            ("backend", self.backend.clone()),
            ("model", self.model.clone()),
        ];
        if let Some(t) = &self.target {
            rows.push(("target", t.clone()));
        }
        rows.extend([
            ("machine", format!("{}, {} CPUs ({}), {gib:.1} GiB", self.host, self.cpus, self.cpu_model)),
            ("kernel", self.kernel.clone()),
            ("GPU", self.gpu.clone()),
        ]);
        rows
    }
}
