//! Records the git commit plateau is built from (PLATEAU_COMMIT), for environment.json (outside a
//! git checkout, a crate tarball, it is "unknown"), and which tools the tests that profile other
//! servers find here.

fn main() {
    optional_tools();
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=PLATEAU_COMMIT={commit}");
    // Only what exists: cargo takes a watched path that is missing as changed, and would rebuild
    // this crate at every build (packed-refs is absent until git packs its refs).
    for p in ["../.git/HEAD", "../.git/refs/heads", "../.git/packed-refs"] {
        if std::path::Path::new(p).exists() {
            println!("cargo:rerun-if-changed={p}");
        }
    }
}

include!("build/optional_tools.rs");
