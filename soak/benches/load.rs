//! The load generator against `plateau serve` on loopback: batches of streamed completions (the
//! n-sampling scenario's shape: n = 2, 10 tokens; and a 1-token request for the HTTP path alone),
//! 64 in flight at once, through plateau's own client. Throughput is in requests per second.

use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use plateau_engine::{Request, SamplingParams};
use plateau_soak::external::client::{Action, Client};
use plateau_soak::scenario::Scenario;
use plateau_soak::serve::{engine_loop, http};

// The harness's allocator, as the `plateau` binary has it.
plateau_probes::install_harness_allocator!();

const BATCH: usize = 64;

/// `plateau serve` for the n-sampling scenario's engine, on a port of its own; its base URL.
fn start_server() -> String {
    let (s, _) = Scenario::load("n-sampling").unwrap();
    let engine = plateau_soak::driver::build_engine(&s, "cpu", Default::default(), 0).unwrap();
    let (tx, rx) = std::sync::mpsc::sync_channel(plateau_soak::serve::COMMAND_QUEUE);
    std::thread::spawn(move || engine_loop::run(Box::new(engine), rx));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        rt.block_on(async move {
            let app = http::router(Arc::new(http::AppState { commands: tx, model: "bench".into() }));
            let l = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(l, app).await.unwrap();
        });
    });
    url
}

fn request(id: u64, n: u32, max_tokens: u32) -> Request {
    let params = SamplingParams { n, max_tokens, ignore_eos: true, seed: Some(id), ..SamplingParams::default() };
    Request {
        id,
        prompt: plateau_engine::tokenizer::encode(&format!("Question No.{id:08}: why?")),
        params,
        images: vec![],
    }
}

fn load(c: &mut Criterion) {
    let url = start_server();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let client = rt.block_on(Client::connect(&url, Duration::from_secs(60), Duration::from_secs(60))).unwrap();
    let mut g = c.benchmark_group("load_generator");
    g.throughput(Throughput::Elements(BATCH as u64));
    g.sample_size(20);
    for (name, n, max_tokens) in [("n2_10_tokens", 2u32, 10u32), ("n1_1_token", 1, 1)] {
        let reqs: Vec<Request> = (0..BATCH as u64).map(|i| request(i, n, max_tokens)).collect();
        g.bench_with_input(BenchmarkId::new("plateau_serve", name), &reqs, |b, reqs| {
            b.iter(|| {
                rt.block_on(async {
                    let sends = reqs.iter().map(|r| client.send(r, Action::Complete));
                    for r in futures_util::future::join_all(sends).await {
                        r.unwrap();
                    }
                })
            })
        });
    }
    g.finish();
}

criterion_group!(benches, load);
criterion_main!(benches);
