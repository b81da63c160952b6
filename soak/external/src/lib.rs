//! The external mode: a scenario soaked against a server plateau did not start in-process, over
//! the OpenAI-compatible API its clients use (`plateau run SCENARIO --target URL [--pid P |
//! --spawn CMD]`).
//!
//! The run loop is the driver's, as for plateau's own engine; this module is the target
//! (`http_target.rs`) and its setup. A run: start the server (`--spawn`) or find it (`--pid`),
//! wait until it answers, scrape its `/metrics` once to learn what it reports, write the samples
//! header, take a baseline sample; then iteration by iteration send every phase's requests (at most `concurrency` at once, aborts as a
//! client closes a stream, invalid requests expecting a 4xx), wait until every request is done and
//! the server's in-flight gauges are zero (or the settle timeout passes, which is counted and
//! reported), and take a quiescent sample: the process tree's memory ([`tree`]), GPU memory per
//! process where NVML is there ([`gpu`]), the scraped metrics ([`mapping`]) and, observed only,
//! plateau's own memory. The same detector then judges the samples. A failure mid-run (the server
//! gone, a 5xx past the retries, a /metrics that stops parsing) keeps the samples so far and an
//! incomplete verdict, and exits 3. Sleep phases go to the server's control endpoints in its
//! dialect, found from what it answers ([`dialect`], [`control`]).

// The harness's allocator in this crate's unit tests, as the `plateau` binary has it (the
// tests read jemalloc's statistics and arenas).
#[cfg(test)]
plateau_probes::install_harness_allocator!();

pub mod client;
pub mod control;
mod death;
mod deployment;
pub mod dialect;
pub mod exposition;
pub mod gpu;
pub mod mapping;
pub mod profile;
pub mod python;
pub mod requests;
pub mod target;
pub mod topology;
pub mod traceback;
pub mod tree;

mod http_target;
pub mod short_streams;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use plateau_reports::{Kind, MetricSpec};

use client::{Client, ClientError};
use deployment::{check_role_env, env_for, start_deployment, with_hook, Deployment};
use http_target::HttpTarget;
use mapping::Mapping;
use plateau_driver::{plan_run, prepare_out_dir, run_with, AbortCounts, RunError, RunOptions, RunResult};
use plateau_probes::probes::PURGED_ONLY;
use plateau_scenario::Scenario;

/// Poll period of the readiness and quiescence waits.
const POLL: Duration = Duration::from_millis(20);

#[derive(Debug, Clone)]
pub struct ExternalOptions {
    /// Base URL of the server, `http://127.0.0.1:8000`.
    pub url: String,
    pub pid: Option<i32>,
    pub spawn: Option<String>,
    /// A mapping file adding to the built-in rules.
    pub metrics_map: Option<PathBuf>,
    /// Requests in flight at most.
    pub concurrency: usize,
    /// How long a spawned server may take to answer.
    pub ready_timeout: Duration,
    /// How long to wait for the in-flight gauges to reach zero after the last request.
    pub settle_timeout: Duration,
    pub request_timeout: Duration,
    /// Environment for a spawned server only (`--spawn-env KEY=VALUE`): what a profiled replay
    /// preloads into it, or a user's settings. In a deployment, `ROLE:KEY` is for that role's
    /// process alone (a profiled replay of the role that grew), a plain `KEY` for every process.
    pub spawn_env: Vec<(String, String)>,
    /// `--dialect`: the server's dialect as the user names it (else found from its answers).
    pub dialect: Option<dialect::Dialect>,
    /// `--topology`: the processes of a deployment, started in order and probed per role (`url`
    /// is then the topology's).
    pub topology: Option<topology::Topology>,
    /// Put plateau's hook into the Python processes of what it spawns (the layers of their
    /// memory; a profiled replay's memray). `--no-python-hook` leaves them alone.
    pub python_hook: bool,
    /// What the run records of the allocation sites of the server's Python processes, from the
    /// end of warm-up (`--sites`; memray through the hook).
    pub sites: plateau_sites::Depth,
}

/// plateau's own figures recorded beside the target's, observed only: the load generator's memory.
const OWN: [(&str, &str); 2] = [("plateau.jemalloc.allocated", "bytes"), ("plateau.proc.rss", "bytes")];

/// Requests the load generator has sent (valid and invalid, once each whatever the retries): the
/// run's pace, so a verdict states costs per request of a server that counts none itself.
const REQUESTS: &str = "plateau.requests_added";

fn client_err(e: ClientError) -> RunError {
    match e {
        ClientError::NotOpenAi(m) | ClientError::Refused(m) => RunError::Input(m),
        ClientError::Unreachable(m) | ClientError::Server(m) => RunError::Harness(m),
    }
}

/// Only http URLs: plateau speaks plain HTTP to a server on loopback or an address the user names.
fn check_url(url: &str) -> Result<(), RunError> {
    let rest = url.strip_prefix("http://").ok_or_else(|| {
        RunError::Input(format!("--target {url}: write an http:// URL, such as http://127.0.0.1:8000"))
    })?;
    if rest.trim_end_matches('/').is_empty() {
        return Err(RunError::Input(format!("--target {url}: no host")));
    }
    reqwest::Url::parse(url).map_err(|e| RunError::Input(format!("--target {url}: not a URL: {e}")))?;
    Ok(())
}

/// A target level that counts the allocator's unused pages until they are given back: RSS and
/// RssAnon of the tree and of each process, the allocator's resident and mapped pages.
fn is_page_level(name: &str) -> bool {
    // `target.proc.rss`, or one role's `decode.target.proc.rss` (`--topology`).
    let own = name.strip_prefix(mapping::PREFIX);
    let Some(rest) = own.or_else(|| name.split_once('.').and_then(|(_, r)| r.strip_prefix(mapping::PREFIX))) else {
        return false;
    };
    PURGED_ONLY.iter().any(|p| rest == *p || rest.ends_with(&format!(".{p}")))
}

/// The sizes phase plans take from the scenario's engine section, standing for the server's.
pub(crate) fn shape_of(s: &Scenario, seed: u64) -> plateau_driver::target::Shape {
    let c = s.engine.to_config(plateau_engine::Injections::default(), seed);
    plateau_driver::target::Shape {
        vocab_size: vocab_size(s),
        pool_tokens: c.num_kv_blocks * c.block_size,
        max_num_seqs: c.max_num_seqs,
    }
}

/// The scenario's model vocabulary (for the out-of-vocabulary invalid request); a large one when
/// the preset is unknown here.
fn vocab_size(s: &Scenario) -> usize {
    plateau_engine::ModelConfig::preset(&s.engine.preset).map(|m| m.vocab_size).unwrap_or(1 << 20)
}

/// GET /metrics: the text, or None when the server has none (404).
async fn fetch_metrics(url: &str) -> Result<Option<String>, RunError> {
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| RunError::Harness(e.to_string()))?;
    let mut wait = Duration::from_millis(100);
    for attempt in 0..=client::RETRIES {
        match http.get(url).send().await {
            Ok(r) if r.status() == reqwest::StatusCode::NOT_FOUND => return Ok(None),
            Ok(r) if r.status().is_success() => {
                return r.text().await.map(Some).map_err(|e| RunError::Harness(format!("GET {url}: {e}")))
            }
            Ok(r) if attempt == client::RETRIES => {
                return Err(RunError::Harness(format!("GET {url} answered {}", r.status())))
            }
            Err(e) if attempt == client::RETRIES => return Err(RunError::Harness(format!("GET {url}: {e}"))),
            _ => {
                tokio::time::sleep(wait).await;
                wait *= 2;
            }
        }
    }
    unreachable!("the last attempt returns")
}

/// Waits for a spawned server to answer: `/health` 200, else `/v1/models` 200.
async fn wait_ready(
    url: &str,
    t: &mut target::Target,
    timeout: Duration,
    log: &std::path::Path,
) -> Result<(), RunError> {
    let checks = [format!("{url}/health"), format!("{url}/v1/models")];
    wait_answering("spawned server", url, &checks, t, timeout, log).await
}

/// Waits until one of `checks` answers (`http://`: a 2xx; `tcp://HOST:PORT`: a connection is
/// accepted), within `timeout`. A process that exits first, or never answers, stops the run,
/// naming it (`who`, at `at`) with the end of its log.
async fn wait_answering(
    who: &str,
    at: &str,
    checks: &[String],
    t: &mut target::Target,
    timeout: Duration,
    log: &std::path::Path,
) -> Result<(), RunError> {
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(2))
        .build()
        .map_err(|e| RunError::Harness(e.to_string()))?;
    let t0 = Instant::now();
    loop {
        if !t.alive() {
            let how = t.exit_status().unwrap_or_else(|| "exited".into());
            return Err(RunError::Harness(format!(
                "the {who} {how} before answering at {at}; its log ({}) ends: {}",
                log.display(),
                target::tail(log, 400)
            )));
        }
        for check in checks {
            let up = match check.strip_prefix("tcp://") {
                Some(addr) => tokio::net::TcpStream::connect(addr).await.is_ok(),
                None => http.get(check).send().await.is_ok_and(|r| r.status().is_success()),
            };
            if up {
                return Ok(());
            }
        }
        if t0.elapsed() >= timeout {
            return Err(RunError::Harness(format!(
                "the {who} did not answer at {at} within {} s (--ready-timeout-s); its log ({}) ends: {}",
                timeout.as_secs(),
                log.display(),
                target::tail(log, 400)
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether a scrape has a gauge in bytes: something about the server's memory to judge.
fn carries_memory_gauge(s: &mapping::Scraped) -> bool {
    s.specs.values().any(|m| m.kind == Kind::Gauge && m.unit == "bytes")
}

/// Runs the scenario against the target and judges it.
pub fn run(scenario: &Scenario, opts: &RunOptions, ext: &ExternalOptions) -> Result<RunResult, RunError> {
    check_url(&ext.url)?;
    if opts.injections.iter().next().is_some() && ext.topology.is_none() {
        return Err(RunError::Input("--inject switches on leaks in plateau's own engine; with --target, give them to the server (plateau serve --inject NAME)".into()));
    }
    // A server is sampled at quiescent points only (`run` refuses --sample-interval-ms > 0).
    let plan = plateau_driver::RunPlan { interval: None, ..plan_run(scenario, opts)? };
    let mapping = match &ext.metrics_map {
        Some(p) => Mapping::with_file(p).map_err(RunError::Input)?,
        None => Mapping::built_in(),
    };
    check_role_env(&ext.spawn_env, ext.topology.as_ref())?;
    prepare_out_dir(opts)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| RunError::Harness(format!("tokio runtime: {e}")))?;
    let log = opts.out_dir.join("target.log");
    let spawns = ext.spawn.is_some() || ext.topology.is_some();
    let hook = match ext.python_hook && spawns {
        true => Some(python::Hook::create().map_err(|e| RunError::Harness(format!("plateau's Python hook: {e}")))?),
        false => None,
    };
    let mut target = spawn_or_attach(ext, hook.as_ref(), &log)?;
    if let (Some(t), Some(_)) = (target.as_mut(), &ext.spawn) {
        runtime.block_on(wait_ready(&ext.url, t, ext.ready_timeout, &log))?;
    }
    let deployment = match &ext.topology {
        Some(topo) => start_deployment(topo, ext, &opts.out_dir, &runtime, hook.as_ref())?,
        None => Deployment::default(),
    };
    let client =
        runtime.block_on(Client::connect(&ext.url, ext.request_timeout, ext.ready_timeout)).map_err(client_err)?;
    let found = dialect::decide(&runtime.block_on(dialect::look(client.base(), client.owned_by())), ext.dialect);
    plateau_shell::errln!("plateau: target dialect: {} ({})", found.dialect.name(), found.found);
    note_dialect(&opts.out_dir, &found)?;
    let control = control::Control::new(client.base(), client.model(), found, ext.request_timeout)?;
    let metrics_url = format!("{}/metrics", client.base());
    let first = match runtime.block_on(fetch_metrics(&metrics_url))? {
        Some(text) => {
            Some(mapping.apply(&mapping::parse_text(&text, &format!("GET {metrics_url}")).map_err(RunError::Input)?))
        }
        None => None,
    };
    // With no process to read, the server's own /metrics is all there is to judge: without a
    // memory gauge there it would judge only plateau's own request counter.
    if target.is_none() && deployment.procs.is_empty() && !first.as_ref().is_some_and(carries_memory_gauge) {
        return Err(RunError::Input(format!(
            "--target {}: no --pid or --spawn, and {metrics_url} carries no memory gauge (bytes) in the mapping: nothing about the server's memory could be judged; give --pid PID (the server's process) or --spawn \"CMD\" (plateau starts it), or a --metrics-map that maps a memory gauge",
            ext.url
        )));
    }
    let oom = target.as_ref().map(|t| death::OomWatch::start(t.pid));
    let tree = target.as_ref().map(|t| tree::Tree::new(t.pid, hook.as_ref()));
    let gpu = gpu_probe(tree.is_some() || !deployment.procs.is_empty());
    let roles: Vec<String> = deployment.procs.iter().map(|p| p.role.clone()).collect();
    let declared = declared_specs(tree.as_ref(), &deployment, gpu.is_some(), first.as_ref(), &roles);
    if first.is_none() {
        plateau_shell::errln!("plateau: {metrics_url} answered 404: only the target's processes are judged");
    }
    let http = http_target::Http {
        client,
        mapping,
        scrapes: first.is_some(),
        tree,
        target: target.take(),
        deployment,
        roles,
        oom,
        gpu,
        declared,
        requests_sent: 0,
        settle_timeouts: 0,
        control,
        aborts: AbortCounts::default(),
        ext,
        own: plateau_probes::probes::ProcessProbes::new(),
        last_mappings: Vec::new(),
        last_role_mappings: BTreeMap::new(),
        shape: shape_of(scenario, plan.seed),
        out_dir: opts.out_dir.clone(),
        window: Vec::new(),
        hook,
        py_sites: None,
        window_run: opts.profile_window.is_some(),
    };
    let r = run_with(scenario, opts, plan, &mut HttpTarget { runtime, http })?;
    did_the_work(r)
}

/// A run that did not fail, kept only where the target did the work its scenario sent: memory
/// that stays level while nothing is served, or while a server ignores `n`, says nothing about
/// serving. A run that failed is kept as it is (its growth was seen whatever the work).
fn did_the_work(r: RunResult) -> Result<RunResult, RunError> {
    if r.verdict.failed() {
        return Ok(r);
    }
    if let Some(why) = short_streams::ignores_n(&r.aborts, true) {
        return Err(RunError::Harness(format!("{why}; results in {}", r.out_dir.display())));
    }
    if r.aborts.completed == 0 {
        return Err(RunError::Harness(format!(
            "the target completed no request in {} iterations ({} aborted, {} refused as invalid): a run in which the target did no work is never judged a pass; results in {}",
            r.iterations,
            r.aborts.aborted,
            r.aborts.invalid_refused,
            r.out_dir.display()
        )));
    }
    Ok(r)
}

/// The server of `--spawn` started (with plateau's Python hook where there is one, its output
/// into `log`), or the one of `--pid` attached; None when plateau reads no process of it.
fn spawn_or_attach(
    ext: &ExternalOptions,
    hook: Option<&python::Hook>,
    log: &std::path::Path,
) -> Result<Option<target::Target>, RunError> {
    Ok(match (&ext.spawn, ext.pid) {
        (Some(cmd), _) => {
            let (cmd, env) = with_hook(hook, cmd, env_for(&ext.spawn_env, None));
            Some(target::Target::spawn(&cmd, &env, log).map_err(RunError::Input)?)
        }
        (None, Some(pid)) => Some(target::Target::attach(pid).map_err(RunError::Input)?),
        (None, None) => None,
    })
}

/// GPU memory per process where a run reads processes (`wanted`) and NVML answers; why not,
/// said once, where it does not.
fn gpu_probe(wanted: bool) -> Option<gpu::GpuProbe> {
    match (wanted, gpu::GpuProbe::open()) {
        (true, Ok(g)) => Some(g),
        (true, Err(why)) => {
            plateau_shell::errln!("plateau: GPU memory per process: not available ({why})");
            None
        }
        (false, _) => None,
    }
}

/// What a run against a server declares in its samples header: each process's gauges (and its GPU
/// memory where NVML answers), every role's, the server's own /metrics as mapped, plateau's own
/// observed figures, and the count of requests sent.
fn declared_specs(
    tree: Option<&tree::Tree>,
    deployment: &Deployment,
    gpu: bool,
    first: Option<&mapping::Scraped>,
    roles: &[String],
) -> BTreeMap<String, MetricSpec> {
    let mut declared = BTreeMap::new();
    if let Some(t) = tree {
        declared.extend(t.specs());
        if gpu {
            declared.extend(gpu::GpuProbe::specs());
        }
    }
    for p in &deployment.procs {
        declared.extend(p.tree.specs());
        if gpu {
            declared.extend(gpu::GpuProbe::specs_as(&format!("{}.{}", p.role, mapping::PREFIX)));
        }
    }
    if let Some(s) = first {
        declared.extend(s.specs.iter().map(|(k, v)| (http_target::by_role(k, roles), v.clone())));
    }
    for (name, unit) in OWN {
        declared.insert(name.to_string(), MetricSpec::new(Kind::Observed, unit));
    }
    declared.insert(
        REQUESTS.to_string(),
        MetricSpec {
            quantum: Some(1.0),
            role: Some(plateau_reports::ROLE_REQUESTS.into()),
            ..MetricSpec::new(Kind::Counter, "count")
        },
    );
    declared
}

/// Names the dialect in the run's environment.json (written before the server answered), where
/// the run has one: a profiled replay's child writes none.
fn note_dialect(out_dir: &std::path::Path, found: &dialect::Found) -> Result<(), RunError> {
    let path = out_dir.join("environment.json");
    let Ok(text) = std::fs::read_to_string(&path) else { return Ok(()) };
    let mut env: plateau_reports::Environment =
        serde_json::from_str(&text).map_err(|e| RunError::Harness(format!("{}: {e}", path.display())))?;
    env.dialect = Some(format!("{}: {}", found.dialect.name(), found.found));
    let text = serde_json::to_string_pretty(&env).map_err(|e| RunError::Harness(e.to_string()))? + "\n";
    plateau_reports::fsutil::write_atomic(&path, text.as_bytes())
        .map_err(|e| RunError::Harness(format!("{}: {e}", path.display())))
}
