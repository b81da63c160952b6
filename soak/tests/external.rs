//! The external mode end to end: `plateau run --target` against `plateau serve` spawned by plateau
//! (a leak injected and clean, every trigger of the mixed scenario), and every bad target the
//! contract names: unreachable, not OpenAI-compatible, a /metrics that does not parse, a 5xx, a
//! process that exits mid-run, a --pid that does not exist, a mapping file with an unknown kind.

use crate::common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use common::{plateau, tmp};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn serve_cmd(port: u16, extra: &str) -> String {
    format!("{} serve --port {port} {extra}", env!("CARGO_BIN_EXE_plateau"))
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn verdict(dir: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("verdict.json")).unwrap()).unwrap()
}

/// Soaks `scenario` against `plateau serve SERVE_ARGS` spawned by plateau; the run's output and
/// directory.
fn soak_served(
    name: &str,
    scenario: &str,
    serve_args: &str,
    run_args: &[&str],
) -> (std::process::Output, std::path::PathBuf) {
    let (out, port) = (tmp("external", name).join("run"), free_port());
    let url = format!("http://127.0.0.1:{port}");
    let spawn = serve_cmd(port, serve_args);
    let mut args =
        vec!["run", scenario, "--quiet", "--out", out.to_str().unwrap(), "--target", &url, "--spawn", &spawn];
    args.extend_from_slice(run_args);
    (plateau(&args), out)
}

#[test]
fn a_registry_leak_in_a_served_engine_is_caught_through_its_metrics_at_iteration_1() {
    let (o, out) = soak_served("leak", "n-sampling", "--inject registry-retains-finished", &["--iterations", "25"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let v = verdict(&out);
    let metrics = v["metrics"].as_array().unwrap();
    let m = metrics.iter().find(|m| m["name"] == "target.registry.requests").expect("the scraped registry is judged");
    assert_eq!(m["status"], "fail");
    assert_eq!(m["first_iter"], 1);
    assert!(v["backend"].as_str().unwrap().starts_with("external "), "{}", v["backend"]);
}

#[test]
fn a_clean_served_engine_passes_at_the_default_length() {
    let (o, out) = soak_served("clean", "n-sampling", "", &[]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    // The process tree and the scraped heap and registries are all judged.
    let v = verdict(&out);
    let metrics = v["metrics"].as_array().unwrap();
    let judged: Vec<&str> =
        metrics.iter().filter(|m| m["kind"] != "observed").map(|m| m["name"].as_str().unwrap()).collect();
    for want in ["target.proc.rss_anon", "target.proc.fds", "target.jemalloc.allocated", "target.registry.requests"] {
        assert!(judged.contains(&want), "{want} missing from {judged:?}");
    }
    assert!(out.join("target.log").exists());
}

#[test]
fn every_trigger_of_the_mixed_scenario_goes_over_the_api_and_leaves_no_registry_entry() {
    // The server runs the scenario's own engine section (mixed needs a vision model). The run is
    // short, so only the exact layer is asserted: nothing per-request left, nothing over capacity.
    let (o, out) = soak_served("mixed", "mixed", "mixed", &["--iterations", "25", "--warmup", "5"]);
    let err = stderr(&o);
    // 20 points after warm-up may leave a gauge's growth undecided (4): the gauges are not this
    // test's, and nothing here is read as a pass of them.
    assert!(matches!(o.status.code(), Some(0 | 1 | 4)), "{err}");
    let summary = err.lines().find(|l| l.contains("iterations in")).unwrap();
    // Aborts (closed streams), invalid requests (4xx), images (chat) and sleeps all went over the API.
    assert!(!summary.contains(" 0 aborted"), "{summary}");
    assert!(!summary.contains(" 0 invalid requests refused"), "{summary}");
    // Sleep phases too: plateau serve answers vLLM's control endpoints.
    assert!(err.contains("control calls over HTTP (vllm dialect): sleep 25"), "{err}");
    assert!(!err.contains("answered 2xx"), "{err}");
    let v = verdict(&out);
    let metrics = v["metrics"].as_array().unwrap();
    let exact_failures: Vec<&str> = metrics
        .iter()
        .filter(|m| m["status"] == "fail" && !matches!(m["kind"].as_str(), Some("gauge")))
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert!(exact_failures.is_empty(), "{exact_failures:?}");
    let refs =
        metrics.iter().find(|m| m["name"] == "target.registry.encoder_cache.refs").expect("images reached the engine");
    assert_eq!(refs["status"], "pass");
}

/// A one-thread HTTP server answering each request by its path from `routes` ((path prefix,
/// status, body); anything else 404), counting POSTs.
fn fake_server(routes: Vec<(&'static str, u16, &'static str)>) -> (String, Arc<AtomicU64>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let posts = Arc::new(AtomicU64::new(0));
    let count = Arc::clone(&posts);
    std::thread::spawn(move || {
        for stream in l.incoming().flatten() {
            let mut r = BufReader::new(stream);
            let mut first = String::new();
            if r.read_line(&mut first).is_err() {
                continue;
            }
            let mut len = 0usize;
            loop {
                let mut h = String::new();
                if r.read_line(&mut h).is_err() || h.trim().is_empty() {
                    break;
                }
                if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0; len];
            let _ = r.read_exact(&mut body);
            if first.starts_with("POST") {
                count.fetch_add(1, Ordering::SeqCst);
            }
            let path = first.split_whitespace().nth(1).unwrap_or("/").to_string();
            let (status, text) = routes
                .iter()
                .find(|(p, _, _)| path.starts_with(p))
                .map(|&(_, s, b)| (s, b))
                .unwrap_or((404, "not found"));
            let mut s = r.into_inner();
            let _ =
                write!(s, "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}", text.len());
        }
    });
    (url, posts)
}

const MODELS: &str = r#"{"object":"list","data":[{"id":"fake","object":"model"}]}"#;

fn run_against(url: &str, name: &str, extra: &[&str]) -> (std::process::Output, std::path::PathBuf) {
    let out = tmp("external", name).join("run");
    let mut args =
        vec!["run", "n-sampling", "--iterations", "5", "--quiet", "--out", out.to_str().unwrap(), "--target", url];
    args.extend_from_slice(extra);
    (plateau(&args), out)
}

/// A run with no length of its own against a server plateau spawns: it ends when the server does.
fn run_spawned(url: &str, name: &str, spawn: &str) -> (std::process::Output, std::path::PathBuf) {
    let out = tmp("external", name).join("run");
    let args =
        ["run", "n-sampling", "--iterations", "100000", "--quiet", "--out", out.to_str().unwrap(), "--target", url];
    let o = plateau(&[&args[..], &["--spawn", spawn]].concat());
    (o, out)
}

#[test]
fn an_unreachable_target_is_a_harness_failure_naming_it() {
    let url = format!("http://127.0.0.1:{}", free_port());
    let (o, _) = run_against(&url, "unreachable", &[]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(stderr(&o).contains(&url), "{}", stderr(&o));
}

#[test]
fn a_server_that_is_not_openai_compatible_is_bad_input() {
    let (url, _) = fake_server(vec![("/", 404, "<html>nope</html>")]);
    let (o, _) = run_against(&url, "not-openai", &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("OpenAI-compatible"), "{}", stderr(&o));
}

#[test]
fn a_metrics_page_that_does_not_parse_names_its_line() {
    let (url, _) = fake_server(vec![("/v1/models", 200, MODELS), ("/metrics", 200, "up 1\n<html>\n")]);
    let (o, _) = run_against(&url, "bad-metrics", &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("line 2: not Prometheus text"), "{}", stderr(&o));
}

#[test]
fn a_server_answering_5xx_is_retried_a_bounded_number_of_times_and_the_run_kept_incomplete() {
    let (url, posts) = fake_server(vec![("/v1/models", 200, MODELS), ("/v1/completions", 500, "{\"error\":\"boom\"}")]);
    // The fake server lives in this test's process: plateau watches it there.
    let pid = std::process::id().to_string();
    let (o, out) = run_against(&url, "5xx", &["--concurrency", "1", "--pid", &pid]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(err.contains("500"), "{err}");
    assert_eq!(posts.load(Ordering::SeqCst), 4, "one request, tried 1 + 3 times, then the run stops");
    let v = verdict(&out);
    assert_eq!(v["incomplete"], true);
    assert!(
        std::fs::read_to_string(out.join("samples.jsonl")).unwrap().lines().count() >= 2,
        "header and baseline kept"
    );
}

#[test]
fn a_target_process_that_exits_mid_run_ends_the_run_incomplete() {
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    // The target is a shell that starts the server and kills it after 2 s, then exits itself.
    let spawn = format!("sh -c '{} & sleep 2; kill $!; wait'", serve_cmd(port, ""));
    let (o, out) = run_spawned(&url, "exits", &spawn);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert_eq!(verdict(&out)["incomplete"], true, "{err}");
}

#[test]
fn a_target_with_no_process_to_watch_and_no_memory_gauge_is_refused_and_leaves_no_run() {
    // Without --pid or --spawn only the server's /metrics could be judged, and this one has none:
    // nothing about its memory could be judged, so the run is refused before it starts.
    let (url, posts) = fake_server(vec![("/v1/models", 200, MODELS)]);
    let (o, out) = run_against(&url, "no-process", &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--pid") && stderr(&o).contains("--spawn"), "{}", stderr(&o));
    assert_eq!(posts.load(Ordering::SeqCst), 0, "no request was sent");
    assert!(!out.exists(), "a refused run left {} behind", out.display());
}

#[test]
fn a_target_killed_after_its_growth_was_conclusive_fails_the_run_and_says_how_it_died() {
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    // The leak fails the exact layer at iteration 1; the server (the shell's own pid after `exec`)
    // is then killed with SIGKILL, as the OOM killer would.
    let spawn =
        format!("sh -c '(sleep 3; kill -9 $$) & exec {}'", serve_cmd(port, "--inject registry-retains-finished"));
    let (o, out) = run_spawned(&url, "killed", &spawn);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let v = verdict(&out);
    assert_eq!((v["verdict"].as_str(), v["incomplete"].as_bool()), (Some("fail"), Some(true)), "{err}");
    let exit = v["target_exit"].as_str().unwrap_or_default();
    assert!(exit.contains("signal: 9") && exit.contains("OOM killer"), "{exit}");
}

#[test]
fn a_pid_that_does_not_exist_is_bad_input() {
    let (url, _) = fake_server(vec![("/v1/models", 200, MODELS)]);
    let (o, _) = run_against(&url, "no-pid", &["--pid", "999999999"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--pid 999999999: no such process"), "{}", stderr(&o));
}

#[test]
fn a_mapping_file_with_an_unknown_kind_names_file_and_line() {
    let d = tmp("external", "map");
    let map = d.join("map.toml");
    std::fs::write(&map, "[[metric]]\nprometheus = \"x_running\"\nkind = \"leaky\"\n").unwrap();
    let (url, _) = fake_server(vec![("/v1/models", 200, MODELS)]);
    let (o, _) = run_against(&url, "map-run", &["--metrics-map", map.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains(&format!("{}:3:", map.display())), "{}", stderr(&o));
}

#[test]
fn a_spawned_server_that_dies_at_start_shows_its_log() {
    let url = format!("http://127.0.0.1:{}", free_port());
    let (o, _) = run_against(&url, "dies", &["--spawn", "echo no model here >&2; exit 7"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(err.contains("no model here"), "{err}");
}

#[test]
fn serve_on_a_port_in_use_names_its_own_flag() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let o = plateau(&["serve", "--port", &port]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains(&format!("--port {port}")) && stderr(&o).contains("in use"), "{}", stderr(&o));
    assert!(!stderr(&o).contains("--listen"), "{}", stderr(&o));
}

#[test]
fn a_sleep_refused_with_requests_no_client_holds_is_sampled_and_fails_the_exact_layer() {
    // Before a sleep phase the run has nothing in flight; this server still counts a running
    // request and refuses to sleep, as plateau serve does with orphaned sequences. The run samples
    // that moment as its iteration's quiescent point: the orphan is the finding, not the refusal.
    let refused = r#"{"error":{"message":"cannot sleep with 1 requests in flight"}}"#;
    let (url, _) = fake_server(vec![
        ("/v1/models", 200, MODELS),
        ("/is_sleeping", 200, r#"{"is_sleeping":false}"#),
        ("/metrics", 200, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n"),
        ("/sleep", 409, refused),
    ]);
    let d = tmp("external", "sleep-refused");
    let scenario = d.join("sleep.toml");
    std::fs::write(&scenario, "name = \"sleep-only\"\ndescription = \"sleep only\"\n[soak]\niterations = 5\nwarmup_iterations = 1\n[[phase]]\nkind = \"sleep\"\n").unwrap();
    let out = d.join("run");
    let pid = std::process::id().to_string();
    let o = plateau(&[
        "run",
        scenario.to_str().unwrap(),
        "--quiet",
        "--out",
        out.to_str().unwrap(),
        "--target",
        &url,
        "--pid",
        &pid,
        "--settle-timeout-ms",
        "50",
    ]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let v = verdict(&out);
    assert_eq!(
        (v["verdict"].as_str(), v["incomplete"].as_bool(), v["iterations"].as_u64()),
        (Some("fail"), Some(true), Some(1)),
        "{v}"
    );
    // The baseline and the refused sleep's point: without the second the iteration would be lost.
    assert_eq!(v["samples"].as_u64(), Some(2), "{v}");
    assert!(v["summary"].as_str().unwrap().contains("num_requests_running"), "{v}");
}
