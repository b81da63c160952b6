//! A prefill/decode pair across processes: the driver is the router; each role is a `plateau
//! node` child process on loopback, reached over the framed TCP transport. Each node samples its
//! own process, so metrics carry their role (`decode.proc.anon_outside_heap`).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, BufWriter};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

use plateau_engine::{
    AbortOutcome, EngineConfig, EngineError, IdleViolation, Metric, MetricKind, ModelConfig, Notice, Request,
    RequestStage, WeightSource,
};

use plateau_reports::MetricSpec;

use super::node::{Call, Reply, WireMetric};
use super::router::{Route, Router};
use super::wire::{read_frame, write_frame};
use plateau_probes::mappings::Mapping;
use plateau_probes::probes::{ProcessProbes, Settle};
use plateau_probes::system::System;

struct Client {
    r: BufReader<TcpStream>,
    w: BufWriter<TcpStream>,
    role: &'static str,
}

impl Client {
    fn call(&mut self, c: &Call) -> Result<Reply, EngineError> {
        write_frame(&mut self.w, c, &[]).map_err(|e| EngineError::backend(format!("{} node: {e}", self.role)))?;
        let (reply, _): (Reply, Vec<u8>) =
            read_frame(&mut self.r).map_err(|e| EngineError::backend(format!("{} node: {e}", self.role)))?;
        Ok(reply)
    }
}

/// Where to find and how to start the nodes.
pub struct NodeSpec {
    pub scenario: String,
    pub seed: u64,
    pub injections: Vec<String>,
}

pub struct RemotePair {
    prefill: RefCell<Client>,
    decode: RefCell<Client>,
    children: Vec<Child>,
    router: Router,
    config: EngineConfig,
    model: ModelConfig,
    unfinished: bool,
    /// Whether `step` also returns the requests that ended on the prefill side (their first token
    /// ended them, or they failed there): a server answers every request it took, while the
    /// soak's driver counts only what decode hands back, as for the in-process pair.
    answer_every_request: bool,
}

fn spawn(role: &'static str, spec: &NodeSpec, peer: Option<&str>) -> Result<(Child, Client), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(exe);
    cmd.args([
        "node",
        "--role",
        role,
        "--listen",
        "127.0.0.1:0",
        "--scenario",
        &spec.scenario,
        "--seed",
        &spec.seed.to_string(),
    ]);
    for i in &spec.injections {
        cmd.args(["--inject", i]);
    }
    if let Some(p) = peer {
        cmd.args(["--peer", p]);
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting the {role} node: {e}"))?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line).map_err(|e| e.to_string())?;
    let addr = line
        .trim()
        .strip_prefix("listening ")
        .ok_or_else(|| format!("the {role} node did not start: `{}`", line.trim()))?;
    Ok((child, Client::connect(role, addr)?))
}

impl Client {
    /// The controller's connection to the `role` node at `addr`.
    fn connect(role: &'static str, addr: &str) -> Result<Client, String> {
        let s = TcpStream::connect(addr).map_err(|e| format!("connecting to the {role} node at {addr}: {e}"))?;
        s.set_nodelay(true).ok();
        let w = BufWriter::new(s.try_clone().map_err(|e| e.to_string())?);
        Ok(Client { r: BufReader::new(s), w, role })
    }
}

/// An engine metric from a node (engine metrics are counts and sizes: never negative).
fn to_metric(m: WireMetric, role: &str) -> Metric {
    let kind = match (m.kind.as_str(), m.capacity) {
        ("bounded", Some(c)) => MetricKind::Bounded { capacity: c },
        ("per_request", _) => MetricKind::PerRequest,
        ("counter", _) => MetricKind::Counter,
        _ => MetricKind::Gauge,
    };
    let unit = if m.unit == "bytes" { "bytes" } else { "count" };
    Metric { name: format!("{role}.{}", m.name), kind, unit, value: m.value as u64 }
}

impl RemotePair {
    pub fn start(spec: NodeSpec, config: EngineConfig, failure_fraction: f64) -> Result<Self, String> {
        let model = config.model.config().map_err(|e| e.to_string())?;
        let (p_child, prefill) = spawn("prefill", &spec, None)?;
        let peer = prefill.r.get_ref().peer_addr().map_err(|e| e.to_string())?.to_string();
        let (d_child, decode) = spawn("decode", &spec, Some(&peer))?;
        Ok(RemotePair {
            prefill: RefCell::new(prefill),
            decode: RefCell::new(decode),
            children: vec![p_child, d_child],
            router: Router::new(failure_fraction, spec.seed),
            config,
            model,
            unfinished: false,
            answer_every_request: false,
        })
    }

    /// The router over nodes already running (a P/D deployment's proxy, `plateau serve --role
    /// proxy`): the prefill node at `prefill`, the decode node (started with the prefill's
    /// address as its peer) at `decode`. Nothing is spawned, and the nodes outlive the router.
    pub fn connect(
        prefill: &str,
        decode: &str,
        config: EngineConfig,
        failure_fraction: f64,
        seed: u64,
    ) -> Result<Self, String> {
        let model = config.model.config().map_err(|e| e.to_string())?;
        Ok(RemotePair {
            prefill: RefCell::new(Client::connect("prefill", prefill)?),
            decode: RefCell::new(Client::connect("decode", decode)?),
            children: Vec::new(),
            router: Router::new(failure_fraction, seed),
            config,
            model,
            unfinished: false,
            answer_every_request: true,
        })
    }

    fn expect_done(r: Reply) -> Result<(), EngineError> {
        match r {
            Reply::Done => Ok(()),
            Reply::Failed(m) => Err(EngineError::backend(m)),
            other => Err(EngineError::backend(format!("unexpected reply {other:?}"))),
        }
    }
}

impl Drop for RemotePair {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl System for RemotePair {
    fn add_request(&mut self, r: Request) -> Result<(), EngineError> {
        let first = Router::prefill_request(&r);
        match self.prefill.get_mut().call(&Call::Add { id: r.id, prompt: first.prompt, params: first.params })? {
            Reply::Done => {
                self.router.originals.insert(r.id, r);
                self.unfinished = true;
                Ok(())
            }
            Reply::Failed(reason) => Err(EngineError::InvalidRequest { id: r.id, reason }),
            other => Err(EngineError::backend(format!("unexpected reply {other:?}"))),
        }
    }

    fn step(&mut self, now_ms: u64) -> Result<Vec<plateau_engine::RequestOutput>, EngineError> {
        let (outputs, p_unfinished) = match self.prefill.get_mut().call(&Call::Step { now_ms })? {
            Reply::Stepped { outputs, unfinished, .. } => (outputs, unfinished),
            Reply::Failed(m) => return Err(EngineError::backend(format!("prefill node: {m}"))),
            other => return Err(EngineError::backend(format!("unexpected reply {other:?}"))),
        };
        let mut ended_on_prefill = Vec::new();
        for o in outputs {
            let kept = self.answer_every_request.then(|| o.clone());
            match self.router.route(o) {
                Route::Drop => {}
                Route::Ignore => ended_on_prefill.extend(kept),
                Route::Done(id) => {
                    self.prefill.get_mut().call(&Call::Release { id, aborted: false })?;
                    ended_on_prefill.extend(kept);
                }
                Route::Forward(orig, t) => {
                    let id = orig.id;
                    let call = Call::AddRemote { id, prompt: orig.prompt, params: orig.params, transfer: t };
                    if !matches!(self.decode.get_mut().call(&call)?, Reply::Done) {
                        self.prefill.get_mut().call(&Call::Release { id, aborted: true })?;
                    }
                }
            }
        }
        let (finished, notices, d_unfinished) = match self.decode.get_mut().call(&Call::Step { now_ms })? {
            Reply::Stepped { outputs, notices, unfinished } => (outputs, notices, unfinished),
            Reply::Failed(m) => return Err(EngineError::backend(format!("decode node: {m}"))),
            other => return Err(EngineError::backend(format!("unexpected reply {other:?}"))),
        };
        for n in notices {
            let (id, aborted) = match n {
                Notice::Pulled { request, .. } => (request, false),
                Notice::Aborted { request, .. } => (request, true),
            };
            self.prefill.get_mut().call(&Call::Release { id, aborted })?;
        }
        self.unfinished = p_unfinished || d_unfinished || !self.router.originals.is_empty();
        Ok(ended_on_prefill.into_iter().chain(finished).collect())
    }

    fn stage(&self, id: u64) -> Option<RequestStage> {
        let ask = |c: &RefCell<Client>| match c.borrow_mut().call(&Call::Stage { id }) {
            Ok(Reply::Stage(s)) => s,
            _ => None,
        };
        ask(&self.decode).or_else(|| ask(&self.prefill))
    }

    /// Partial tokens live in the decode node's process and are not fetched step by step: a
    /// request served through the nodes streams whole when it ends.
    fn generated(&self, _id: u64) -> Vec<(u32, Vec<u32>)> {
        Vec::new()
    }

    fn abort(&mut self, id: u64) -> AbortOutcome {
        for c in [&self.decode, &self.prefill] {
            if let Ok(Reply::Flag(true)) = c.borrow_mut().call(&Call::Abort { id }) {
                self.router.originals.remove(&id);
                return AbortOutcome::Aborted;
            }
        }
        AbortOutcome::Unknown
    }

    fn has_unfinished(&self) -> bool {
        self.unfinished
    }

    fn unsettled(&self) -> usize {
        match self.prefill.borrow_mut().call(&Call::Held) {
            Ok(Reply::Count(n)) => n,
            _ => 0,
        }
    }

    fn settle_ms(&self) -> u64 {
        self.config.kv_transfer_timeout_ms
    }

    fn stats(&self) -> Vec<Metric> {
        let mut out = Vec::new();
        for (role, c) in [("prefill", &self.prefill), ("decode", &self.decode)] {
            if let Ok(Reply::Stats(ms)) = c.borrow_mut().call(&Call::Stats) {
                out.extend(ms.into_iter().map(|m| to_metric(m, role)));
            }
        }
        out.push(Metric {
            name: "router.registry.pending".into(),
            kind: MetricKind::PerRequest,
            unit: "count",
            value: self.router.originals.len() as u64,
        });
        out
    }

    fn process_specs(&self) -> BTreeMap<String, MetricSpec> {
        let mut m = ProcessProbes::specs("prefill.");
        m.extend(ProcessProbes::specs("decode."));
        m
    }

    fn sample_processes(&self, settle: Settle, values: &mut BTreeMap<String, f64>) {
        for (role, c) in [("prefill", &self.prefill), ("decode", &self.decode)] {
            if let Ok(Reply::Probes(ms)) = c.borrow_mut().call(&Call::Probes { settle }) {
                values.extend(ms.into_iter().map(|m| (format!("{role}.{}", m.name), m.value)));
            }
        }
    }

    fn set_epoch(&mut self, epoch: u64) {
        for c in [&self.prefill, &self.decode] {
            let _ = c.borrow_mut().call(&Call::SetEpoch { epoch });
        }
    }

    fn residues(&self) -> Vec<plateau_probes::system::Residue> {
        let mut out = Vec::new();
        for (role, c) in [("prefill", &self.prefill), ("decode", &self.decode)] {
            if let Ok(Reply::Residues(rs)) = c.borrow_mut().call(&Call::Residues) {
                out.extend(rs.into_iter().map(|r| r.with_role(role)));
            }
        }
        out
    }

    fn check_idle(&self) -> Result<(), Vec<IdleViolation>> {
        let mut v = Vec::new();
        for (role, c) in [("prefill", &self.prefill), ("decode", &self.decode)] {
            match c.borrow_mut().call(&Call::CheckIdle) {
                Ok(Reply::Idle(names)) => v.extend(names.into_iter().map(|(n, detail)| IdleViolation {
                    metric: format!("{role}.{n}"),
                    value: 0,
                    detail: format!("{role} node: {detail}"),
                })),
                other => {
                    v.push(IdleViolation { metric: format!("{role}.node"), value: 0, detail: format!("{other:?}") })
                }
            }
        }
        if v.is_empty() {
            Ok(())
        } else {
            Err(v)
        }
    }

    fn sleep(&mut self, level: u8) -> Result<(), EngineError> {
        Self::expect_done(self.prefill.get_mut().call(&Call::Sleep { level })?)?;
        Self::expect_done(self.decode.get_mut().call(&Call::Sleep { level })?)
    }

    fn wake(&mut self) -> Result<(), EngineError> {
        Self::expect_done(self.prefill.get_mut().call(&Call::Wake)?)?;
        Self::expect_done(self.decode.get_mut().call(&Call::Wake)?)
    }

    fn reset_prefix_cache(&mut self) -> Result<(), EngineError> {
        Self::expect_done(self.prefill.get_mut().call(&Call::ResetPrefixCache)?)?;
        Self::expect_done(self.decode.get_mut().call(&Call::ResetPrefixCache)?)
    }

    fn update_weights(&mut self, _source: WeightSource) -> Result<(), EngineError> {
        Err(EngineError::Config("weight updates are not carried to plateau nodes".into()))
    }

    fn model_config(&self) -> &ModelConfig {
        &self.model
    }

    fn config(&self) -> &EngineConfig {
        &self.config
    }

    fn backend_name(&self) -> &'static str {
        "cpu"
    }

    fn mappings(&self) -> Option<Vec<Mapping>> {
        match self.decode.borrow_mut().call(&Call::Mappings) {
            Ok(Reply::Mappings(m)) => Some(m),
            _ => None,
        }
    }
}
