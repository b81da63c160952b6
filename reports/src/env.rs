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
    /// An external target's dialect and what showed it (`vllm: GET /is_sleeping answered`),
    /// written once the server answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dialect: Option<String>,
    pub host: String,
    pub kernel: String,
    pub cpu_model: String,
    pub cpus: u64,
    pub memory_bytes: u64,
    /// The GPU seen (name and memory), or why none was ("not available: ...").
    pub gpu: String,
    /// Whether the process's address space was laid out the same as in every run (the kernel's
    /// randomisation off) or randomised, and why. Absent in files written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address_layout: Option<String>,
    /// The arguments of `plateau run` that shaped the run, as it resolved them (the scenario,
    /// `--seed`, backend, warm-up, tolerance, injections, P/D processes, timer, the target and
    /// its command and settings), without its length: what [`replay_command`] repeats. Absent in
    /// files written before it was recorded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replay_args: Vec<String>,
}

/// The one command that replays a run: `plateau run` with every argument that shaped it and the
/// length it ran (`--iterations`, the iterations done). Every place that shows it (the run's own
/// output, `explain`, report.html, CI summaries) takes it from here. Without the recorded
/// arguments (an older run, samples from elsewhere) it is rebuilt from the verdict and says less.
pub fn replay_command(v: &crate::Verdict, env: Option<&Environment>) -> String {
    let mut words: Vec<String> = vec!["plateau".into(), "run".into()];
    match env.filter(|e| !e.replay_args.is_empty()) {
        Some(e) => words.extend(e.replay_args.iter().map(|a| shell_word(a))),
        None => {
            let scenario = env
                .map(|e| e.scenario_source.strip_prefix("shipped:").unwrap_or(&e.scenario_source).to_string())
                .unwrap_or_else(|| v.scenario.clone());
            words.extend([shell_word(&scenario), "--seed".into(), v.seed.to_string()]);
            for i in &v.injections {
                words.extend(["--inject".into(), shell_word(i)]);
            }
            if let Some(t) = env.and_then(|e| e.target.as_ref()) {
                words.extend(["--target".into(), shell_word(t)]);
            }
        }
    }
    words.extend(["--iterations".into(), v.iterations.max(1).to_string()]);
    words.join(" ")
}

/// A word as a POSIX shell reads it back: bare when it is plain, else single-quoted.
pub fn shell_word(s: &str) -> String {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./:=@%+,".contains(&b)) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_replay_repeats_every_recorded_argument_quoted_for_a_shell_with_the_length_run() {
        let v: crate::Verdict = serde_json::from_value(serde_json::json!({
            "schema": "plateau.verdict.v1", "verdict": "fail", "incomplete": false, "scenario": "n-sampling",
            "seed": 7, "backend": "external", "injections": [], "iterations": 60, "warmup_iterations": 20,
            "samples": 61, "summary": "fail", "metrics": []
        }))
        .unwrap();
        let env = Environment {
            replay_args: [
                "n-sampling",
                "--seed",
                "7",
                "--tolerance",
                "1KiB/request",
                "--target",
                "http://127.0.0.1:8000",
            ]
            .iter()
            .map(|s| s.to_string())
            .chain(["--spawn".to_string(), "python3 srv.py --port 8000".to_string()])
            .collect(),
            ..Environment::default()
        };
        assert_eq!(
            replay_command(&v, Some(&env)),
            "plateau run n-sampling --seed 7 --tolerance 1KiB/request --target http://127.0.0.1:8000 --spawn 'python3 srv.py --port 8000' --iterations 60"
        );
        assert_eq!(replay_command(&v, None), "plateau run n-sampling --seed 7 --iterations 60");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
    }
}
