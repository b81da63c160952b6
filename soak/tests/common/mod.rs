//! What the end-to-end tests share: running the built `plateau` command and a fresh directory.

use std::path::PathBuf;
use std::process::{Command, Output};

pub fn plateau(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_plateau")).args(args).output().expect("run plateau")
}

/// An empty directory for one test, named after the test file (`suite`) and the test.
pub fn tmp(suite: &str, name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("plateau-{suite}-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The names of a verdict's failing metrics.
#[allow(dead_code)] // not every test file reads verdicts
pub fn failing(verdict: &serde_json::Value) -> Vec<&str> {
    let metrics = verdict["metrics"].as_array().map(Vec::as_slice).unwrap_or_default();
    metrics.iter().filter(|m| m["status"] == "fail").filter_map(|m| m["name"].as_str()).collect()
}

/// A copy of a run directory's files (not its subdirectories), to tamper with.
#[allow(dead_code)] // not every test file copies runs
pub fn copy_run(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() {
            std::fs::copy(&p, to.join(p.file_name().unwrap())).unwrap();
        }
    }
}

/// A command's stdout and stderr as one text, for messages and assertions.
#[allow(dead_code)] // not every test file reads outputs this way
pub fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// A path as an argument.
#[allow(dead_code)] // not every test file passes paths this way
pub fn s(p: &std::path::Path) -> &str {
    p.to_str().unwrap()
}
