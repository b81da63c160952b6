//! Replays exact to the page: three runs of one seed lay out the engine's heap identically, timer
//! samples and all. The harness allocates in an arena of its own and the binary's jemalloc keeps no
//! thread cache (whose garbage collection, paced by every byte the thread allocates, moved the
//! engine's objects at a point that depended on the clock): before both, the runs differed in
//! `jemalloc.active` by one to seven pages at most quiescent points.
//!
//! The runs are started without address-space randomization (`personality(ADDR_NO_RANDOMIZE)`,
//! what `setarch -R` does). jemalloc finds an extent through a radix tree with a 2 MiB leaf for each
//! GiB of address space its extents touch, counted in `metadata` and `resident`; where the kernel
//! puts the first mapping decides whether the heap straddles a GiB boundary. With randomization on,
//! a run whose heap did added one leaf from iteration 1 on (seen in CI: +2,097,296 bytes of
//! metadata, its 15 MiB mapping at 0x7f26bf300000 across 0x7f26c0000000), which is the kernel's
//! draw and not the seed's.

use std::collections::BTreeMap;

// Only its `tmp`: these runs start `plateau` with address randomization off, which the shared
// `plateau()` cannot.
#[allow(dead_code)]
use crate::common;

/// `jemalloc.*` levels at each quiescent point of a run's samples.
fn heap_levels(dir: &std::path::Path) -> BTreeMap<u64, Vec<(String, f64)>> {
    let text = std::fs::read_to_string(dir.join("samples.jsonl")).expect("samples.jsonl");
    let mut out = BTreeMap::new();
    for line in text.lines().skip(1) {
        let v: serde_json::Value = serde_json::from_str(line).expect("a sample");
        if v["quiescent"] != true {
            continue;
        }
        let levels = ["allocated", "active", "resident", "metadata"]
            .iter()
            .filter_map(|k| v["values"][format!("jemalloc.{k}")].as_f64().map(|x| (k.to_string(), x)))
            .collect();
        out.insert(v["iter"].as_u64().expect("iter"), levels);
    }
    out
}

/// Runs `plateau` with the kernel's address-space randomization off for it and its children.
fn plateau_without_aslr(args: &[&str]) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_plateau"));
    cmd.args(args);
    // SAFETY: personality(2) is async-signal-safe and touches no memory of this process.
    unsafe {
        cmd.pre_exec(|| {
            let current = libc::personality(0xffff_ffff);
            if current == -1
                || libc::personality((current as libc::c_ulong) | libc::ADDR_NO_RANDOMIZE as libc::c_ulong) == -1
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.output().expect("run plateau without address-space randomization")
}

#[test]
fn three_runs_of_one_seed_agree_on_every_heap_page() {
    let runs: Vec<_> = (0..3)
        .map(|k| {
            let d = common::tmp("exact-replay", &format!("run{k}"));
            // A timer sample every 50 ms: about two per iteration, each at a moment the clock picks.
            let out = d.to_str().unwrap();
            let o = plateau_without_aslr(&[
                "run",
                "mixed",
                "--seed",
                "3",
                "--iterations",
                "30",
                "--sample-interval-ms",
                "50",
                "--quiet",
                "--out",
                out,
            ]);
            assert!(matches!(o.status.code(), Some(0 | 4)), "{}", String::from_utf8_lossy(&o.stderr));
            let text = std::fs::read_to_string(d.join("samples.jsonl")).unwrap();
            assert!(text.contains("\"quiescent\":false"), "no timer sample was taken");
            heap_levels(&d)
        })
        .collect();
    assert_eq!(runs[0].len(), 31, "a quiescent point per iteration and the baseline");
    for (k, other) in runs.iter().enumerate().skip(1) {
        for (iter, levels) in &runs[0] {
            assert!(levels.iter().any(|(n, _)| n == "active"), "jemalloc.active sampled at {iter}");
            assert_eq!(Some(levels), other.get(iter), "run {k} differs from run 0 at iteration {iter}");
        }
    }
}
