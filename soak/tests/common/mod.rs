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
