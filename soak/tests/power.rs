//! Detection power on this engine's own quiet series: a default-length n-sampling run (200
//! iterations, warm-up 20), its settled jemalloc.allocated plus a synthetic linear leak. A leak
//! of 64 B per iteration (about 3 B per request) must fail; the run itself must pass; and the
//! resolution the verdict quotes must be within 25% of the smallest steady leak that fails the
//! same series, found here by bisecting the whole judge's verdict, not the detector's own search.
//! Prints both (for the issue note:
//! `cargo test --release -p plateau-soak --test soak power:: -- --nocapture`).

use std::process::Command;

use plateau_reports::{Samples, Status};
use plateau_soak::detector::judge;

#[test]
fn a_64_byte_per_iteration_heap_leak_fails_a_default_length_run() {
    let dir = std::env::temp_dir().join(format!("plateau-power-{}", std::process::id()));
    let o = Command::new(env!("CARGO_BIN_EXE_plateau"))
        .args(["run", "n-sampling", "--quiet", "--out"])
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "the clean run must pass: {}", String::from_utf8_lossy(&o.stderr));
    let clean = Samples::read(&dir.join("samples.jsonl")).unwrap();
    let i = clean.index("jemalloc.allocated").unwrap();
    let own = judge(&clean).unwrap();
    let heap = own.metrics.iter().find(|m| m.name == "jemalloc.allocated").unwrap();
    let resolution = heap.trend.as_ref().unwrap().resolution_per_iter.expect("a clean heap resolves a rate");
    let mut smallest = None;
    for bytes_per_iter in [4.0, 8.0, 16.0, 24.0, 32.0, 48.0, 64.0, 128.0] {
        let mut s = clean.clone();
        for r in &mut s.rows {
            if let Some(v) = &mut r.values[i] {
                *v += bytes_per_iter * r.iter as f64;
            }
        }
        let v = judge(&s).unwrap();
        let m = v.metrics.iter().find(|m| m.name == "jemalloc.allocated").unwrap();
        println!("{bytes_per_iter:>6} B/iteration: {:?}, first conclusive at {:?}", m.status, m.first_iter);
        if m.status == Status::Fail && smallest.is_none() {
            smallest = Some(bytes_per_iter);
        }
        if bytes_per_iter >= 64.0 {
            assert_eq!(m.status, Status::Fail, "{bytes_per_iter} B/iteration must fail: {}", m.reason);
        }
    }
    // The smallest steady rate that fails, to within 1%: bisected on the whole verdict.
    let fails = |bytes_per_iter: f64| {
        let mut s = clean.clone();
        for r in &mut s.rows {
            if let Some(v) = &mut r.values[i] {
                *v += bytes_per_iter * r.iter as f64;
            }
        }
        let v = judge(&s).unwrap();
        v.metrics.iter().find(|m| m.name == "jemalloc.allocated").unwrap().status == Status::Fail
    };
    let (mut lo, mut hi) = (0.0, 128.0);
    assert!(fails(hi));
    while hi - lo > hi * 0.01 {
        let mid = (lo + hi) / 2.0;
        if fails(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    println!(
        "smallest failing heap leak: {smallest:?} B/iteration of the steps tried, {hi:.1} B/iteration bisected; the verdict's resolution: {resolution:.1} B/iteration ({:.2} B/request)",
        heap.trend.as_ref().unwrap().resolution_per_request.unwrap_or(f64::NAN)
    );
    assert!(
        (resolution - hi).abs() <= 0.25 * hi,
        "the verdict quotes {resolution:.1} B/iteration, but the smallest steady leak that fails is {hi:.1}"
    );
    // A leak at the quoted resolution fails, as the figure says.
    assert!(fails(resolution), "a leak at the quoted resolution {resolution:.1} B/iteration passed");
    let _ = std::fs::remove_dir_all(&dir);
}
