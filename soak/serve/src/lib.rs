//! `plateau serve`: the engine behind an OpenAI-compatible HTTP API, so that the external mode of
//! the soak (`plateau run --target`) is tested end to end against a server whose leaks are known.
//!
//! Shape: one engine thread ([`engine_loop`]) owns the engine; HTTP handlers ([`http`]) reach it
//! through one bounded channel of [`COMMAND_QUEUE`] commands (a full queue answers 503). Routes:
//! `/v1/completions`, `/v1/chat/completions` (images as base64 data URLs), both with `n` and
//! streaming; `/v1/models`; `/health`; `/metrics` (Prometheus text: every registry, counter and
//! allocator figure, see [`metrics`]); and vLLM's control endpoints, which an RL trainer drives
//! between rollouts: `POST /sleep?level=1|2`, `POST /wake_up[?tags=weights|kv_cache]`,
//! `GET /is_sleeping`, `POST /reset_prefix_cache`, with the engine's own sleep and wake. Injections
//! apply as in `plateau run`, so a leak on the sleep path leaks over HTTP too.

// The harness's allocator in this crate's unit tests, as the `plateau` binary has it (the
// tests read jemalloc's statistics and arenas).
#[cfg(test)]
plateau_probes::install_harness_allocator!();

pub mod api;
pub mod engine_loop;
pub mod http;
pub mod metrics;

use std::sync::Arc;

use plateau_engine::Injections;

use plateau_driver::{build_engine, RunError};
use plateau_scenario::Scenario;

/// Commands waiting for the engine thread at most: requests beyond it are refused with 503
/// rather than queued without bound.
pub const COMMAND_QUEUE: usize = 1024;

pub struct ServeOptions {
    pub backend: Option<String>,
    pub seed: u64,
    pub injections: Injections,
    /// Host to bind (`--host`), such as 127.0.0.1.
    pub host: String,
    /// Port to bind (`--port`); 0 picks a free one.
    pub port: u16,
    /// The proxy of a P/D deployment (`--role proxy`): the prefill and decode nodes' addresses.
    /// Requests go to the prefill node for their first token, then with their KV's transfer
    /// parameters to the decode node, which pulls the KV over the nodes' TCP transport.
    pub nodes: Option<(String, String)>,
}

/// Serves until interrupted (Ctrl-C) or killed. Returns when the server stops.
pub fn serve(scenario: &Scenario, opts: &ServeOptions) -> Result<(), RunError> {
    let backend = opts.backend.clone().unwrap_or_else(|| scenario.engine.backend.clone());
    let engine: Box<dyn plateau_probes::system::System + Send> = match &opts.nodes {
        None => Box::new(build_engine(scenario, &backend, opts.injections.clone(), opts.seed)?),
        Some((prefill, decode)) => Box::new(proxy(scenario, opts, prefill, decode)?),
    };
    let model = format!("plateau-{}", scenario.engine.preset);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        // Exact heap figures: no HTTP thread keeps freed memory in a cache of its own.
        .on_thread_start(plateau_probes::probes::disable_thread_cache)
        .enable_all()
        .build()
        .map_err(|e| RunError::Harness(format!("tokio runtime: {e}")))?;
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind((opts.host.as_str(), opts.port)))
        .map_err(|e| RunError::Input(bind_error(opts, &e)))?;
    let addr = listener.local_addr().map_err(|e| RunError::Harness(e.to_string()))?;
    let (tx, rx) = std::sync::mpsc::sync_channel(COMMAND_QUEUE);
    let engine_thread = std::thread::Builder::new()
        .name("engine".into())
        .spawn(move || engine_loop::run(engine, rx))
        .map_err(|e| RunError::Harness(format!("engine thread: {e}")))?;
    let app = http::router(Arc::new(http::AppState { commands: tx, model }));
    plateau_shell::errln!("plateau serve: listening on http://{addr} (backend {backend}, Ctrl-C stops)");
    let served = runtime.block_on(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await
    });
    // The router (and with it the last command sender) is gone: the engine thread ends.
    drop(runtime);
    let engine_result = engine_thread.join().map_err(|_| RunError::Harness("the engine thread panicked".into()))?;
    served.map_err(|e| RunError::Harness(format!("server: {e}")))?;
    engine_result.map_err(RunError::Harness)
}

/// The router of a P/D deployment over nodes already running, configured by the scenario's
/// engine and `[pd]` sections as `run --pd-processes` configures its own, except that every
/// request goes on to decode: the in-process router's simulated dead decode node (a seeded
/// fraction of forwards dropped) would be a request with no answer here, which a client over HTTP
/// cannot tell from a failing server. A decode node that really dies is the deployment's failure.
fn proxy(
    scenario: &Scenario,
    opts: &ServeOptions,
    prefill: &str,
    decode: &str,
) -> Result<plateau_pd::remote::RemotePair, RunError> {
    let pd = scenario
        .pd
        .as_ref()
        .ok_or_else(|| RunError::Input(format!("--role proxy: scenario {} has no [pd] section", scenario.name)))?;
    let mut config = scenario.engine_config(opts.injections.clone(), opts.seed);
    config.kv_transfer_timeout_ms = pd.kv_transfer_timeout_ms;
    plateau_pd::remote::RemotePair::connect(prefill, decode, config, 0.0, opts.seed)
        .map_err(|e| RunError::Harness(format!("--role proxy: {e}")))
}

/// Why `--host`/`--port` could not be bound, in the flags the user gave.
fn bind_error(opts: &ServeOptions, e: &std::io::Error) -> String {
    let (host, port) = (&opts.host, opts.port);
    match e.kind() {
        std::io::ErrorKind::AddrInUse => {
            format!("--port {port}: {host}:{port} is already in use; choose another --port (0 picks a free one)")
        }
        std::io::ErrorKind::PermissionDenied => {
            format!("--port {port}: not allowed to bind {host}:{port} ({e}); ports below 1024 need privileges")
        }
        _ => format!("--host {host} --port {port}: {e}"),
    }
}
