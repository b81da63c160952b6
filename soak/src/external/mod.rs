//! The external mode: a scenario soaked against a server plateau did not start in-process, over
//! the OpenAI-compatible API its clients use (`plateau run SCENARIO --target URL [--pid P |
//! --spawn CMD]`).
//!
//! A run: start the server (`--spawn`) or find it (`--pid`), wait until it answers, scrape its
//! `/metrics` once to learn what it reports, write the samples header, take a baseline sample; then
//! iteration by iteration send every phase's requests (at most `concurrency` at once, aborts as a
//! client closes a stream, invalid requests expecting a 4xx), wait until every request is done and
//! the server's in-flight gauges are zero (or the settle timeout passes, which is counted and
//! reported), and take a quiescent sample: the process tree's memory ([`tree`]), GPU memory per
//! process where NVML is there ([`gpu`]), the scraped metrics ([`mapping`]) and, observed only,
//! plateau's own memory. The same detector then judges the samples. A failure mid-run (the server
//! gone, a 5xx past the retries, a /metrics that stops parsing) keeps the samples so far and an
//! incomplete verdict, and exits 3. Sleep phases (an engine call with no HTTP equivalent) are
//! skipped and counted.

pub mod client;
mod death;
pub mod exposition;
pub mod gpu;
pub mod mapping;
pub mod target;
pub mod tree;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures_util::stream::{self, StreamExt};
use plateau_reports::{Header, Kind, MetricSpec, SampleLine, Verdict, SAMPLES_SCHEMA};

use crate::detector::warmup_rule;
use crate::driver::{
    clear_earlier_run, rejudge, run_length, write_json, AbortCounts, Progress, RunError, RunOptions, RunResult,
    MAX_ITERATIONS,
};
use crate::probes::PURGED_ONLY;
use crate::scenario::{Phase, Scenario, Stage};
use crate::workload::{rng_for, Workload};
use client::{Action, Client, ClientError, Outcome};
use mapping::Mapping;

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

struct Soak<'a> {
    client: Client,
    mapping: Mapping,
    /// Whether the target has a /metrics.
    scrapes: bool,
    tree: Option<tree::Tree>,
    target: Option<target::Target>,
    gpu: Option<gpu::GpuProbe>,
    declared: BTreeMap<String, MetricSpec>,
    out: BufWriter<File>,
    start: Instant,
    iter: u64,
    requests_sent: u64,
    settle_timeouts: u64,
    skipped_sleeps: u64,
    aborts: AbortCounts,
    ext: &'a ExternalOptions,
    own: crate::probes::ProcessProbes,
}

impl Soak<'_> {
    async fn scrape(&self) -> Result<Option<mapping::Scraped>, RunError> {
        if !self.scrapes {
            return Ok(None);
        }
        let url = format!("{}/metrics", self.client.base());
        let text = fetch_metrics(&url).await?;
        let text = text.ok_or_else(|| RunError::Harness(format!("GET {url}: gone mid-run")))?;
        let samples = mapping::parse_text(&text, &format!("GET {url}")).map_err(RunError::Harness)?;
        Ok(Some(self.mapping.apply(&samples)))
    }

    fn check_alive(&mut self) -> Result<(), RunError> {
        let Some(t) = &mut self.target else { return Ok(()) };
        if t.alive() {
            return Ok(());
        }
        let how = t.exit_status().map(|s| format!(" ({s})")).unwrap_or_default();
        Err(RunError::Harness(format!("the target process {} exited at iteration {}{how}", t.pid, self.iter + 1)))
    }

    /// Waits for every in-flight gauge to read zero, at most the settle timeout.
    async fn settle(&mut self) -> Result<(), RunError> {
        let t0 = Instant::now();
        loop {
            match self.scrape().await? {
                Some(s) if s.in_flight.is_some_and(|n| n > 0.0) => {}
                _ => return Ok(()),
            }
            if t0.elapsed() >= self.ext.settle_timeout {
                self.settle_timeouts += 1;
                return Ok(());
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn sample(&mut self) -> Result<(), RunError> {
        self.check_alive()?;
        let mut values = BTreeMap::new();
        let mut cost_us = BTreeMap::new();
        // The scrape first: a server that settles its allocator when scraped idle (plateau serve)
        // has done so before its process is read.
        let t0 = Instant::now();
        // A server that says whether its allocator holds freed pages (plateau serve) has its
        // page-level levels recorded only where it does not: there they mean live memory.
        let mut unsettled = false;
        if let Some(s) = self.scrape().await? {
            unsettled = s.settled == Some(false);
            values.extend(s.values);
        }
        let t1 = Instant::now();
        cost_us.insert("scrape".into(), (t1 - t0).as_secs_f64() * 1e6);
        if let Some(tree) = &self.tree {
            let pids = tree.sample(&mut values);
            if let Some(g) = &self.gpu {
                g.sample(&pids, &mut values);
            }
        }
        cost_us.insert("target_proc".into(), t1.elapsed().as_secs_f64() * 1e6);
        if unsettled {
            values.retain(|k, _| !is_page_level(k));
        }
        let mut own = BTreeMap::new();
        self.own.sample("plateau.", crate::probes::Settle::Flush, &mut own, &mut BTreeMap::new());
        if let Some(p) = self.own.process() {
            crate::probes::read_proc(p, "plateau.", &mut own);
        }
        values.extend(own);
        values.insert(REQUESTS.into(), self.requests_sent as f64);
        values.retain(|k, _| self.declared.contains_key(k));
        let line = SampleLine {
            t: self.start.elapsed().as_secs_f64(),
            iter: self.iter,
            quiescent: true,
            values,
            cost_us,
            checks: BTreeMap::new(),
        };
        serde_json::to_writer(&mut self.out, &line).map_err(|e| RunError::Harness(e.to_string()))?;
        self.out.write_all(b"\n").map_err(|e| RunError::Harness(e.to_string()))
    }

    /// Sends a phase's requests and waits for all of them.
    async fn run_phase(
        &mut self,
        scenario: &Scenario,
        workload: &mut Workload,
        index: usize,
        phase: &Phase,
    ) -> Result<(), RunError> {
        let iter = self.iter + 1;
        let mut sends: Vec<(plateau_engine::Request, Action)> = Vec::new();
        let abort = |ids: &[u64], a: &Option<crate::scenario::Abort>, w: &Workload| -> BTreeMap<u64, Action> {
            let Some(a) = a else { return BTreeMap::new() };
            let mut rng = rng_for(&[w.seed, iter, index as u64, 0x7a]);
            w.abort_targets(ids, a.fraction, iter, index)
                .into_iter()
                .map(|id| {
                    let k = rand_core::RngCore::next_u64(&mut rng) % 8;
                    let action = match a.stage {
                        Stage::Decode | Stage::Preempted | Stage::Any => Action::CloseAfterChunks(1 + k as u32),
                        _ => Action::CloseBeforeFirstToken { after_ms: 1 + k },
                    };
                    (id, action)
                })
                .collect()
        };
        match phase {
            Phase::Batch(b) => {
                let reqs = workload.batch(index, b, iter);
                let ids: Vec<u64> = reqs.iter().map(|r| r.id).collect();
                let actions = abort(&ids, &b.abort, workload);
                for r in reqs {
                    let a = actions.get(&r.id).copied().unwrap_or(Action::Complete);
                    sends.push((r, a));
                }
                let vocab = vocab_size(scenario);
                for k in 0..b.invalid as u64 {
                    let (bad, what) = workload.invalid(k + iter, vocab);
                    let as_tokens = what.contains("vocabulary");
                    // Spread through the batch, as the in-process driver does.
                    let at = ((k as usize) * 4 + 2).min(sends.len());
                    sends.insert(at, (bad, Action::ExpectRefusal { as_tokens }));
                }
            }
            Phase::Pressure(p) => {
                let c = scenario.engine.to_config(plateau_engine::Injections::default(), workload.seed);
                let reqs = workload.pressure(p, c.num_kv_blocks * c.block_size, c.max_num_seqs);
                let ids: Vec<u64> = reqs.iter().map(|r| r.id).collect();
                let actions = abort(&ids, &p.abort, workload);
                for r in reqs {
                    let a = actions.get(&r.id).copied().unwrap_or(Action::Complete);
                    sends.push((r, a));
                }
            }
            Phase::Sleep(_) => {
                self.skipped_sleeps += 1;
                return Ok(());
            }
        }
        self.requests_sent += sends.len() as u64;
        let client = &self.client;
        let mut results =
            stream::iter(sends.iter()).map(|(r, a)| client.send(r, *a)).buffer_unordered(self.ext.concurrency.max(1));
        // The first failure stops the phase: requests not yet sent are never sent to a failing
        // server, and those in flight are closed.
        while let Some(r) = results.next().await {
            match r.map_err(client_err)? {
                Outcome::Completed { .. } => {}
                Outcome::Aborted => self.aborts.aborted += 1,
                Outcome::EndedFirst => self.aborts.missed += 1,
                Outcome::Refused => self.aborts.invalid_refused += 1,
                Outcome::Accepted => self.aborts.invalid_accepted += 1,
            }
        }
        Ok(())
    }
}

/// A target level that counts the allocator's unused pages until they are given back: RSS and
/// RssAnon of the tree and of each process, the allocator's resident and mapped pages.
fn is_page_level(name: &str) -> bool {
    let Some(rest) = name.strip_prefix(mapping::PREFIX) else { return false };
    PURGED_ONLY.iter().any(|p| rest == *p || rest.ends_with(&format!(".{p}")))
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
                "the spawned server {how} before answering at {url}; its log ({}) ends: {}",
                log.display(),
                target::tail(log, 400)
            )));
        }
        for path in ["/health", "/v1/models"] {
            if let Ok(r) = http.get(format!("{url}{path}")).send().await {
                if r.status().is_success() {
                    return Ok(());
                }
            }
        }
        if t0.elapsed() >= timeout {
            return Err(RunError::Harness(format!(
                "the spawned server did not answer at {url} within {} s (--ready-timeout); its log ({}) ends: {}",
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
    if opts.injections.iter().next().is_some() {
        return Err(RunError::Input("--inject switches on leaks in plateau's own engine; with --target, give them to the server (plateau serve --inject NAME)".into()));
    }
    let (limit, duration) = run_length(scenario, opts)?;
    let mapping = match &ext.metrics_map {
        Some(p) => Mapping::with_file(p).map_err(RunError::Input)?,
        None => Mapping::built_in(),
    };
    std::fs::create_dir_all(&opts.out_dir)
        .map_err(|e| RunError::Input(format!("--out {}: {e}", opts.out_dir.display())))?;
    clear_earlier_run(&opts.out_dir);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| RunError::Harness(format!("tokio runtime: {e}")))?;
    let log = opts.out_dir.join("target.log");
    let mut target = match (&ext.spawn, ext.pid) {
        (Some(cmd), _) => Some(target::Target::spawn(cmd, &log).map_err(RunError::Input)?),
        (None, Some(pid)) => Some(target::Target::attach(pid).map_err(RunError::Input)?),
        (None, None) => None,
    };
    if let (Some(t), Some(_)) = (target.as_mut(), &ext.spawn) {
        runtime.block_on(wait_ready(&ext.url, t, ext.ready_timeout, &log))?;
    }
    let client =
        runtime.block_on(Client::connect(&ext.url, ext.request_timeout, ext.ready_timeout)).map_err(client_err)?;
    let metrics_url = format!("{}/metrics", client.base());
    let first = match runtime.block_on(fetch_metrics(&metrics_url))? {
        Some(text) => {
            Some(mapping.apply(&mapping::parse_text(&text, &format!("GET {metrics_url}")).map_err(RunError::Input)?))
        }
        None => None,
    };
    // With no process to read, the server's own /metrics is all there is to judge: without a
    // memory gauge there it would judge only plateau's own request counter.
    if target.is_none() && !first.as_ref().is_some_and(carries_memory_gauge) {
        return Err(RunError::Input(format!(
            "--target {}: no --pid or --spawn, and {metrics_url} carries no memory gauge (bytes) in the mapping: nothing about the server's memory could be judged; give --pid PID (the server's process) or --spawn \"CMD\" (plateau starts it), or a --metrics-map that maps a memory gauge",
            ext.url
        )));
    }
    let oom = target.as_ref().map(|t| death::OomWatch::start(t.pid));
    let tree = target.as_ref().map(|t| tree::Tree::new(t.pid));
    let gpu = match (&tree, gpu::GpuProbe::open()) {
        (Some(_), Ok(g)) => Some(g),
        (Some(_), Err(why)) => {
            eprintln!("plateau: GPU memory per process: not available ({why})");
            None
        }
        (None, _) => None,
    };
    let seed = opts.seed.unwrap_or(scenario.soak.seed);
    let known_length = (limit != MAX_ITERATIONS).then_some(limit);
    let warmup =
        warmup_rule(opts.warmup, Some(scenario.soak.warmup_iterations), known_length).map_err(RunError::Input)?;
    let mut declared = BTreeMap::new();
    if let Some(t) = &tree {
        declared.extend(t.specs());
        if gpu.is_some() {
            declared.extend(gpu::GpuProbe::specs());
        }
    }
    if let Some(s) = &first {
        declared.extend(s.specs.clone());
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
    let header = Header {
        schema: SAMPLES_SCHEMA.into(),
        scenario: scenario.name.clone(),
        seed,
        backend: format!("external {} ({})", client.base(), client.model()),
        metrics: declared.clone(),
        warmup_iterations: Some(warmup),
        injections: Vec::new(),
    };
    let samples_path = opts.out_dir.join("samples.jsonl");
    let file = File::create(&samples_path).map_err(|e| RunError::Input(format!("{}: {e}", samples_path.display())))?;
    let mut out = BufWriter::with_capacity(64 * 1024, file);
    serde_json::to_writer(&mut out, &header).map_err(|e| RunError::Harness(e.to_string()))?;
    out.write_all(b"\n").map_err(|e| RunError::Harness(e.to_string()))?;
    if first.is_none() {
        eprintln!("plateau: {metrics_url} answered 404: only the target's processes are judged");
    }
    let mut soak = Soak {
        client,
        mapping,
        scrapes: first.is_some(),
        tree,
        target: target.take(),
        gpu,
        declared,
        out,
        start: Instant::now(),
        iter: 0,
        requests_sent: 0,
        settle_timeouts: 0,
        skipped_sleeps: 0,
        aborts: AbortCounts::default(),
        ext,
        own: crate::probes::ProcessProbes::new(),
    };
    let mut snapshots = crate::mappings::Snapshots::default();
    let mut interrupted = false;
    let outcome: Result<(), RunError> = runtime.block_on(async {
        let mut workload = Workload::new(seed);
        let mut last_line = Instant::now();
        soak.sample().await?;
        for iter in 1..=limit {
            if duration.is_some_and(|d| soak.start.elapsed() >= d) {
                break;
            }
            for (i, phase) in scenario.phases.iter().enumerate() {
                soak.run_phase(scenario, &mut workload, i, phase).await?;
                if opts.interrupt.load(Ordering::Relaxed) {
                    break;
                }
            }
            soak.settle().await?;
            soak.iter = iter;
            soak.sample().await?;
            if let Some(t) = &soak.tree {
                let now = procfs::process::Process::new(t.root())
                    .map(|p| crate::mappings::of_process(&p))
                    .unwrap_or_default();
                if iter == warmup.max(1) {
                    snapshots.start_iter = iter;
                    snapshots.start = now;
                } else if iter > warmup {
                    snapshots.end_iter = iter;
                    snapshots.end = now;
                }
            }
            if opts.progress != Progress::Quiet && (last_line.elapsed() >= Duration::from_secs(10) || iter == limit) {
                eprintln!(
                    "plateau: iteration {iter}/{limit}, {:.1} s, target {}",
                    soak.start.elapsed().as_secs_f64(),
                    soak.client.base()
                );
                last_line = Instant::now();
            }
            if opts.interrupt.load(Ordering::Relaxed) {
                interrupted = true;
                break;
            }
        }
        Ok(())
    });
    soak.out.flush().map_err(|e| RunError::Harness(format!("{}: {e}", samples_path.display())))?;
    let wall_secs = soak.start.elapsed().as_secs_f64();
    // A target that ended before the run did: how, before anything else touches it.
    let target_exit = match (&outcome, soak.target.as_mut(), &oom) {
        (Err(_), Some(t), Some(w)) => (!t.alive()).then(|| w.describe(t.exit_status())),
        _ => None,
    };
    if let Some(t) = &mut soak.target {
        t.stop();
    }
    let (iterations, aborts, settle_timeouts) = (soak.iter, soak.aborts, soak.settle_timeouts);
    if soak.settle_timeouts > 0 {
        eprintln!(
            "plateau: {} of {iterations} quiescent points were sampled with requests still in flight at the target (settle timeout {} ms)",
            soak.settle_timeouts,
            ext.settle_timeout.as_millis()
        );
    }
    if soak.skipped_sleeps > 0 {
        eprintln!(
            "plateau: {} sleep phases skipped: an external target has no sleep/wake over the API",
            soak.skipped_sleeps
        );
    }
    if let Some(t) = &soak.tree {
        let roles = t.roles();
        if !roles.is_empty() {
            eprintln!("plateau: target processes: {}", roles.join(", "));
        }
    }
    drop(soak);
    if !snapshots.end.is_empty() {
        write_json(&opts.out_dir.join("mappings.json"), &snapshots)?;
    }
    let note = |mut v: Verdict| -> Result<Verdict, RunError> {
        v.target_exit = target_exit.clone();
        v.settle_timeouts = settle_timeouts;
        if let Some(how) = &target_exit {
            v.summary.push_str(&format!(
                "; {how}, {}",
                if v.failed() {
                    "after the growth was already conclusive: the leak is the finding"
                } else {
                    "before any growth was conclusive: the run could not be judged"
                }
            ));
        }
        write_json(&opts.out_dir.join("verdict.json"), &v)?;
        Ok(v)
    };
    if let Err(e) = outcome {
        // What was sampled before the failure is kept and judged, marked incomplete. Growth that
        // was conclusive before the target died is the run's finding (exit 1), not a harness
        // failure.
        let verdict = match rejudge(scenario, opts, true) {
            Ok(v) => note(v)?,
            Err(_) => return Err(e),
        };
        if verdict.failed() {
            eprintln!("plateau: {e}");
            let out_dir = opts.out_dir.clone();
            return Ok(RunResult {
                verdict,
                out_dir,
                interrupted: true,
                iterations,
                wall_secs,
                aborts,
                triggers: Vec::new(),
            });
        }
        return Err(match &target_exit {
            Some(how) => RunError::Harness(format!("{e}; {how}")),
            None => e,
        });
    }
    let verdict = note(rejudge(scenario, opts, interrupted)?)?;
    Ok(RunResult {
        verdict,
        out_dir: opts.out_dir.clone(),
        interrupted,
        iterations,
        wall_secs,
        aborts,
        triggers: Vec::new(),
    })
}
