//! The RL loop over HTTP: `plateau run rl-rollout --target` against `plateau serve`, whose vLLM
//! control endpoints (`/sleep`, `/wake_up`, `/is_sleeping`) run the engine's own sleep and wake.
//! The dialect is found unnamed; a leak on the sleep path is caught over HTTP; a clean loop
//! passes and says once what vLLM's dialect lacks (a weight update over HTTP).

use crate::common;

use common::{failing, plateau, tmp};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Soaks rl-rollout against `plateau serve rl-rollout SERVE_ARGS`; the run's output and verdict.
fn soak_served(name: &str, serve_args: &str, run_args: &[&str]) -> (std::process::Output, serde_json::Value) {
    let (out, port) = (tmp("rl_http", name).join("run"), free_port());
    let url = format!("http://127.0.0.1:{port}");
    let spawn = format!("{} serve rl-rollout --port {port} {serve_args}", env!("CARGO_BIN_EXE_plateau"));
    let mut args =
        vec!["run", "rl-rollout", "--quiet", "--out", out.to_str().unwrap(), "--target", &url, "--spawn", &spawn];
    args.extend_from_slice(run_args);
    let o = plateau(&args);
    let v = std::fs::read_to_string(out.join("verdict.json")).map(|t| serde_json::from_str(&t).unwrap());
    (o, v.unwrap_or(serde_json::Value::Null))
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn a_kv_pool_kept_through_sleep_in_a_served_engine_is_caught_over_http() {
    let (o, v) = soak_served("sleep-keeps-kv", "--inject sleep-keeps-kv", &["--iterations", "25"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let control = &v["control"];
    assert_eq!(control["dialect"], "vllm", "{control}");
    assert!(control["found"].as_str().unwrap().contains("GET /is_sleeping answered"), "{control}");
    assert_eq!(control["calls"]["sleep"]["count"], 25, "{control}");
    assert_eq!(control["calls"]["wake kv_cache"]["count"], 25, "{control}");
    let failing = failing(&v);
    assert!(failing.contains(&"target.registry.kv_pools"), "{failing:?}");
}

#[test]
fn a_clean_rl_loop_over_http_passes_at_the_default_length_and_says_what_vllm_lacks() {
    let (o, v) = soak_served("clean", "", &[]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(!err.contains("sleep phases skipped"), "{err}");
    assert_eq!(v["control"]["calls"]["sleep"]["count"], 150, "{}", v["control"]);
    let lacking: Vec<&str> = v["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w.as_str())
        .filter(|w| w.starts_with("weight update"))
        .collect();
    assert_eq!(lacking.len(), 1, "said once: {}", v["warnings"]);
    assert!(lacking[0].contains("skipped in 150 sleep phases"), "{lacking:?}");
}

#[test]
fn an_unknown_dialect_is_refused_naming_the_choices() {
    let o = plateau(&["run", "rl-rollout", "--target", "http://127.0.0.1:9", "--dialect", "tgi"]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.contains("--dialect tgi") && err.contains("vllm, sglang, llamacpp, openai"), "{err}");
}
