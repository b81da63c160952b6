//! Detection power on this engine's own quiet series: a synthetic heap leak of a few hundred bytes
//! per iteration, added to a real clean run's jemalloc.allocated, must be found within 500
//! iterations. Prints the smallest size found (for the issue note: `cargo test --release -p
//! plateau-soak --test power -- --nocapture`).

use std::process::Command;

use plateau_reports::{Samples, Status};
use plateau_soak::analysis::default_config;
use plateau_soak::detector::analyze;

#[test]
fn sub_kib_heap_leak_is_detected_within_500_iterations() {
    let dir = std::env::temp_dir().join(format!("plateau-power-{}", std::process::id()));
    let o = Command::new(env!("CARGO_BIN_EXE_plateau"))
        .args(["run", "n-sampling", "--iterations", "500", "--quiet", "--out"])
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "the clean run must pass: {}", String::from_utf8_lossy(&o.stderr));
    let clean = Samples::read(&dir.join("samples.jsonl")).unwrap();
    let i = clean.index("jemalloc.allocated").unwrap();
    let cfg = default_config(&clean);
    let mut smallest = None;
    for bytes_per_iter in [128.0, 256.0, 384.0, 512.0, 768.0, 1024.0] {
        let mut s = clean.clone();
        for r in &mut s.rows {
            if let Some(v) = &mut r.values[i] {
                *v += bytes_per_iter * r.iter as f64;
            }
        }
        let v = analyze(&s, &cfg, false);
        let m = v.metrics.iter().find(|m| m.name == "jemalloc.allocated").unwrap();
        println!("{bytes_per_iter:>6} B/iteration: {:?}, first at {:?}", m.status, m.first_iter);
        if m.status == Status::Fail && smallest.is_none() {
            smallest = Some(bytes_per_iter);
        }
    }
    println!("smallest detected heap leak: {smallest:?} B/iteration within 500 iterations");
    assert!(smallest.is_some_and(|b| b < 1024.0), "nothing under 1 KiB/iteration detected");
    let _ = std::fs::remove_dir_all(&dir);
}
