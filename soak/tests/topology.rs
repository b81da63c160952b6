//! A P/D deployment of separate processes soaked as one target (`run --topology`): plateau's own
//! three-process deployment (prefill and decode nodes, an HTTP proxy) judged per role, and every
//! bad deployment the contract names, each ending in bounded time with every process stopped.

use crate::common;

use std::time::{Duration, Instant};

use common::{failing, plateau, tmp};

const PD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../scenarios/topologies/plateau-pd.toml");

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn run(name: &str, topology: &str, extra: &[&str]) -> (std::process::Output, std::path::PathBuf) {
    let out = tmp("topology", name).join("run");
    let mut args = vec!["run", "pd-transfer", "--topology", topology, "--quiet", "--out", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    (plateau(&args), out)
}

/// A topology file written for one test.
fn file(name: &str, text: &str) -> String {
    let p = tmp("topology", &format!("{name}-file")).join("t.toml");
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

/// Whether any process's command line holds `marker`.
fn running(marker: &str) -> bool {
    procfs::process::all_processes().unwrap().flatten().any(|p| p.cmdline().is_ok_and(|c| c.join(" ").contains(marker)))
}

#[test]
fn a_leak_on_the_decode_side_fails_the_decode_role_alone() {
    let (o, out) = run("mmap-hook", PD, &["--inject", "pd-mmap-hook", "--iterations", "60"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("verdict.json")).unwrap()).unwrap();
    let failing = failing(&v);
    assert!(!failing.is_empty() && failing.iter().all(|m| m.starts_with("decode.")), "{failing:?}");
    // Memory outside the decode node's heap: its own figures, through the proxy's /metrics.
    assert!(failing.contains(&"decode.target.proc.anon_outside_heap"), "{failing:?}");
    let summary = v["summary"].as_str().unwrap();
    assert!(summary.contains("the role that grew: decode (prefill pass, decode fail, proxy pass)"), "{summary}");
    // The mapping that grew, from the decode process's own snapshots.
    let attribution = v["attribution"].to_string();
    assert!(attribution.contains("in the decode process (see mappings.json, roles.decode)"), "{attribution}");
    let maps: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("mappings.json")).unwrap()).unwrap();
    for role in ["prefill", "decode", "proxy"] {
        assert!(maps["roles"][role]["end"].as_array().is_some_and(|m| !m.is_empty()), "{role}'s mappings");
    }
    // plateau's nodes bring their own allocator: said for the role, nothing replayed.
    let kinds: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("servers.json")).unwrap()).unwrap();
    assert_eq!(kinds["decode"]["kind"], "own_allocator", "{kinds}");
    for role in ["prefill", "decode", "proxy"] {
        assert!(out.join(format!("target-{role}.log")).exists(), "{role}'s log");
    }
    assert!(err.contains("deployment processes, each judged under its role"), "{err}");
}

#[test]
fn a_process_that_exits_at_start_stops_the_run_naming_it_and_the_ones_before_it() {
    let marker = format!("sleep 600.{}", std::process::id());
    let text = format!(
        "url = \"http://127.0.0.1:{{port:b}}\"\n\
         [[process]]\nrole = \"a\"\nport = \"a\"\nspawn = \"{marker}\"\nhealth = \"tcp://127.0.0.1:{{port:a}}\"\n\
         [[process]]\nrole = \"b\"\nport = \"b\"\nspawn = \"false\"\nhealth = \"http://127.0.0.1:{{port:b}}/health\"\n"
    );
    // `a` never answers its health check either: a short ready timeout bounds the run.
    let f = file("exits", &text);
    let t0 = Instant::now();
    let (o, _) = run("exits", &f, &["--ready-timeout-s", "2"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(err.contains("the a process did not answer at tcp://127.0.0.1:"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(30), "bounded: {:?}", t0.elapsed());
    assert!(!running(&marker), "a spawned process outlived the run");
}

#[test]
fn a_process_that_exits_before_answering_is_named() {
    let text = "url = \"http://127.0.0.1:{port:a}\"\n[[process]]\nrole = \"a\"\nport = \"a\"\nspawn = \"sh -c 'echo no model; exit 7'\"\nhealth = \"http://127.0.0.1:{port:a}/health\"\n";
    let (o, _) = run("dies", &file("dies", text), &[]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(err.contains("the a process exit status: 7 before answering") && err.contains("no model"), "{err}");
}

#[test]
fn bad_topology_files_are_refused_naming_the_field() {
    let ok = std::fs::read_to_string(PD).unwrap();
    for (name, text, want) in [
        ("no-role", ok.replacen("role = \"decode\"\n", "", 1), "missing field `role`"),
        ("dup-port", ok.replacen("port = \"decode\"", "port = \"prefill\"", 1), "a duplicate port name"),
        (
            "missing-role",
            ok.replacen("{port:proxy}\"\n", "{port:router}\"\n", 1),
            "{port:router} names no process's port",
        ),
    ] {
        let (o, out) = run(name, &file(name, &text), &[]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains("t.toml") && err.contains(want), "{name}: {err}");
        assert!(!out.exists(), "{name}: a refused run leaves no directory");
    }
    let o = plateau(&["run", "pd-transfer", "--topology", PD, "--target", "http://127.0.0.1:9"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn a_serve_role_without_the_nodes_it_needs_is_refused() {
    for (args, want) in [
        (vec!["serve", "pd-transfer", "--role", "decode", "--port", "0"], "--role decode needs --prefill"),
        (vec!["serve", "pd-transfer", "--role", "proxy", "--prefill", "127.0.0.1:9"], "--role proxy needs --prefill"),
        (vec!["serve", "pd-transfer", "--decode", "127.0.0.1:9"], "give --role decode"),
        (
            vec!["serve", "n-sampling", "--role", "proxy", "--prefill", "127.0.0.1:9", "--decode", "127.0.0.1:9"],
            "has no [pd] section",
        ),
    ] {
        let o = plateau(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}
