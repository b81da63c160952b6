//! Records the git commit plateau is built from (PLATEAU_COMMIT), for environment.json (outside a
//! git checkout, a crate tarball, it is "unknown"), and builds the heap-dump trigger a profiled
//! replay preloads into a native server (`src/external/profile/dumper.c`) with the C compiler the
//! build already needs for jemalloc; the binary carries it (`include_bytes!`).

fn main() {
    dumper();
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

/// `libplateau_dump.so` into OUT_DIR: a shared object with no dependency beyond libc.
fn dumper() {
    let src = "src/external/profile/dumper.c";
    println!("cargo:rerun-if-changed={src}");
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let so = out.join("libplateau_dump.so");
    let compiler = cc::Build::new().get_compiler();
    let status = compiler
        .to_command()
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&so)
        .arg(src)
        .args(["-ldl", "-lpthread"])
        .status()
        .unwrap_or_else(|e| panic!("building {src} with {}: {e}", compiler.path().display()));
    assert!(status.success(), "building {src} failed ({status})");
}

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
