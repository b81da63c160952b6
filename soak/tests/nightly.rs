//! The nightly job's side of plateau: report.html and environment.json of every run, the report
//! against a baseline, and the history of runs across nights (add, show, check), with their bad
//! inputs.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::common;
use common::plateau;

fn tmp(name: &str) -> PathBuf {
    common::tmp("nightly", name)
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A run directory judged from a synthetic series: one gauge at `level` bytes, growing `slope`
/// bytes per iteration, over 100 quiescent iterations; `plateau analyze` writes its verdict.
fn night(root: &Path, name: &str, scenario: &str, level: f64, slope: f64) -> PathBuf {
    let d = root.join(name);
    std::fs::create_dir_all(&d).unwrap();
    let mut t = format!(
        "{{\"schema\":\"plateau.samples.v1\",\"scenario\":\"{scenario}\",\"seed\":0,\"backend\":\"cpu\",\"metrics\":{{\"heap.bytes\":{{\"kind\":\"gauge\",\"unit\":\"bytes\"}}}}}}\n"
    );
    for i in 1..=100u64 {
        // A little deterministic noise, so that the trend test has a spread to judge.
        let noise = ((i * 7919) % 13) as f64 * 8.0;
        t.push_str(&format!(
            "{{\"t\":{},\"iter\":{i},\"quiescent\":true,\"values\":{{\"heap.bytes\":{}}}}}\n",
            i as f64 * 0.1,
            level + slope * i as f64 + noise
        ));
    }
    std::fs::write(d.join("samples.jsonl"), t).unwrap();
    let o = plateau(&["analyze", s(&d.join("samples.jsonl"))]);
    assert!(matches!(o.status.code(), Some(0 | 1)), "{}", text(&o));
    d
}

#[test]
fn a_short_run_is_judged_and_writes_its_report_and_environment() {
    let d = tmp("short");
    // 60 iterations: the purge cadence gives the page-level gauges their 20 points after warm-up.
    let o = plateau(&["run", "n-sampling", "--iterations", "60", "--quiet", "--out", s(&d)]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let html = std::fs::read_to_string(d.join("report.html")).expect("report.html");
    assert!(html.len() < 2 * 1024 * 1024, "report.html is {} bytes", html.len());
    assert!(
        !html.contains("src=\"http") && !html.contains("href=\"http") && !html.contains("<script"),
        "report.html loads or runs something"
    );
    assert!(html.contains("<svg") && html.contains("PASS: n-sampling"), "no plots or no verdict in report.html");
    let env: serde_json::Value = serde_json::from_slice(&std::fs::read(d.join("environment.json")).unwrap()).unwrap();
    assert_eq!(env["schema"], "plateau.environment.v1");
    assert_eq!(env["scenario_source"], "shipped:n-sampling");
    assert_eq!(env["scenario_sha256"].as_str().map(str::len), Some(64));
    assert!(env["gpu"].as_str().is_some_and(|g| !g.is_empty()));
}

#[test]
fn the_report_compares_with_a_baseline_and_says_when_it_is_another_scenario() {
    let root = tmp("baseline");
    let a = night(&root, "a", "alpha", 1_000_000.0, 0.0);
    let b = night(&root, "b", "beta", 1_500_000.0, 0.0);
    let o = plateau(&["report", s(&b), "--baseline", s(&a)]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("the baseline ran scenario alpha, this run beta"), "{}", text(&o));
    let html = std::fs::read_to_string(b.join("report.html")).unwrap();
    assert!(html.contains("Against the baseline") && html.contains("+50.0%"), "no level change in the report");
    let o = plateau(&["report", s(&b), "--baseline", s(&root.join("missing"))]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--baseline") && text(&o).contains("missing"), "{}", text(&o));
}

#[test]
fn history_keeps_nights_shows_their_trend_and_checks_the_latest() {
    let root = tmp("history");
    let db = root.join("h.db");
    let nights: Vec<PathBuf> =
        (0..4).map(|k| night(&root, &format!("n{k}"), "soak", 1_000_000.0 + k as f64 * 1000.0, 0.0)).collect();
    let refs: Vec<&str> = nights.iter().map(|p| s(p)).collect();
    // Nothing before the first night: nothing is judged, and check says so (exit 4).
    let o = plateau(&["history", "add", refs[0], "--db", s(&db)]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = plateau(&["history", "check", "--db", s(&db)]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    let mut args = vec!["history", "add"];
    args.extend(&refs[1..]);
    args.extend(["--db", s(&db)]);
    let o = plateau(&args);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("3 runs added"), "{}", text(&o));
    // The same run again is stored once.
    let o = plateau(&["history", "add", refs[1], "--db", s(&db)]);
    assert!(text(&o).contains("0 runs added") && text(&o).contains("1 already there"), "{}", text(&o));
    let o = plateau(&["history", "check", "--db", s(&db)]);
    assert_eq!(o.status.code(), Some(0), "a level within 0.3% of its nights regressed: {}", text(&o));
    // A night whose level jumped by half, and one whose heap now grows.
    let jump = night(&root, "jump", "soak", 1_500_000.0, 0.0);
    let o = plateau(&["history", "add", s(&jump), "--db", s(&db)]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = plateau(&["history", "check", "--db", s(&db), "--last", "3"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("REGRESSION soak: heap.bytes level"), "{}", text(&o));
    let o = plateau(&["history", "show", "--db", s(&db), "--metric", "heap.bytes"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("### soak: 5 nights") && text(&o).contains("1.43 MiB"), "{}", text(&o));
    let page = std::fs::read_to_string(root.join("h.html")).expect("history page beside the database");
    assert!(page.contains("<polyline") && !page.contains("<script"));
    let o = plateau(&["history", "show", "--db", s(&db), "--scenario", "nope"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

#[test]
fn history_refuses_what_it_cannot_read_and_writes_nothing_half() {
    let root = tmp("history-bad");
    let db = root.join("h.db");
    let good = night(&root, "good", "soak", 1000.0, 0.0);
    let bare = root.join("bare");
    std::fs::create_dir_all(&bare).unwrap();
    std::fs::copy(good.join("samples.jsonl"), bare.join("samples.jsonl")).unwrap();
    std::fs::write(bare.join("verdict.json"), "{\"schema\": \"plateau.verdict.v1\", \"verd").unwrap();
    // All or nothing: the good run is not stored when another directory's verdict is unreadable.
    let o = plateau(&["history", "add", s(&good), s(&bare), "--db", s(&db)]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("bare/verdict.json"), "{}", text(&o));
    let o = plateau(&["history", "show", "--db", s(&db)]);
    assert_eq!(o.status.code(), Some(2), "a database appeared from a failed add: {}", text(&o));
    let o = plateau(&["history", "add", s(&root.join("none")), "--db", s(&db)]);
    assert!(o.status.code() == Some(2) && text(&o).contains("samples.jsonl"), "{}", text(&o));
    let junk = root.join("junk.db");
    std::fs::write(&junk, b"this is not sqlite, not at all, and long enough to have a header").unwrap();
    let o = plateau(&["history", "show", "--db", s(&junk)]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("junk.db"), "{}", text(&o));
    let o = plateau(&["history", "add", s(&good), "--db", s(&db)]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = plateau(&["history", "show", "--db", s(&db), "--html", "/nonexistent-dir/h.html"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(!Path::new("/nonexistent-dir").exists());
}

#[test]
fn a_level_that_steps_between_nights_is_not_a_regression_once_both_steps_are_stored() {
    // jemalloc.metadata sits at 1.54 or 2.07 MB from run to run with nothing changed (a 512 KiB
    // base block): the range of every stored passing night holds such a step.
    let root = tmp("history-steps");
    let db = root.join("h.db");
    for (k, level) in [1_544_000.0, 2_068_000.0, 1_544_000.0, 1_544_000.0, 2_068_000.0].into_iter().enumerate() {
        // (+k: each night its own samples, or the history stores it once.)
        let d = night(&root, &format!("n{k}"), "soak", level + k as f64, 0.0);
        let o = plateau(&["history", "add", s(&d), "--db", s(&db)]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    }
    let o = plateau(&["history", "check", "--db", s(&db), "--last", "2"]);
    assert_eq!(o.status.code(), Some(0), "a step seen before was called a regression: {}", text(&o));
    let d = night(&root, "high", "soak", 2_600_000.0, 0.0);
    plateau(&["history", "add", s(&d), "--db", s(&db)]);
    let o = plateau(&["history", "check", "--db", s(&db), "--last", "2"]);
    assert_eq!(o.status.code(), Some(1), "a level past every stored night passed: {}", text(&o));
}

#[test]
fn a_level_that_creeps_under_the_tolerance_each_night_fails_from_its_baseline_and_a_pin_resets_it() {
    // 9% a night never jumps past the 10% tolerance over the night before, but by the fourth
    // night it is 30% above the first and has risen every night: a creep, not noise.
    let root = tmp("history-creep");
    let db = root.join("h.db");
    let level = |k: i32| 1_000_000.0 * 1.09f64.powi(k);
    let add = |k: i32| {
        let d = night(&root, &format!("n{k}"), "soak", level(k), 0.0);
        let o = plateau(&["history", "add", s(&d), "--db", s(&db)]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o));
        d
    };
    for k in 0..3 {
        add(k);
    }
    let o = plateau(&["history", "check", "--db", s(&db)]);
    assert_eq!(o.status.code(), Some(0), "three nights are too few to call a creep: {}", text(&o));
    let fourth = add(3);
    let o = plateau(&["history", "check", "--db", s(&db)]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("heap.bytes level") && text(&o).contains("creeps"), "{}", text(&o));
    // Pinned on the fourth night (a change accepted), the nights after it are measured from it.
    let o = plateau(&["history", "pin", s(&fourth), "--db", s(&db)]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = plateau(&["history", "check", "--db", s(&db)]);
    assert_eq!(o.status.code(), Some(4), "the baseline alone is not judged: {}", text(&o));
    add(4);
    let o = plateau(&["history", "check", "--db", s(&db)]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("pinned"), "{}", text(&o));
    // Only a stored, complete, passing night can be a baseline.
    let o = plateau(&["history", "pin", s(&root.join("nowhere")), "--db", s(&db)]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let stray = night(&root, "stray", "soak", 5.0, 0.0);
    let o = plateau(&["history", "pin", s(&stray), "--db", s(&db)]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("history add"), "{}", text(&o));
}

#[test]
fn another_applications_database_is_refused_and_left_untouched() {
    let root = tmp("history-foreign");
    let db = root.join("other.db");
    let c = rusqlite::Connection::open(&db).unwrap();
    c.execute_batch("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL);").unwrap();
    drop(c);
    let before = std::fs::read(&db).unwrap();
    let good = night(&root, "good", "soak", 1000.0, 0.0);
    for args in [vec!["history", "add", s(&good), "--db", s(&db)], vec!["history", "check", "--db", s(&db)]] {
        let o = plateau(&args);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(text(&o).contains("not a plateau history database") && text(&o).contains("invoices"), "{}", text(&o));
    }
    assert_eq!(std::fs::read(&db).unwrap(), before, "the other application's file was written");
}
