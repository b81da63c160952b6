//! Builds the heap-dump trigger a profiled replay preloads into a native server
//! (`src/profile/dumper.c`) with the C compiler the build already needs for jemalloc; the library
//! carries it (`include_bytes!`). Also says which tools the profiling tests find here.

fn main() {
    dumper();
    optional_tools();
}

/// `libplateau_dump.so` into OUT_DIR: a shared object with no dependency beyond libc.
fn dumper() {
    let src = "src/profile/dumper.c";
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

include!("../build/optional_tools.rs");
