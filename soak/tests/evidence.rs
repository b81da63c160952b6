//! A verdict bound to its evidence, end to end: verdict.json records the hash of the samples it
//! judged and every setting in force; every reader (report, explain, history, analyze) takes it
//! only while that holds and otherwise judges again and says so; no path passes what it did not
//! judge (a target that did no work, a fuzz whose control fails); a run writes only into its own
//! directories, and a run directory's recorded command is never run unasked; every count a user
//! sets has a cap.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::common;
use common::plateau;

fn tmp(name: &str) -> PathBuf {
    common::tmp("evidence", name)
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn json(p: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

fn sha256(p: &Path) -> String {
    use sha2::{Digest, Sha256};
    format!("{:x}", Sha256::digest(std::fs::read(p).unwrap()))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A passing 60-iteration run to read and tamper with.
fn passing_run(d: &Path) {
    let o = plateau(&["run", "n-sampling", "--iterations", "60", "--quiet", "--no-replay", "--out", s(d)]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

#[test]
fn a_verdict_records_its_samples_hash_and_every_setting_and_a_changed_run_is_judged_again() {
    let root = tmp("bound");
    let d = root.join("run");
    passing_run(&d);
    let v = json(&d.join("verdict.json"));
    let e = &v["evidence"];
    assert_eq!(e["samples_sha256"], sha256(&d.join("samples.jsonl")), "{e}");
    assert!(e["detector"].as_str().unwrap().starts_with("plateau-detector "), "{e}");
    // Defaults are recorded as such: the tolerance and where it came from.
    assert_eq!(e["settings"]["tolerance"], v["tolerance"], "{e}");
    assert!(matches!(e["settings"]["tolerance_from"].as_str(), Some("header" | "default")), "{e}");
    assert_eq!(e["settings"]["warmup_iterations"], "20", "{e}");
    assert!(e["constants"]["series::MIN_QUANTA"].is_number(), "{e}");
    // Read as it is: the recorded verdict, nothing said.
    let o = plateau(&["report", s(&d)]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(!text(&o).contains("judged again"), "{}", text(&o));

    // Samples cut mid-line beside a passing verdict: never trusted as a pass.
    let cut = root.join("cut");
    common::copy_run(&d, &cut);
    let bytes = std::fs::read(cut.join("samples.jsonl")).unwrap();
    std::fs::write(cut.join("samples.jsonl"), &bytes[..bytes.len() * 6 / 10]).unwrap();
    let recorded = std::fs::read(cut.join("verdict.json")).unwrap();
    for cmd in ["report", "explain"] {
        let o = plateau(&[cmd, s(&cut)]);
        assert_eq!(o.status.code(), Some(4), "{cmd}: {}", text(&o));
        assert!(text(&o).contains("the samples changed since") && text(&o).contains("judged again"), "{}", text(&o));
    }
    assert_eq!(std::fs::read(cut.join("verdict.json")).unwrap(), recorded, "a reader wrote over the run's verdict");
    let db = root.join("h.db");
    let o = plateau(&["history", "add", s(&cut), "--db", s(&db)]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let c = rusqlite::Connection::open(&db).unwrap();
    let (verdict, incomplete): (String, bool) =
        c.query_row("select verdict, incomplete from runs", [], |r| Ok((r.get(0)?, r.get(1)?))).unwrap();
    assert!(verdict != "pass" || incomplete, "a cut run stored as a complete passing night: {verdict}");

    // An old "warn" status does not read: refused, never taken as a pass.
    let warn = root.join("warn");
    common::copy_run(&d, &warn);
    let v = std::fs::read_to_string(warn.join("verdict.json")).unwrap();
    std::fs::write(warn.join("verdict.json"), v.replacen("\"verdict\": \"pass\"", "\"verdict\": \"warn\"", 1)).unwrap();
    for cmd in ["report", "explain"] {
        let o = plateau(&[cmd, s(&warn)]);
        assert_eq!(o.status.code(), Some(2), "{cmd}: {}", text(&o));
        assert!(text(&o).contains("unknown variant `warn`") && text(&o).contains("does not read"), "{}", text(&o));
    }

    // A verdict from another detector (its version differs) is judged again.
    let other = root.join("other");
    common::copy_run(&d, &other);
    let mut v = json(&other.join("verdict.json"));
    v["evidence"]["detector"] = "plateau-detector 0.0.1+0000000000000000".into();
    std::fs::write(other.join("verdict.json"), serde_json::to_string(&v).unwrap()).unwrap();
    let o = plateau(&["explain", s(&other)]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("it was judged by plateau-detector 0.0.1"), "{}", text(&o));

    // analyze with no flags never writes over the run's verdict: it goes into analyze/.
    let before = std::fs::read(d.join("verdict.json")).unwrap();
    let o = plateau(&["analyze", s(&d.join("samples.jsonl"))]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(std::fs::read(d.join("verdict.json")).unwrap(), before);
    assert_eq!(json(&d.join("analyze/verdict.json"))["verdict"], "pass");
}

#[test]
fn a_run_writes_only_into_an_empty_directory_or_its_own() {
    let root = tmp("out");
    let mine = root.join("mine");
    std::fs::create_dir_all(mine.join("replay")).unwrap();
    std::fs::write(mine.join("replay/keep.txt"), "precious").unwrap();
    std::fs::write(mine.join("report.html"), "mine").unwrap();
    let o = plateau(&["run", "prefill-only", "--iterations", "30", "--quiet", "--no-replay", "--out", s(&mine)]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("a directory plateau did not make"), "{}", text(&o));
    assert_eq!(std::fs::read_to_string(mine.join("replay/keep.txt")).unwrap(), "precious");
    assert_eq!(std::fs::read_to_string(mine.join("report.html")).unwrap(), "mine");
    // An empty directory is taken and marked; a second run into it replaces the first.
    let empty = root.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    for _ in 0..2 {
        let o = plateau(&["run", "prefill-only", "--iterations", "25", "--quiet", "--no-replay", "--out", s(&empty)]);
        assert!(matches!(o.status.code(), Some(0 | 4)), "{}", text(&o));
        assert!(empty.join(".plateau-run").is_file());
    }
}

#[test]
fn counts_past_their_caps_are_refused_at_once_naming_the_field() {
    let root = tmp("caps");
    let base = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../scenarios/prefill-only.toml")).unwrap();
    // Each case: lines of the shipped scenario replaced, and what the error says.
    let cases: [(&[(&str, &str)], &str); 3] = [
        (
            &[("iterations = 150", "iterations = 9000000000000000000")],
            "soak.iterations: 9000000000000000000 is above the cap",
        ),
        (&[("[engine]", "[engine]\nmax_num_seqs = 100000")], "engine.max_num_seqs: 100000 is above the cap of 4096"),
        (
            &[("requests = 24", "requests = 10000"), ("n = 1", "n = 64")],
            "are 640000 sequences in one phase, above the cap of 100000",
        ),
    ];
    for (k, (edits, want)) in cases.iter().enumerate() {
        let mut scenario = base.clone();
        for (from, to) in edits.iter() {
            assert!(scenario.contains(from), "the shipped prefill-only has no `{from}`");
            scenario = scenario.replacen(from, to, 1);
        }
        let f = root.join(format!("{k}.toml"));
        std::fs::write(&f, scenario).unwrap();
        let o = plateau(&["run", s(&f), "--quiet", "--no-replay", "--out", s(&root.join(format!("r{k}")))]);
        assert_eq!(o.status.code(), Some(2), "{want}: {}", text(&o));
        assert!(text(&o).contains(want), "{want}: {}", text(&o));
    }
    let o = plateau(&["run", "prefill-only", "--iterations", "9000000000000000000", "--out", s(&root.join("flag"))]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("not in 1..=10000000"), "{}", text(&o));
}

#[test]
fn a_negative_byte_count_in_samples_is_bad_input_naming_line_and_field() {
    let d = tmp("negative");
    let f = d.join("samples.jsonl");
    std::fs::write(
        &f,
        "{\"schema\":\"plateau.samples.v1\",\"scenario\":\"s\",\"seed\":0,\"backend\":\"cpu\",\"metrics\":{\"heap\":{\"kind\":\"gauge\",\"unit\":\"bytes\"}}}\n{\"t\":0.1,\"iter\":1,\"quiescent\":true,\"values\":{\"heap\":-1}}\n",
    )
    .unwrap();
    let o = plateau(&["analyze", s(&f)]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("samples.jsonl:2: values.heap: -1 is negative"), "{}", text(&o));
}

/// A server that breaks the contract on purpose: MODE `garbage` answers completions 200 with a
/// body that is not an event stream, `one-choice` streams one choice whatever n asks, `start500`
/// answers /v1/models with 500 (its /health says it is up), `one-left-out` leaves choice 0 out
/// of the stream of its 7th request (as vLLM 0.8.5 leaves out a choice that ends at its first
/// token) and answers the rest whole, `no-choices` streams events whose `choices` are empty,
/// `text-events` streams `data: hello` (not JSON) after a proper /v1/models.
const BROKEN_SERVER: &str = concat!(
    include_str!("common/stub_server.py"),
    r#"
import itertools
MODE = sys.argv[2]
POSTS = itertools.count(1)

class H(Stub):
    def do_GET(self):
        if self.path == "/v1/models":
            if MODE == "start500":
                return self.reply(500, b'{"error":{"message":"internal"}}')
            return self.reply(200, b'{"object":"list","data":[{"id":"tiny"}]}')
        if self.path == "/health":
            return self.reply(200, b'{}')
        self.reply(404, b'{}')
    def do_POST(self):
        req = json.loads(self.body())
        if MODE == "garbage":
            return self.reply(200, b'{"choices": [ garbage')
        if MODE == "no-choices":
            return self.reply(200, b'data: {"choices": []}\n\n' * 4 + b"data: [DONE]\n\n", "text/event-stream")
        if MODE == "text-events":
            return self.reply(200, b"data: hello\n\ndata: [DONE]\n\n", "text/event-stream")
        n = 1 if MODE == "one-choice" else req.get("n", 1)
        left_out = (0,) if MODE == "one-left-out" and next(POSTS) == 7 else ()
        self.stream(n, req.get("max_tokens", 4), left_out)

serve(H)
"#
);

/// 30 iterations of n-sampling against [`BROKEN_SERVER`] in `mode`, spawned by plateau, into
/// `dir/mode`.
fn soak_broken(dir: &Path, mode: &str) -> Output {
    let script = dir.join("broken.py");
    std::fs::write(&script, BROKEN_SERVER).unwrap();
    let port = free_port();
    let (url, spawn) = (format!("http://127.0.0.1:{port}"), format!("python3 {} {port} {mode}", s(&script)));
    let out = dir.join(mode);
    plateau(&[
        "run",
        "n-sampling",
        "--iterations",
        "30",
        "--quiet",
        "--no-replay",
        "--out",
        s(&out),
        "--target",
        &url,
        "--spawn",
        &spawn,
    ])
}

#[test]
#[cfg_attr(not(plateau_python3), ignore = "no python3 on this machine: the broken server is a Python script")]
fn a_target_that_does_no_work_is_a_target_failure_never_a_pass() {
    let d = tmp("no-work");
    for (mode, want) in [
        ("garbage", "with a body that is not the event stream asked for"),
        ("one-choice", "3 of the 3 streams that asked for more than one choice (n > 1) ended short of the choices asked for: the target ignores n"),
        ("start500", "/v1/models answered 500"),
        ("no-choices", "the stream ended with no choice in it"),
        ("text-events", "a stream event that is not JSON"),
    ] {
        let o = soak_broken(&d, mode);
        assert_eq!(o.status.code(), Some(3), "{mode}: {}", text(&o));
        assert!(text(&o).contains(want), "{mode}: {}", text(&o));
    }
}

#[test]
#[cfg_attr(not(plateau_python3), ignore = "no python3 on this machine: the broken server is a Python script")]
fn a_server_that_leaves_one_choice_out_once_is_judged_and_the_short_stream_said() {
    let d = tmp("one-left-out");
    let o = soak_broken(&d, "one-left-out");
    let out = d.join("one-left-out");
    // Judged, whatever the verdict: a run that did the work ends 0, 1 or 4, never 3.
    assert_ne!(o.status.code(), Some(3), "{}", text(&o));
    assert!(out.join("verdict.json").exists(), "{}", text(&o));
    let said = "1 of the 600 streams that asked for n > 1 ended without one of their choices";
    assert!(text(&o).contains(said), "{}", text(&o));
}

#[test]
fn fuzz_over_a_server_that_leaks_on_its_own_reports_that_failure() {
    let d = tmp("fuzz-own");
    let topo = d.join("topo.toml");
    std::fs::write(
        &topo,
        "url = \"http://127.0.0.1:{port:srv}\"\n\n[[process]]\nrole = \"srv\"\nport = \"srv\"\nspawn = \"{plateau} serve n-sampling --port {port:srv} --inject registry-retains-finished {inject}\"\nhealth = \"http://127.0.0.1:{port:srv}/health\"\n",
    )
    .unwrap();
    let o = plateau(&[
        "fuzz",
        "n-sampling",
        "--cases",
        "1",
        "--iterations",
        "20",
        "--jobs",
        "1",
        "--quiet",
        "--out",
        s(&d.join("fz")),
        "--topology",
        s(&topo),
        "--inject",
        "untracked-heap",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("the server under test grows on its own"), "{}", text(&o));
    let f = json(&d.join("fz/fuzz.json"));
    assert_eq!(f["first_failure_without_injections"], 0, "{f}");
}
