//! Where a leak comes from, end to end through the `plateau` command: the heap's allocation line by
//! profiled replay (verdict.json, growth.txt, growth.pb.gz, `plateau explain`), the insertion line
//! of a registry's residue, and a replay that cannot run.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;
use common::plateau;

fn tmp(name: &str) -> PathBuf {
    common::tmp("where", name)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn verdict(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("verdict.json")).expect("verdict.json")).expect("json")
}

fn metric<'a>(v: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    v["metrics"].as_array().unwrap().iter().find(|m| m["name"] == name).unwrap_or_else(|| panic!("no {name}"))
}

/// The line of `engine/src/output.rs` where the `untracked-heap` injection keeps what it keeps,
/// read from the source so that the test follows the code.
fn injection_line() -> u32 {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/src/output.rs");
    let text = std::fs::read_to_string(path).unwrap();
    let at = text.lines().position(|l| l.contains("self.history.push(")).expect("the injection's push");
    at as u32 + 1
}

/// A failing `untracked-heap` run at 60 iterations (detection at 40, replay of 20..60).
fn untracked_heap_run(name: &str) -> PathBuf {
    let d = tmp(name);
    let args = ["run", "n-sampling", "--iterations", "60", "--inject", "untracked-heap", "--quiet", "--out"];
    let o = plateau(&[&args[..], &[d.to_str().unwrap()]].concat());
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    d
}

#[test]
fn the_heap_leak_is_named_at_its_line_in_the_verdict_growth_files_and_explain() {
    let d = untracked_heap_run("heap");
    let line = injection_line();
    let here = format!("engine/src/output.rs:{line}");
    let v = verdict(&d);
    let heap = metric(&v, "jemalloc.allocated");
    assert_eq!(heap["status"], "fail");
    let top = &heap["sites"][0];
    assert_eq!(
        (top["file"].as_str(), top["line"].as_u64()),
        (Some("engine/src/output.rs"), Some(line as u64)),
        "{top}"
    );
    assert!(top["function"].as_str().unwrap().ends_with("finalize"), "{top}");
    // The run keeps a request's 5..10 output tokens (u32) per finished request, 20 requests an
    // iteration: 0.4-0.8 KiB of tokens, in 20 vectors, plus the history's own doubling.
    let bytes = top["bytes_per_iter"].as_f64().unwrap();
    assert!((1000.0..8000.0).contains(&bytes), "{top}");
    assert!((top["objects_per_iter"].as_f64().unwrap() - 20.0).abs() < 2.0, "{top}");
    assert!(v["summary"].as_str().unwrap().contains(&here), "{}", v["summary"]);

    let txt = std::fs::read_to_string(d.join("growth.txt")).unwrap();
    let first_block = txt.split("\n\n").nth(1).unwrap();
    assert!(first_block.contains(&here), "{txt}");

    // growth.pb.gz decodes as profile.proto, with the site's function, file and line, and byte
    // totals that agree with growth.json.
    let p = plateau_soak::heapprof::pprof::read(&d.join("growth.pb.gz")).unwrap();
    let s = |i: i64| p.string_table[i as usize].as_str();
    assert_eq!(p.sample_type.iter().map(|t| s(t.r#type)).collect::<Vec<_>>(), ["inuse_objects", "inuse_space"]);
    let f = p.function.iter().find(|f| s(f.filename) == "engine/src/output.rs" && s(f.name).ends_with("finalize"));
    let f = f.expect("finalize in the profile's functions");
    let at_line = p.location.iter().any(|l| l.line.iter().any(|x| x.function_id == f.id && x.line == line as i64));
    assert!(at_line, "no location at {here}");
    let bytes_total: i64 = p.sample.iter().map(|x| x.value[1]).sum();
    let g: serde_json::Value = serde_json::from_slice(&std::fs::read(d.join("growth.json")).unwrap()).unwrap();
    let replay = g["replay_bytes_per_iter"].as_f64().unwrap()
        * (g["end_iter"].as_f64().unwrap() - g["start_iter"].as_f64().unwrap());
    assert!((bytes_total as f64 - replay).abs() < 1.0, "{bytes_total} bytes in the profile, {replay} in growth.json");
    let svg = std::fs::read_to_string(d.join("growth.svg")).unwrap();
    assert!(svg.starts_with("<?xml") && svg.contains("finalize"), "growth.svg is not a flame graph of the site");

    let o = plateau(&["explain", d.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let story = String::from_utf8_lossy(&o.stdout);
    for want in
        ["jemalloc.allocated (gauge), growing since iteration", &here, "replay: plateau run n-sampling --seed 0"]
    {
        assert!(story.contains(want), "explain lacks {want:?}:\n{story}");
    }
}

#[test]
#[ignore = "needs Go's pprof (apt install golang-go); run with --ignored where it is installed"]
fn go_tool_pprof_opens_the_growth_profile() {
    let d = untracked_heap_run("go-pprof");
    let o = Command::new("go")
        .args(["tool", "pprof", "-top", "-sample_index=inuse_space"])
        .arg(d.join("growth.pb.gz"))
        .output()
        .expect("go on PATH");
    let top = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(top.contains("OutputProcessor::finalize"), "{top}");
}

#[test]
fn a_registry_residue_is_named_at_its_insertion_line_with_its_count_and_age() {
    let d = tmp("residue");
    let args = ["run", "n-sampling", "--iterations", "30", "--inject", "registry-retains-finished", "--quiet", "--out"];
    let o = plateau(&[&args[..], &[d.to_str().unwrap()]].concat());
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let v = verdict(&d);
    let m = metric(&v, "registry.requests");
    let site = &m["sites"][0];
    let (file, line) = (site["file"].as_str().unwrap(), site["line"].as_u64().unwrap());
    assert!(file.starts_with("engine/src/") && line > 0, "{site}");
    // The line inserts into the registry: the engine's own source says so.
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(file)).unwrap();
    let src = text.lines().nth(line as usize - 1).unwrap();
    assert!(src.contains("requests") || src.contains("insert") || src.contains("add"), "{file}:{line}: {src}");
    // Every finished request stays: 20 an iteration, since the first.
    assert_eq!(site["count"], 600, "{site}");
    assert_eq!(site["oldest_iter"], 1, "{site}");
    assert!(site["function"].is_string(), "{site}");
    assert!(
        m["reason"].as_str().unwrap().contains(&format!("600 entries inserted at {file}:{line}")),
        "{}",
        m["reason"]
    );
    // No heap replay for a registry leak that the heap does not show as failing.
    assert!(!d.join("growth.json").exists() || metric(&v, "jemalloc.allocated")["status"] == "fail");
}

#[test]
fn a_replay_that_cannot_run_exits_3_and_the_verdict_stays() {
    let d = tmp("replay-fails");
    // The replay writes into RUN_DIR/replay; a file there makes its directory impossible.
    std::fs::write(d.join("replay"), b"in the way").unwrap();
    let args = ["run", "n-sampling", "--iterations", "60", "--inject", "untracked-heap", "--quiet", "--out"];
    let o = plateau(&[&args[..], &[d.to_str().unwrap()]].concat());
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(stderr(&o).contains("the run's verdict is in"), "{}", stderr(&o));
    let v = verdict(&d);
    assert_eq!(v["verdict"], "fail");
    assert_eq!(metric(&v, "jemalloc.allocated")["status"], "fail");
}

#[test]
fn profile_on_a_clean_run_lists_the_growth_and_blames_nothing() {
    let d = tmp("profile-clean");
    let args = ["run", "n-sampling", "--iterations", "100", "--profile", "--quiet", "--out"];
    let o = plateau(&[&args[..], &[d.to_str().unwrap()]].concat());
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(d.join("growth.txt").is_file() && d.join("growth.pb.gz").is_file());
    let v = verdict(&d);
    assert_eq!(metric(&v, "jemalloc.allocated")["status"], "pass");
    assert!(metric(&v, "jemalloc.allocated").get("sites").is_none(), "{v}");
    assert!(!v["summary"].as_str().unwrap().contains("top site"), "{v}");
    let attribution = v["attribution"].to_string();
    assert!(attribution.contains("profile: jemalloc.allocated did not fail"), "{attribution}");
    assert!(!attribution.contains("did not reproduce"), "{attribution}");
}

#[test]
fn explain_needs_a_run_directory() {
    let d = tmp("explain-empty");
    let o = plateau(&["explain", d.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("no samples.jsonl"), "{}", stderr(&o));
}
