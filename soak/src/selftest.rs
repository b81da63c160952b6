//! `plateau selftest`: proves the harness's power. Every injection must be caught, in the scenario
//! that triggers it, naming the right metric; every clean scenario must pass. Each case runs the
//! `plateau` binary itself in a child process, so it checks exactly what a user runs (exit codes,
//! verdict.json) and one case's memory never shows in another's.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use plateau_reports::{Status, Verdict};

pub struct Case {
    pub scenario: &'static str,
    pub inject: Option<&'static str>,
    /// Iterations in --quick mode (None: the scenario's own count).
    pub quick_iterations: u64,
    /// The metric the verdict must fail on (None: the run must pass).
    pub expect_metric: Option<&'static str>,
}

pub const CASES: [Case; 17] = [
    Case { scenario: "n-sampling", inject: None, quick_iterations: 60, expect_metric: None },
    Case { scenario: "aborts", inject: None, quick_iterations: 60, expect_metric: None },
    Case { scenario: "rl-rollout", inject: None, quick_iterations: 60, expect_metric: None },
    Case { scenario: "prefill-only", inject: None, quick_iterations: 60, expect_metric: None },
    Case { scenario: "mixed", inject: None, quick_iterations: 60, expect_metric: None },
    Case { scenario: "multimodal-repeat", inject: None, quick_iterations: 60, expect_metric: None },
    Case { scenario: "pd-transfer", inject: None, quick_iterations: 60, expect_metric: None },
    Case {
        scenario: "n-sampling",
        inject: Some("registry-retains-finished"),
        quick_iterations: 30,
        expect_metric: Some("registry.requests"),
    },
    Case {
        scenario: "aborts",
        inject: Some("n-abort-orphans"),
        quick_iterations: 30,
        expect_metric: Some("registry.sequences"),
    },
    Case {
        scenario: "aborts",
        inject: Some("abort-keeps-blocks"),
        quick_iterations: 30,
        expect_metric: Some("registry.kv.blocks_used"),
    },
    Case {
        scenario: "rl-rollout",
        inject: Some("sleep-keeps-kv"),
        quick_iterations: 30,
        expect_metric: Some("registry.kv_pools"),
    },
    Case {
        scenario: "n-sampling",
        inject: Some("untracked-heap"),
        quick_iterations: 200,
        expect_metric: Some("jemalloc.allocated"),
    },
    Case {
        scenario: "multimodal-repeat",
        inject: Some("registry-retains-finished"),
        quick_iterations: 30,
        expect_metric: Some("registry.requests"),
    },
    Case {
        scenario: "aborts",
        inject: Some("encoder-cache-abort"),
        quick_iterations: 30,
        expect_metric: Some("registry.encoder_cache.refs"),
    },
    Case {
        scenario: "pd-transfer",
        inject: Some("pd-mmap-hook"),
        quick_iterations: 60,
        expect_metric: Some("proc.anon_outside_heap"),
    },
    Case {
        scenario: "pd-transfer",
        inject: Some("pd-prefill-hold"),
        quick_iterations: 30,
        expect_metric: Some("prefill.registry.pd.held"),
    },
    Case {
        scenario: "pd-transfer",
        inject: Some("pd-handles"),
        quick_iterations: 30,
        expect_metric: Some("prefill.registry.pd.handles"),
    },
];

/// What the verdict's attribution must say for an injection, beyond naming the metric.
fn expected_attribution(inject: &str) -> &'static [&'static str] {
    match inject {
        "pd-mmap-hook" => &["outside the heap", "mapping:"],
        "untracked-heap" => &["heap:"],
        _ => &["registry:"],
    }
}

/// Runs every case; prints one line each and a closing `selftest: N passed, M failed` line.
/// Returns the number of failed cases, or an error if the harness itself could not run.
pub fn run(quick: bool, exe: &Path, out_root: &Path) -> Result<usize, String> {
    let mut failed = 0;
    for (k, c) in CASES.iter().enumerate() {
        let name = format!("{}{}", c.scenario, c.inject.map(|i| format!(" + {i}")).unwrap_or_default());
        let out = out_root.join(format!("{k:02}-{}-{}", c.scenario, c.inject.unwrap_or("clean")));
        let mut cmd = Command::new(exe);
        cmd.args(["run", c.scenario, "--out"]).arg(&out).args(["--sample-interval-ms", "1000"]);
        if quick {
            cmd.args(["--iterations", &c.quick_iterations.to_string()]);
        }
        if let Some(i) = c.inject {
            cmd.args(["--inject", i]);
        }
        let t0 = Instant::now();
        let output = cmd.output().map_err(|e| format!("cannot run {}: {e}", exe.display()))?;
        let secs = t0.elapsed().as_secs_f64();
        let code = output.status.code().unwrap_or(-1);
        let want = if c.expect_metric.is_some() { 1 } else { 0 };
        let verdict: Option<Verdict> =
            std::fs::read(out.join("verdict.json")).ok().and_then(|b| serde_json::from_slice(&b).ok());
        let problem = if code != want {
            let err = String::from_utf8_lossy(&output.stderr);
            Some(format!("exit {code}, want {want}: {}", err.lines().last().unwrap_or("")))
        } else if let Some(metric) = c.expect_metric {
            let attribution = verdict.as_ref().map(|v| v.attribution.join("\n")).unwrap_or_default();
            let missing = expected_attribution(c.inject.unwrap_or("")).iter().find(|w| !attribution.contains(*w));
            match verdict.as_ref().and_then(|v| v.metrics.iter().find(|m| m.name == metric)) {
                Some(m) if m.status == Status::Fail => {
                    missing.map(|w| format!("the verdict's attribution does not say `{w}`"))
                }
                _ => Some(format!("{metric} not named as failing in verdict.json")),
            }
        } else {
            None
        };
        let detail = match (&verdict, c.expect_metric) {
            (Some(v), Some(metric)) => v
                .metrics
                .iter()
                .find(|m| m.name == metric)
                .and_then(|m| m.first_iter)
                .map(|f| format!("{metric} caught at iteration {f}"))
                .unwrap_or_default(),
            (Some(v), None) => v.summary.clone(),
            _ => String::new(),
        };
        match problem {
            None => println!("ok    {name:<40} exit {code}  {secs:5.1}s  {detail}"),
            Some(p) => {
                failed += 1;
                println!("FAIL  {name:<40} {p}  ({})", out.display());
            }
        }
    }
    println!("selftest: {} passed, {failed} failed", CASES.len() - failed);
    Ok(failed)
}
