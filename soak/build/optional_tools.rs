// Shared by the build scripts of plateau-soak and plateau-external (`include!`d): the tools the
// tests that profile other servers need, found on this machine.

/// What the external-profiling tests need on this machine, as cfgs: `plateau_python3` when python3
/// runs, `plateau_memray` when python3 imports memray, `plateau_cc` when cc runs, `plateau_libjemalloc` when Debian's
/// libjemalloc2 is installed. A test whose tool is missing is reported as ignored, with why.
fn optional_tools() {
    use std::process::Command;
    for cfg in ["plateau_python3", "plateau_memray", "plateau_cc", "plateau_libjemalloc"] {
        println!("cargo::rustc-check-cfg=cfg({cfg})");
    }
    println!("cargo::rerun-if-env-changed=PATH");
    let runs = |cmd: &str, args: &[&str]| Command::new(cmd).args(args).output().is_ok_and(|o| o.status.success());
    if runs("python3", &["--version"]) {
        println!("cargo::rustc-cfg=plateau_python3");
    }
    if runs("python3", &["-c", "import memray"]) {
        println!("cargo::rustc-cfg=plateau_memray");
    }
    if runs("cc", &["--version"]) {
        println!("cargo::rustc-cfg=plateau_cc");
    }
    let libs = [
        "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
        "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2",
        "/usr/lib64/libjemalloc.so.2",
        "/usr/lib/libjemalloc.so.2",
    ];
    // Watched only where present (a missing path would rebuild this crate every time): a tool
    // installed after the build is seen by the next `cargo clean` or change here.
    let found: Vec<&str> = libs.iter().copied().filter(|l| std::path::Path::new(l).exists()).collect();
    for l in &found {
        println!("cargo::rerun-if-changed={l}");
    }
    if !found.is_empty() {
        println!("cargo::rustc-cfg=plateau_libjemalloc");
    }
}
