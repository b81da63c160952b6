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

/// A vLLM-dialect server whose sleep call fails: `500` answers it with HTTP 500; `exit` answers
/// it 200 and then the whole server exits (an engine that dies after accepting the call).
const FAILING_SLEEP_SERVER: &str = concat!(
    include_str!("common/stub_server.py"),
    r#"
MODE = sys.argv[2]

class H(Stub):
    def do_GET(self):
        if self.path in ("/v1/models", "/health"):
            self.reply(200, b'{"object":"list","data":[{"id":"tiny","owned_by":"vllm"}]}')
        elif self.path == "/is_sleeping":
            self.reply(200, b'{"is_sleeping":false}')
        else:
            self.reply(404, b'{}')
    def do_POST(self):
        body = self.body()
        if self.path.startswith("/sleep"):
            if MODE == "500":
                return self.reply(500, b'{"error":{"message":"sleep mode is not enabled"}}')
            self.reply(200, b'{}')
            sys.stderr.write("engine died after the sleep call\n")
            sys.stderr.flush()
            os._exit(1)
        if self.path.startswith("/wake_up") or self.path.startswith("/reset"):
            return self.reply(200, b'{}')
        req = json.loads(body)
        self.stream(req.get("n", 1), req.get("max_tokens", 4))

serve(H)
"#
);

#[test]
#[cfg_attr(not(plateau_python3), ignore = "no python3 on this machine: the failing server is a Python script")]
fn a_sleep_call_that_fails_or_kills_the_server_ends_the_run_in_exit_3_naming_it() {
    let dir = tmp("rl_http", "failing-sleep");
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("server.py");
    std::fs::write(&script, FAILING_SLEEP_SERVER).unwrap();
    for mode in ["500", "exit"] {
        let (out, port) = (dir.join(format!("run-{mode}")), free_port());
        let url = format!("http://127.0.0.1:{port}");
        let spawn = format!("python3 {} {port} {mode}", script.display());
        let o = plateau(&[
            "run",
            "rl-rollout",
            "--iterations",
            "30",
            "--quiet",
            "--out",
            out.to_str().unwrap(),
            "--target",
            &url,
            "--spawn",
            &spawn,
        ]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(3), "{mode}: {err}");
        assert!(err.contains("the sleep call failed: POST"), "{mode}: {err}");
        // The call was sent: it is counted, and never reported as "none".
        assert!(err.contains("control calls over HTTP (vllm dialect): sleep 1 sent, 0 answered"), "{mode}: {err}");
        match mode {
            "500" => assert!(err.contains("answered 500 Internal Server Error"), "{err}"),
            _ => {
                assert!(err.contains("was answered, then GET") && err.contains("exited (exit status: 1)"), "{err}");
                assert!(err.contains("engine died after the sleep call"), "the server's last lines: {err}");
            }
        }
        // The run's end record keeps the call that failed.
        let samples = std::fs::read_to_string(out.join("samples.jsonl")).unwrap();
        let end: serde_json::Value = serde_json::from_str(samples.lines().last().unwrap()).unwrap();
        assert_eq!(end["end"]["control"]["sent"]["sleep"], 1, "{end}");
        assert!(end["end"]["control"]["failed"].as_str().unwrap().starts_with("the sleep call failed"), "{end}");
    }
}
