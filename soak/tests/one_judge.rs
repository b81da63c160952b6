//! One judge, end to end: a verdict is one function of what a run recorded, every subcommand maps
//! it to its exit code the same way, nothing undecided exits 0, and bad input ends in bounded
//! time with exit 2 (or 3 for a target), naming what was wrong. The exit-code table in
//! soak/README.md names a test for each row; the rows this file covers say so.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::common;
use common::plateau;

fn tmp(name: &str) -> PathBuf {
    common::tmp("one-judge", name)
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A samples file: one settled heap gauge over `n` quiescent iterations, the header's extra
/// fields `extra` (JSON members, with a leading comma), and lines `tail` after the samples.
fn series(path: &Path, n: u64, extra: &str, value: impl Fn(u64) -> f64, tail: &str) {
    let mut t = format!(
        "{{\"schema\":\"plateau.samples.v1\",\"scenario\":\"s\",\"seed\":0,\"backend\":\"cpu\",\"warmup_iterations\":20{extra},\"metrics\":{{\"jemalloc.allocated\":{{\"kind\":\"gauge\",\"unit\":\"bytes\"}}}}}}\n"
    );
    for i in 1..=n {
        t.push_str(&format!(
            "{{\"t\":{},\"iter\":{i},\"quiescent\":true,\"values\":{{\"jemalloc.allocated\":{}}}}}\n",
            i as f64 * 0.05,
            value(i)
        ));
    }
    t.push_str(tail);
    std::fs::write(path, t).unwrap();
}

#[test]
fn report_redraws_with_the_recorded_verdict_and_analyze_with_other_settings_writes_beside_it() {
    let d = tmp("tolerance");
    let o =
        plateau(&["run", "n-sampling", "--iterations", "60", "--tolerance", "1KiB/request", "--quiet", "--out", s(&d)]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let recorded = std::fs::read(d.join("verdict.json")).unwrap();
    // report: the same verdict, byte for byte, and its code.
    let o = plateau(&["report", s(&d)]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(std::fs::read(d.join("verdict.json")).unwrap(), recorded, "report rewrote the verdict");
    // analyze with what was recorded: the same verdict.
    let o = plateau(&["analyze", s(&d.join("samples.jsonl")), "--out", s(&d.join("again"))]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let again: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("again/verdict.json")).unwrap()).unwrap();
    assert_eq!(again["tolerance"], "1KiB/request");
    assert!(again.get("overrides").is_none(), "{again}");
    // analyze with another tolerance: beside the run's verdict, named, never over it.
    let o = plateau(&["analyze", s(&d.join("samples.jsonl")), "--tolerance", "0"]);
    assert!(matches!(o.status.code(), Some(0 | 1 | 4)), "{}", text(&o));
    assert_eq!(
        std::fs::read(d.join("verdict.json")).unwrap(),
        recorded,
        "analyze --tolerance overwrote the run's verdict"
    );
    let beside: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("analyze/verdict.json")).unwrap()).unwrap();
    assert_eq!(beside["overrides"][0], "--tolerance 0B/iteration", "{beside}");
    let o = plateau(&["analyze", s(&d.join("samples.jsonl")), "--tolerance", "0", "--out", s(&d)]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("never over it"), "{}", text(&o));
    // explain exits with the verdict's code too, and prints the one replay command.
    let o = plateau(&["explain", s(&d)]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains("replay: plateau run n-sampling --seed 0 --tolerance 1KiB/request --iterations 60"),
        "{}",
        text(&o)
    );
    // A directory that is not a run, or whose verdict cannot be read: bad input.
    let o = plateau(&["report", s(&d.join("again/none"))]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    std::fs::write(d.join("again/verdict.json"), "{\"schema\":").unwrap();
    std::fs::copy(d.join("samples.jsonl"), d.join("again/samples.jsonl")).unwrap();
    let o = plateau(&["report", s(&d.join("again"))]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("again/verdict.json"), "{}", text(&o));
}

#[test]
fn samples_that_stop_short_of_their_plan_or_hold_too_few_points_never_pass() {
    let d = tmp("cut");
    // 120 of a planned 200 iterations, no end record: a run that was cut, never a pass.
    let cut = d.join("cut.jsonl");
    series(&cut, 120, ",\"planned_iterations\":200", |_| 6e6, "");
    let o = plateau(&["analyze", s(&cut), "--out", s(&d.join("a"))]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    assert!(text(&o).contains("stop at iteration 120 of the 200 it planned"), "{}", text(&o));
    // The same samples with their end recorded: decided, and a pass.
    let whole = d.join("whole.jsonl");
    series(&whole, 120, ",\"planned_iterations\":120", |_| 6e6, "{\"t\":99,\"iter\":120,\"quiescent\":false,\"values\":{},\"end\":{\"state\":\"completed\",\"iterations\":120}}\n");
    let o = plateau(&["analyze", s(&whole), "--out", s(&d.join("b"))]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // An end record that says the run failed: never a pass.
    let failed = d.join("failed.jsonl");
    series(&failed, 120, "", |_| 6e6, "{\"t\":99,\"iter\":120,\"quiescent\":false,\"values\":{},\"end\":{\"state\":\"failed\",\"iterations\":120,\"error\":\"the target went away\"}}\n");
    let o = plateau(&["analyze", s(&failed), "--out", s(&d.join("c"))]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    assert!(text(&o).contains("the target went away"), "{}", text(&o));
    // One per-request metric seen at one quiescent point: nothing decided.
    let one = d.join("one.jsonl");
    std::fs::write(
        &one,
        "{\"schema\":\"plateau.samples.v1\",\"scenario\":\"s\",\"seed\":0,\"backend\":\"cpu\",\"metrics\":{\"registry.requests\":{\"kind\":\"per_request\",\"unit\":\"count\"}}}\n{\"t\":1,\"iter\":1,\"quiescent\":true,\"values\":{\"registry.requests\":0}}\n",
    )
    .unwrap();
    let o = plateau(&["analyze", s(&one), "--out", s(&d.join("d"))]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
}

#[test]
fn two_late_steps_with_no_release_never_pass_whatever_their_average() {
    let d = tmp("steps-late");
    let f = d.join("s.jsonl");
    let header_extra = ",\"tolerance\":\"1B/request\"";
    // 25 requests an iteration (the tolerance accepts 25 B/iteration); steps of 2 KiB at 120 and
    // 170 average 23 B/iteration over the run and imply 41.
    let mut t = format!(
        "{{\"schema\":\"plateau.samples.v1\",\"scenario\":\"s\",\"seed\":0,\"backend\":\"cpu\",\"warmup_iterations\":20{header_extra},\"metrics\":{{\"jemalloc.allocated\":{{\"kind\":\"gauge\",\"unit\":\"bytes\"}},\"requests\":{{\"kind\":\"counter\",\"unit\":\"count\",\"role\":\"requests\"}}}}}}\n"
    );
    for i in 1..=200u64 {
        let heap = 6e6 + if i >= 120 { 2048.0 } else { 0.0 } + if i >= 170 { 2048.0 } else { 0.0 };
        t.push_str(&format!(
            "{{\"t\":{},\"iter\":{i},\"quiescent\":true,\"values\":{{\"jemalloc.allocated\":{heap},\"requests\":{}}}}}\n",
            i as f64 * 0.05,
            25 * i
        ));
    }
    std::fs::write(&f, t).unwrap();
    let o = plateau(&["analyze", s(&f), "--out", s(&d.join("a"))]);
    assert!(matches!(o.status.code(), Some(1 | 4)), "{}", text(&o));
}

#[test]
fn bad_input_ends_at_once_with_exit_2_naming_it() {
    let d = tmp("bad");
    let quick = |args: &[&str]| {
        let t0 = Instant::now();
        let o = plateau(args);
        assert!(t0.elapsed() < Duration::from_secs(30), "plateau {args:?} took {:?}", t0.elapsed());
        o
    };
    // A FIFO with no writer, as the scenario and as the samples: refused before it is opened.
    let fifo = d.join("fifo.toml");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let o = quick(&["run", s(&fifo), "--quiet"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("not a regular file"), "{}", text(&o));
    let o = quick(&["analyze", s(&fifo)]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    // A device that never ends.
    let o = quick(&["analyze", "/dev/zero", "--out", s(&d.join("z"))]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("/dev/zero"), "{}", text(&o));
    // A value no memory can be: refused where it enters, naming its line and field.
    let huge = d.join("huge.jsonl");
    series(&huge, 200, "", |i| if i == 150 { 1.7e308 } else { 6e6 }, "");
    let o = quick(&["analyze", s(&huge), "--out", s(&d.join("h"))]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("huge.jsonl:151: values.jemalloc.allocated"), "{}", text(&o));
    // A scenario whose name would put its run outside runs/.
    let esc = d.join("esc.toml");
    let shipped =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/n-sampling.toml")).unwrap();
    let renamed: String = shipped
        .lines()
        .map(|l| if l.starts_with("name = ") { "name = \"../../escape\"".to_string() } else { l.to_string() })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&esc, renamed).unwrap();
    let work = d.join("w");
    std::fs::create_dir_all(&work).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_plateau"))
        .args(["run", s(&esc), "--iterations", "5", "--quiet"])
        .current_dir(&work)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("name: `../../escape` is not a plain name"), "{}", text(&o));
    assert!(std::fs::read_dir(&d).unwrap().all(|e| !e.unwrap().file_name().to_string_lossy().starts_with("escape")));
    assert!(!work.join("runs").exists(), "a refused run left a directory");
}

#[test]
fn a_target_that_accepts_and_never_answers_is_a_target_failure_in_bounded_time() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // Accept and hold every connection; never answer.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in listener.incoming().flatten() {
            held.push(c);
        }
    });
    let d = tmp("mute");
    let pid = std::process::id().to_string();
    let url = format!("http://127.0.0.1:{port}");
    let t0 = Instant::now();
    let o = plateau(&[
        "run",
        "n-sampling",
        "--target",
        &url,
        "--pid",
        &pid,
        "--ready-timeout-s",
        "3",
        "--iterations",
        "30",
        "--quiet",
        "--out",
        s(&d),
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(t0.elapsed() < Duration::from_secs(60), "took {:?}", t0.elapsed());
    assert!(text(&o).contains("no answer within 3 s"), "{}", text(&o));
}

#[test]
fn a_night_that_could_not_be_judged_is_never_no_regression() {
    let root = tmp("nights");
    let db = root.join("h.db");
    let mut dirs = Vec::new();
    for (k, n) in [(1, 100), (2, 100), (3, 10)] {
        let d = root.join(format!("n{k}"));
        std::fs::create_dir_all(&d).unwrap();
        // Each night a little apart, so that no two hold the same samples (stored once).
        series(&d.join("samples.jsonl"), n, "", |i| 6e6 + (k * 64) as f64 + ((i * 7919) % 13) as f64 * 8.0, "");
        let o = plateau(&["analyze", s(&d.join("samples.jsonl"))]);
        assert!(matches!(o.status.code(), Some(0 | 4)), "{}", text(&o));
        dirs.push(d);
    }
    // A run that ended before its first sample: no samples, skipped with a line, the rest stored.
    let empty = root.join("failed-at-start");
    std::fs::create_dir_all(&empty).unwrap();
    std::fs::write(empty.join("environment.json"), "{}").unwrap();
    let mut args = vec!["history", "add"];
    args.extend(dirs.iter().map(|d| s(d)));
    args.extend([s(&empty), "--db", s(&db)]);
    let o = plateau(&args);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains("failed-at-start: no samples.jsonl") && text(&o).contains("3 runs added"),
        "{}",
        text(&o)
    );
    // Tonight's run (10 iterations) could not be judged: undecided, never "no regression".
    let o = plateau(&["history", "check", "--db", s(&db)]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    assert!(text(&o).contains("UNDECIDED s: the latest night"), "{}", text(&o));
}

#[test]
fn fuzz_passes_only_with_every_case_judged_and_refuses_what_is_not_a_scenario() {
    let d = tmp("fuzz");
    let o = plateau(&["fuzz", "n-sampling", "--cases", "2", "--quiet", "--out", s(&d.join("f"))]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("2 cases of 60 iterations or more, all judged and passed"), "{}", text(&o));
    let o = plateau(&["fuzz", s(&d.join("missing.toml")), "--quiet"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

#[test]
fn a_run_that_does_not_fail_again_from_its_seed_cannot_be_shrunk() {
    let d = tmp("not-again");
    let o = plateau(&["run", "n-sampling", "--iterations", "3", "--quiet", "--out", s(&d)]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    // Its samples say a registry kept requests (a verdict.json edited alone is never believed:
    // every reader judges the samples again); its seed says otherwise.
    let text_of = std::fs::read_to_string(d.join("samples.jsonl")).unwrap();
    let edited: Vec<String> = text_of
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            if v["quiescent"] == true && v["iter"].as_u64().is_some_and(|i| i > 0) {
                v["values"]["registry.requests"] = 5.0.into();
            }
            v.to_string()
        })
        .collect();
    std::fs::write(d.join("samples.jsonl"), edited.join("\n") + "\n").unwrap();
    let o = plateau(&["shrink", s(&d), "--quiet"]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(text(&o).contains("did not fail the same way again"), "{}", text(&o));
}

#[test]
fn fuzz_and_shrink_that_ran_out_of_budget_never_exit_0() {
    let d = tmp("budget");
    let o = plateau(&["fuzz", "n-sampling", "--budget", "0.000001s", "--quiet", "--out", s(&d.join("fuzz"))]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(text(&o).contains("no case was judged"), "{}", text(&o));
    let leak = d.join("leak");
    let o = plateau(&[
        "run",
        "n-sampling",
        "--inject",
        "registry-retains-finished",
        "--iterations",
        "30",
        "--no-replay",
        "--quiet",
        "--out",
        s(&leak),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let o = plateau(&["shrink", s(&leak), "--budget", "0.001s", "--quiet", "--out", s(&d.join("shrink"))]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    assert!(text(&o).contains("budget"), "{}", text(&o));
}
