//! The CUDA kernels, emulated on the host: `kernels_emulated/harness.cpp` compiles every `.cu` of
//! the backend with g++ (CUDA built-ins as plain C++: each block's threads as fibers switched at
//! its barriers; a warp's shuffles, and its tensor-core products laid out as the PTX ISA lays their
//! fragments, through its own barrier) and, at blocks of 1, 8, 40, 64 and 128 threads (warps of 1,
//! 8, 8, 32 and 32 lanes; 128 is the decode and tensor-core blocks' size on a device), runs a
//! two-layer model through them the way forward.rs does (fused products, decode attention with
//! and without splits, prefill tiles, the device's argmax), f32 and bf16, against a
//! double-precision reference; attention alone in real models' shapes (GQA groups of 1
//! to 8, 24 to 128 dimensions, odd context lengths; bf16 prefill on tensor cores where the warp
//! has 32 lanes); sampling against the host sampler's definition; and the KV block kernels.
//! It checks the kernels' indexing, arithmetic and warp exchanges without a GPU; it cannot see
//! what only a GPU shows (the memory model, timing, launch limits): scripts/gpu-check.sh runs the
//! same kernels on a device.

use std::process::Command;

/// Needs g++ (found by the build script): without it the test is reported as ignored, never as
/// passed.
#[test]
#[cfg_attr(not(plateau_gxx), ignore = "no g++ on this machine: the kernels cannot be emulated")]
fn kernels_match_the_reference_in_host_emulation() {
    let dir = std::env::temp_dir().join(format!("plateau-kernels-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("harness");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/kernels_emulated/harness.cpp");
    let built = Command::new("g++")
        .args(["-O2", "-std=c++20", "-o"])
        .arg(&exe)
        .arg(src)
        .output()
        .unwrap_or_else(|e| panic!("g++ was found when this was built but does not run now: {e}"));
    assert!(built.status.success(), "harness.cpp does not compile:\n{}", String::from_utf8_lossy(&built.stderr));
    let run = Command::new(&exe).args(["1", "8", "40", "64", "128"]).output().unwrap();
    let out = String::from_utf8_lossy(&run.stdout);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(run.status.success() && out.contains("PASS"), "{out}");
}
