//! What recording allocation sites costs a run: the run's own seconds an iteration (from its
//! samples: the time between its first and last quiescent points over the iterations between).
//! plateau's own engine: a plain run (`off`) against the replay that records its sites (`record`:
//! `--record-sites` with jemalloc's profiler on every allocation, what a run whose heap failed
//! runs once more before its verdict). A Python server: `--sites off`, `heap` (memray, malloc's
//! allocations with native frames) and `full` (every allocation). Each measurement is one
//! `plateau run` of n-sampling: 60 iterations of the engine, 40 of the server (its warm-up 0, so
//! every iteration is recorded). Needs memray for python3 for the server's cases (skipped, and
//! said, without it).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};

const ENGINE_ITERATIONS: u64 = 60;
const SERVER_ITERATIONS: u64 = 40;

/// A Python server on the standard library that streams its answers and keeps nothing.
const SERVER: &str = concat!(
    include_str!("../tests/common/stub_server.py"),
    r#"
class H(Stub):
    def do_GET(self):
        if self.path in ("/v1/models", "/health"):
            self.reply(200, b'{"object":"list","data":[{"id":"tiny"}]}')
        else:
            self.reply(404, b'{}')
    def do_POST(self):
        req = json.loads(self.body())
        self.stream(req.get("n", 1), req.get("max_tokens", 4))

serve(H)
"#
);

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("plateau-bench-sites-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// The run's seconds an iteration, from its samples: first to last quiescent point.
fn seconds_per_iteration(out: &Path) -> f64 {
    let text = std::fs::read_to_string(out.join("samples.jsonl")).expect("the run's samples");
    let points: Vec<(u64, f64)> = text
        .lines()
        .skip(1)
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["quiescent"] == true)
        .filter_map(|v| Some((v["iter"].as_u64()?, v["t"].as_f64()?)))
        .collect();
    let (first, last) = (points.iter().find(|p| p.0 >= 1).expect("a point"), points.last().expect("a point"));
    (last.1 - first.1) / (last.0 - first.0).max(1) as f64
}

/// Runs `plateau run` with `args` (and `env`) into a fresh directory; its seconds an iteration.
fn run(name: &str, args: &[&str], env: &[(&str, &str)]) -> f64 {
    let out = dir(name);
    let o = Command::new(env!("CARGO_BIN_EXE_plateau"))
        .args(args)
        .envs(env.iter().copied())
        .args(["--quiet", "--no-replay", "--out"])
        .arg(&out)
        .output()
        .expect("plateau runs");
    assert!(matches!(o.status.code(), Some(0 | 1 | 4)), "{}", String::from_utf8_lossy(&o.stderr));
    let s = seconds_per_iteration(&out);
    let _ = std::fs::remove_dir_all(&out);
    s
}

fn engine(record: bool) -> f64 {
    let n = ENGINE_ITERATIONS.to_string();
    let args = ["run", "n-sampling", "--iterations", &n, "--sample-interval-ms", "0"];
    match record {
        false => run("engine-off", &args, &[]),
        true => run(
            "engine-record",
            &[&args[..], &["--record-sites"]].concat(),
            &[("MALLOC_CONF", plateau_soak::driver::sites_replay::REPLAY_MALLOC_CONF)],
        ),
    }
}

fn server(script: &Path, sites: &str) -> f64 {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}");
    let spawn = format!("python3 {} {port}", script.display());
    let n = SERVER_ITERATIONS.to_string();
    let args = [
        "run",
        "n-sampling",
        "--iterations",
        &n,
        "--warmup",
        "0",
        "--target",
        &url,
        "--spawn",
        &spawn,
        "--sites",
        sites,
    ];
    run(&format!("server-{sites}"), &args, &[])
}

/// Each case's figure is the run's own seconds an iteration, one run a sample.
fn per_iteration(c: &mut Criterion, group: &str, cases: &[(&str, &dyn Fn() -> f64)]) {
    let mut g = c.benchmark_group(group);
    g.sample_size(10).measurement_time(Duration::from_secs(1)).warm_up_time(Duration::from_millis(1));
    for (name, f) in cases {
        g.bench_function(*name, |b| b.iter_custom(|n| (0..n).map(|_| Duration::from_secs_f64(f())).sum()));
    }
    g.finish();
}

fn sites(c: &mut Criterion) {
    per_iteration(c, "sites_engine_seconds_per_iteration", &[("off", &|| engine(false)), ("record", &|| engine(true))]);
    let has_memray = Command::new("python3").args(["-c", "import memray"]).output().is_ok_and(|o| o.status.success());
    if !has_memray {
        eprintln!("sites_server_seconds_per_iteration: skipped: memray is not installed for python3");
        return;
    }
    let d = dir("server-src");
    std::fs::create_dir_all(&d).unwrap();
    let script = d.join("server.py");
    std::fs::write(&script, SERVER).unwrap();
    per_iteration(
        c,
        "sites_server_seconds_per_iteration",
        &[
            ("off", &|| server(&script, "off")),
            ("heap", &|| server(&script, "heap")),
            ("full", &|| server(&script, "full")),
        ],
    );
}

criterion_group!(benches, sites);
criterion_main!(benches);
