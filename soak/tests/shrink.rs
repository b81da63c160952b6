//! `plateau shrink` and `plateau fuzz`, end to end through the `plateau` command: a failing run
//! shrinks to a scenario that still fails and keeps only its trigger, in-process and against
//! `plateau serve`; what is not a failing run is refused; a fuzz finds a leaking mix and shrinks
//! it; and every shipped injection shrinks to the trigger soak/README.md documents for it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Output;

use crate::common;
use common::plateau;

fn tmp(name: &str) -> PathBuf {
    common::tmp("shrink", name)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).expect("json")
}

fn strings(v: &serde_json::Value) -> BTreeSet<String> {
    v.as_array().expect("a list").iter().map(|s| s.as_str().expect("a string").to_string()).collect()
}

/// Three phases, one of which holds the trigger of `n-abort-orphans` (n>1, aborted after the
/// fork); the others bring images, stop tokens, invalid requests and a sleep.
const THREE_PHASES: &str = r#"
name = "three"
description = "a trigger among other things"
[engine]
preset = "tiny-vl"
[soak]
iterations = 40
[[phase]]
kind = "batch"
requests = 4
prompt = "Look at <|image_pad|>, {i}"
max_tokens = 4
stop_token_ids = [104]
invalid = 1
images = [{ width = 64, height = 48 }]
[[phase]]
kind = "batch"
requests = 6
prompt = "Question {i}"
n = 2
max_tokens = 8
ignore_eos = true
abort = { fraction = 0.5, stage = "decode" }
[[phase]]
kind = "sleep"
"#;

fn run_failing(dir: &Path, args: &[&str]) {
    let run = dir.join("run");
    let o = plateau(&[&["run"][..], args, &["--quiet", "--no-replay", "--out", run.to_str().unwrap()]].concat());
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
}

#[test]
fn a_failing_run_shrinks_to_its_trigger_and_the_minimal_scenario_still_fails() {
    let d = tmp("in-process");
    let scenario = d.join("three.toml");
    std::fs::write(&scenario, THREE_PHASES).unwrap();
    run_failing(&d, &[scenario.to_str().unwrap(), "--inject", "n-abort-orphans"]);
    let o = plateau(&["shrink", d.join("run").to_str().unwrap(), "--quiet", "--jobs", "2"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = d.join("run/shrink");
    let s = json(&out.join("shrink.json"));
    assert_eq!(strings(&s["phases"]), BTreeSet::from(["batch".to_string()]), "{s}");
    assert_eq!(strings(&s["features"]), BTreeSet::from(["n>1".to_string(), "abort:decode".to_string()]), "{s}");
    assert_eq!(strings(&s["signature"]["metrics"]), BTreeSet::from(["registry.sequences".to_string()]));
    let story = std::fs::read_to_string(out.join("story.md")).unwrap();
    assert!(story.contains("n>1: with n = 1 it passes"), "{story}");
    assert!(story.contains("abort:decode: without aborts at decode it "), "{story}");
    assert!(!story.contains("still fails (candidate"), "1-minimal: {story}");
    assert!(story.contains("turned off and still failing: images"), "{story}");
    let report = std::fs::read_to_string(d.join("run/report.html")).unwrap();
    assert!(report.contains("shrink/story.md"), "report.html links the story");
    // The minimal scenario is one anyone can run, and it fails.
    let min = d.join("min");
    let o = plateau(&[
        "run",
        out.join("minimal.toml").to_str().unwrap(),
        "--inject",
        "n-abort-orphans",
        "--quiet",
        "--out",
        min.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    // Without the injection it passes the exact layer: the trigger is the leak's, not the scenario's.
    let clean = d.join("clean");
    let o = plateau(&["run", out.join("minimal.toml").to_str().unwrap(), "--quiet", "--out", clean.to_str().unwrap()]);
    assert_ne!(o.status.code(), Some(1), "{}", stderr(&o));
}

#[test]
fn what_is_not_a_failing_run_is_refused_with_exit_2() {
    let d = tmp("refused");
    let o = plateau(&["shrink", d.join("nothing-here").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("command.json"), "{}", stderr(&o));
    let scenario = d.join("three.toml");
    std::fs::write(&scenario, THREE_PHASES.replace("iterations = 40", "iterations = 3\nwarmup_iterations = 1"))
        .unwrap();
    let run = d.join("run");
    let o = plateau(&["run", scenario.to_str().unwrap(), "--quiet", "--out", run.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    let o = plateau(&["shrink", run.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("did not fail"), "{}", stderr(&o));
    let o = plateau(&["shrink", run.to_str().unwrap(), "--budget", "ten minutes"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

#[test]
fn a_failing_external_run_shrinks_with_a_fresh_server_per_candidate() {
    let d = tmp("external");
    let scenario = d.join("three.toml");
    // A server takes no images here: the external phases are text only.
    let text: String = THREE_PHASES.replace("prompt = \"Look at <|image_pad|>, {i}\"", "prompt = \"Look, {i}\"");
    let text = text.replace("images = [{ width = 64, height = 48 }]\n", "");
    std::fs::write(&scenario, text).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}");
    let serve = format!("{} serve --port {port} --inject n-abort-orphans", env!("CARGO_BIN_EXE_plateau"));
    run_failing(&d, &[scenario.to_str().unwrap(), "--target", &url, "--spawn", &serve, "--concurrency", "4"]);
    // The recorded --spawn is a command from a run directory: never run unasked.
    let o = plateau(&["shrink", d.join("run").to_str().unwrap(), "--quiet"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--trust-run-dir") && !d.join("run/shrink/shrink.json").exists(), "{}", stderr(&o));
    let o = plateau(&["shrink", d.join("run").to_str().unwrap(), "--quiet", "--trust-run-dir"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let s = json(&d.join("run/shrink/shrink.json"));
    let features = strings(&s["features"]);
    assert!(features.contains("n>1") && features.contains("abort:decode"), "{s}");
    assert!(!features.contains("stop-tokens") && !features.contains("invalid"), "{s}");
    assert!(s["replay"].as_str().unwrap().contains("--spawn"), "{s}");
}

#[test]
fn fuzz_finds_a_mix_that_leaks_and_shrinks_it_to_the_trigger() {
    let d = tmp("fuzz");
    let scenario = d.join("three.toml");
    std::fs::write(&scenario, THREE_PHASES).unwrap();
    let out = d.join("fuzz");
    let args = ["fuzz", scenario.to_str().unwrap(), "--cases", "16", "--iterations", "5", "--quiet"];
    let o = plateau(&[&args[..], &["--inject", "n-abort-orphans", "--out", out.to_str().unwrap()]].concat());
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let f = json(&out.join("fuzz.json"));
    let first = f["first_failure"].as_u64().expect("a failing case") as usize;
    let case = &f["cases"][first];
    assert!(case["same_way"].as_bool().unwrap(), "{case}");
    let s = json(&out.join("shrink/shrink.json"));
    assert_eq!(strings(&s["features"]), BTreeSet::from(["n>1".to_string(), "abort:decode".to_string()]), "{s}");
    // Without an injection no mix leaves anything behind or grows: every case judged as a run is
    // (60 iterations, its gauges decided), and passed.
    let clean = d.join("clean");
    let clean_args = ["fuzz", scenario.to_str().unwrap(), "--cases", "4", "--iterations", "60", "--quiet"];
    let o = plateau(&[&clean_args[..], &["--out", clean.to_str().unwrap()]].concat());
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(json(&clean.join("fuzz.json"))["first_failure"].is_null());
    // Five iterations cannot decide a gauge, even gone on to twenty: undecided, never a pass.
    let short = d.join("short");
    let o = plateau(&[&args[..], &["--out", short.to_str().unwrap()]].concat());
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
}

/// soak/README.md's table of what each injection needs: (injection, scenario, phases, features).
fn documented() -> Vec<(String, String, BTreeSet<String>, BTreeSet<String>)> {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let table = readme.split("<!-- shrink-table -->").nth(1).expect("the shrink table in soak/README.md");
    let set = |cell: &str| -> BTreeSet<String> {
        cell.split(',')
            .map(|s| s.trim().trim_matches('`').to_string())
            .filter(|s| !s.is_empty() && s != "none")
            .collect()
    };
    table
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let c: Vec<&str> = l.split('|').map(str::trim).collect();
            (c[1].trim_matches('`').to_string(), c[2].to_string(), set(c[3]), set(c[4]))
        })
        .collect()
}

#[test]
#[ignore = "shrinks every shipped injection (about 13 minutes on 2 cores): cargo test --release -p plateau-soak --test soak shrink:: -- --ignored"]
fn every_shipped_injection_shrinks_to_its_documented_trigger() {
    let rows = documented();
    assert!(rows.len() >= 10, "a row per injection: {rows:?}");
    let mut wrong = Vec::new();
    for (injection, scenario, phases, features) in rows {
        let d = tmp(&injection);
        run_failing(&d, &[&scenario, "--inject", &injection]);
        let o = plateau(&["shrink", d.join("run").to_str().unwrap(), "--quiet"]);
        assert_eq!(o.status.code(), Some(0), "{injection}: {}", stderr(&o));
        let s = json(&d.join("run/shrink/shrink.json"));
        let (got_phases, got_features) = (strings(&s["phases"]), strings(&s["features"]));
        eprintln!(
            "{injection} in {scenario}: phases {got_phases:?}, features {got_features:?}, {} candidates, {:.0} s, {} -> {} iterations",
            s["candidates"].as_array().unwrap().len(),
            s["wall_secs"].as_f64().unwrap(),
            s["original_iterations"],
            s["iterations"]
        );
        if got_phases != phases || got_features != features {
            wrong.push(format!(
                "{injection}: documented {phases:?} {features:?}, shrunk to {got_phases:?} {got_features:?}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}
