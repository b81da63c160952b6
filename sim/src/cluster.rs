//! One simulated run: a router and engine nodes (prefill, decode, monolithic) as madsim nodes
//! exchanging messages over madsim's network, a client workload, a seeded fault plan, and the
//! invariant checks. Only in the simulation build (`--cfg madsim`).
//!
//! Lifecycle of a run: the supervisor creates the nodes; each engine node's `init` builds a fresh
//! engine (a restart after a kill is a new incarnation with empty state, as after a real crash) and
//! runs its loop: take the messages that arrived, tell the core the time, step it, send what came
//! out, sleep for the step's modelled cost. The client task, on the router node, sends each
//! iteration's requests at their arrival times, aborts some, and waits for every outcome (the
//! router fails requests that pass their timeout). At the end of each iteration the cluster settles
//! and every idle node's registries are sampled (a quiescent point); sleep phases run there. A fault
//! task applies the plan meanwhile. When the workload is done the cluster heals, drains, and every
//! node must be idle with its accounting clean.
//!
//! All shared state lives in one `World` behind a mutex that is never held across an await: madsim
//! runs every task of the run on one OS thread, so the lock only satisfies the type system, and the
//! checker reads the engines directly, the way TigerBeetle's state checker does.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use madsim::net::{Endpoint, NetSim};
use madsim::runtime::Handle;
use madsim::time::{sleep, Instant};
use plateau_engine::pd::ends_at_first_token;
use plateau_engine::{
    CpuBackend, Engine, FinishReason, Metric, MetricKind, PullOrder, Request, RequestId, RequestOutput, Role,
    TransferParams, WeightSource,
};

use crate::cost::CostModel;
use crate::faults::{Fault, FaultPlan, Shape};
use crate::hash_model::HashBackend;
use crate::heap;
use crate::plan::{IterationPlan, CLIENTS};
use crate::regions::Regions;
use crate::report::{RunReport, Violation};
use crate::spec::{ModelKind, RunSpec};
use crate::trace::Trace;

const PORT: u16 = 7000;
const CLIENT_PORT: u16 = 7001;
const TAG: u64 = 0x504c_4154;
/// How often waiting tasks look at the world again, in simulated ms.
const POLL_MS: u64 = 5;

fn addr(node: usize, port: u16) -> SocketAddr {
    SocketAddr::from(([10, 0, (node / 250) as u8, (node % 250 + 1) as u8], port))
}

/// Messages between nodes. The router is node 0.
#[derive(Debug)]
enum Msg {
    /// Router to a prefill or monolithic node.
    Add(Request),
    /// Router to a decode node: the original request and where its KV is.
    AddRemote(Request, TransferParams),
    Abort(RequestId),
    /// Engine node to router.
    Output(RequestOutput),
    Rejected(RequestId, String),
    /// Decode node (the second field) to prefill node.
    Pull(PullOrder, usize),
    /// Prefill node to decode node, after the modelled transfer time.
    KvData(RequestId, u64, Result<Vec<f32>, String>),
    /// To a prefill node: free a held transfer (`true`: the decode side gave up on it).
    Release(RequestId, bool),
}

impl Msg {
    fn brief(&self) -> String {
        match self {
            Msg::Add(r) => format!("add {} n={} prompt={} images={}", r.id, r.params.n, r.prompt.len(), r.images.len()),
            Msg::AddRemote(r, t) => {
                format!("add-remote {} from engine {} blocks={}", r.id, t.engine_id, t.block_ids.len())
            }
            Msg::Abort(id) => format!("abort {id}"),
            Msg::Output(o) => {
                let tokens: Vec<usize> = o.seqs.iter().map(|s| s.tokens.len()).collect();
                let first = o.seqs.first().and_then(|s| s.tokens.first()).copied().unwrap_or(0);
                format!("output {} {:?} tokens={tokens:?} first={first}", o.id, o.finish())
            }
            Msg::Rejected(id, why) => format!("rejected {id}: {why}"),
            Msg::Pull(o, _) => format!("pull {} handle={:#x} blocks={}", o.request, o.handle, o.remote_blocks.len()),
            Msg::KvData(id, h, r) => match r {
                Ok(d) => format!("kv {id} handle={h:#x} floats={}", d.len()),
                Err(e) => format!("kv {id} handle={h:#x} refused: {e}"),
            },
            Msg::Release(id, aborted) => format!("release {id} aborted={aborted}"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Down {
    Up,
    Killed,
    Paused,
}

/// An engine node as the checker sees it: the engine of its current incarnation and the shell's
/// own bookkeeping.
struct NodeSlot {
    name: String,
    role: Role,
    engine: Option<Engine>,
    incarnation: u32,
    down: Down,
    /// Requests added to this incarnation and not yet ended: each must end exactly once.
    open: BTreeSet<RequestId>,
    /// Decode side: pulls ordered by the engine, queued for a region or sent.
    pulls: BTreeMap<RequestId, PullState>,
    /// Decode side: the transport's registered receive regions.
    regions: Regions,
    /// Transfers served are this many times slower (slow-transfer fault).
    slowdown: u64,
    /// When the node last came up (started, restarted, resumed), in simulated ms.
    up_since_ms: u64,
}

impl NodeSlot {
    fn busy(&self) -> bool {
        self.engine.as_ref().is_some_and(|e| e.has_unfinished() || e.held_transfers() > 0) || !self.pulls.is_empty()
    }
}

struct PullState {
    handle: u64,
    since_ms: u64,
    /// Model-shaped bytes of the transfer.
    bytes: u64,
    region: Option<usize>,
    /// Set while the pull waits for a free region.
    queued: Option<PullOrder>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Prefill,
    Decode,
    Mono,
}

struct Pending {
    original: Request,
    client: u32,
    phase: Phase,
    node: usize,
    deadline_ms: u64,
    abort_requested: bool,
}

/// What the client sees of each request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Finished(FinishReason),
    Aborted,
    Failed(String),
}

struct RouterState {
    pending: BTreeMap<RequestId, Pending>,
    outcomes: BTreeMap<RequestId, Outcome>,
    submitted: BTreeSet<RequestId>,
    next: [usize; 3],
}

struct World {
    t0: Instant,
    trace: Trace,
    violations: Vec<Violation>,
    nodes: Vec<NodeSlot>,
    router: RouterState,
    prefill: Vec<usize>,
    decode: Vec<usize>,
    mono: Vec<usize>,
    /// Fault ends owed (applied at heal time).
    owed: Vec<Fault>,
    done: bool,
    samples: Vec<(u64, f64, BTreeMap<String, (MetricKind, &'static str, u64)>)>,
}

type Shared = Arc<Mutex<World>>;

fn lock(w: &Shared) -> MutexGuard<'_, World> {
    w.lock().unwrap_or_else(|e| e.into_inner())
}

impl World {
    fn now_ms(&self) -> u64 {
        Instant::now().duration_since(self.t0).as_millis() as u64
    }

    fn event(&mut self, node: &str, what: std::fmt::Arguments) {
        let t = self.now_ms();
        crate::report::set_context(node, t);
        heap::untagged(|| self.trace.event(t, node, what));
    }

    fn violate(&mut self, invariant: &'static str, node: &str, detail: String) {
        let t_ms = self.now_ms();
        heap::untagged(|| {
            self.trace.event(t_ms, node, format_args!("VIOLATION {invariant}: {detail}"));
            self.violations.push(Violation { invariant, node: node.to_string(), t_ms, detail });
        });
    }

    fn node_name(&self, i: usize) -> String {
        if i == 0 {
            "router".into()
        } else {
            self.nodes[i].name.clone()
        }
    }
}

/// Everything a node needs to build its engine.
struct NodeSpec {
    spec: RunSpec,
    seed: u64,
    cost: CostModel,
    kv_timeout_ms: u64,
    kv_bytes_per_token: u64,
    regions: usize,
}

fn build_engine(ns: &NodeSpec, node: usize, role: Role) -> Result<Engine, String> {
    let s = &ns.spec.scenario;
    let mut config = s.engine.to_config(ns.spec.injections.clone(), ns.seed ^ node as u64);
    config.role = role;
    let engine = match ns.spec.model {
        ModelKind::Hash => {
            let model = plateau_engine::ModelConfig::preset(&s.engine.preset).map_err(|e| e.to_string())?;
            Engine::with_backend(config, Box::new(HashBackend::new(model, ns.spec.injections.clone())))
        }
        ModelKind::Cpu => {
            let weights = config.model.load().map_err(|e| e.to_string())?;
            let backend = CpuBackend::new(weights, ns.spec.injections.clone()).map_err(|e| e.to_string())?;
            Engine::with_backend(config, Box::new(backend))
        }
    };
    let mut engine = engine.map_err(|e| e.to_string())?;
    engine.set_role(role, node as u32, ns.kv_timeout_ms);
    Ok(engine)
}

fn counter(stats: &[Metric], name: &str) -> u64 {
    stats.iter().find(|m| m.name == name).map_or(0, |m| m.value)
}

fn work_done(e: &Engine) -> u64 {
    let s = e.stats();
    counter(&s, "engine.prompt_tokens_computed") * 1_000_000 + counter(&s, "engine.tokens_generated")
}

/// Sends every message; a send that fails (the network refused it) is lost, like a dropped packet.
async fn send_all(ep: &Endpoint, out: Vec<(usize, Msg)>) {
    for (dst, msg) in out {
        let _ = ep.send_to_raw(addr(dst, PORT), TAG, Box::new(msg)).await;
    }
}

/// An engine node's life, from (re)start to kill. Returns only if its endpoint fails.
async fn engine_node(world: Shared, ns: Arc<NodeSpec>, idx: usize) {
    let role = lock(&world).nodes[idx].role;
    {
        let mut w = lock(&world);
        // The previous incarnation's memory went with its process.
        drop(w.nodes[idx].engine.take());
        w.nodes[idx].open.clear();
        w.nodes[idx].pulls.clear();
        heap::reset(idx);
        let _tag = heap::enter(idx);
        let engine = build_engine(&ns, idx, role);
        let name = w.nodes[idx].name.clone();
        let now = w.now_ms();
        match engine {
            Ok(e) => {
                let slot = &mut w.nodes[idx];
                slot.engine = Some(e);
                slot.incarnation += 1;
                slot.open.clear();
                slot.pulls.clear();
                slot.regions = Regions::new(ns.regions, ns.spec.injections.on(plateau_engine::Injection::PdMmapHook));
                slot.down = Down::Up;
                slot.up_since_ms = now;
                let inc = slot.incarnation;
                w.event(&name, format_args!("start incarnation {inc} as {role:?}"));
            }
            Err(e) => {
                w.violate("node-start", &name, format!("cannot build the engine: {e}"));
                return;
            }
        }
    }
    let Ok(ep) = Endpoint::bind(addr(idx, PORT)).await else { return };
    let ep = Arc::new(ep);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Msg>();
    let receiver = ep.clone();
    madsim::task::spawn(async move {
        while let Ok((payload, _)) = receiver.recv_from_raw(TAG).await {
            let Ok(msg) = payload.downcast::<Msg>() else { continue };
            if tx.send(*msg).is_err() {
                break;
            }
        }
    });
    let mut held_over: Option<Msg> = None;
    loop {
        let mut out = Vec::new();
        let mut transfers = Vec::new();
        let (work_ms, wait_ms) = {
            let mut w = lock(&world);
            let _tag = heap::enter(idx);
            let mut inbox: Vec<Msg> = held_over.take().into_iter().collect();
            while let Ok(m) = rx.try_recv() {
                inbox.push(m);
            }
            for m in inbox {
                handle_engine_msg(&mut w, &ns, idx, m, &mut out, &mut transfers);
            }
            tick(&mut w, &ns, idx, &mut out)
        };
        for (dst, delay_ms, msg) in transfers {
            let ep = ep.clone();
            madsim::task::spawn(async move {
                sleep(Duration::from_millis(delay_ms)).await;
                let _ = ep.send_to_raw(addr(dst, PORT), TAG, Box::new(msg)).await;
            });
        }
        send_all(&ep, out).await;
        if work_ms > 0 {
            sleep(Duration::from_millis(work_ms)).await;
        } else if let Ok(m) = madsim::time::timeout(Duration::from_millis(wait_ms), rx.recv()).await {
            match m {
                Some(m) => held_over = Some(m),
                None => return,
            }
        }
    }
}

fn handle_engine_msg(
    w: &mut World,
    ns: &NodeSpec,
    idx: usize,
    m: Msg,
    out: &mut Vec<(usize, Msg)>,
    transfers: &mut Vec<(usize, u64, Msg)>,
) {
    let name = w.nodes[idx].name.clone();
    w.event(&name, format_args!("recv {}", m.brief()));
    let slot = &mut w.nodes[idx];
    let Some(engine) = slot.engine.as_mut() else { return };
    match m {
        Msg::Add(r) => {
            let id = r.id;
            match engine.add_request(r) {
                Ok(()) => {
                    slot.open.insert(id);
                }
                Err(e) => out.push((0, Msg::Rejected(id, e.to_string()))),
            }
        }
        Msg::AddRemote(r, t) => {
            let (id, prefill) = (r.id, t.engine_id as usize);
            match engine.add_remote_request(r, t) {
                Ok(()) => {
                    slot.open.insert(id);
                }
                Err(e) => {
                    out.push((0, Msg::Rejected(id, e.to_string())));
                    out.push((prefill, Msg::Release(id, true)));
                }
            }
        }
        Msg::Abort(id) => {
            engine.abort(id);
        }
        Msg::Pull(order, decode) => {
            let data = engine.export_kv(order.request, order.handle, &order.remote_blocks);
            let tokens = (order.remote_blocks.len() * engine.config().block_size) as u64;
            let ms = ns.cost.transfer_ms(tokens * ns.kv_bytes_per_token, slot.slowdown);
            transfers.push((decode, ms, Msg::KvData(order.request, order.handle, data)));
        }
        Msg::KvData(id, handle, result) => {
            if slot.pulls.get(&id).is_some_and(|p| p.handle == handle && p.queued.is_none()) {
                let p = slot.pulls.remove(&id).expect("looked up");
                if let Some(r) = p.region {
                    slot.regions.release(r);
                }
                engine.pull_done(id, result);
            }
        }
        Msg::Release(id, aborted) => {
            engine.release_transfer(id, aborted);
        }
        Msg::Output(_) | Msg::Rejected(..) => {}
    }
}

/// Tells the core the time, times out pulls, steps, and queues what came out. Returns the step's
/// modelled cost (0: nothing computed) and how long to wait for a message otherwise.
fn tick(w: &mut World, ns: &NodeSpec, idx: usize, out: &mut Vec<(usize, Msg)>) -> (u64, u64) {
    let now = w.now_ms();
    let name = w.nodes[idx].name.clone();
    let slot = &mut w.nodes[idx];
    let Some(engine) = slot.engine.as_mut() else { return (0, 1_000) };
    engine.advance_time(now);
    let expired: Vec<RequestId> =
        slot.pulls.iter().filter(|(_, p)| p.since_ms + ns.kv_timeout_ms <= now).map(|(id, _)| *id).collect();
    for id in &expired {
        let p = slot.pulls.remove(id).expect("listed");
        if let Some(r) = p.region {
            slot.regions.release(r);
        }
        engine.pull_done(*id, Err(format!("KV pull timed out after {} ms", ns.kv_timeout_ms)));
    }
    let before = work_done(engine);
    let stepped = engine.has_unfinished();
    let result = if stepped { engine.step() } else { Ok(Vec::new()) };
    let outputs = match result {
        Ok(o) => o,
        Err(e) => {
            let detail = format!("step failed: {e}");
            w.violate("engine-error", &name, detail);
            return (0, 1_000);
        }
    };
    let after = work_done(engine);
    let mut ended_twice = Vec::new();
    for o in outputs {
        if !slot.open.remove(&o.id) {
            ended_twice.push(o.id);
        }
        out.push((0, Msg::Output(o)));
    }
    let block_bytes = engine.config().block_size as u64 * ns.kv_bytes_per_token;
    for order in engine.take_pull_orders() {
        let bytes = order.remote_blocks.len() as u64 * block_bytes;
        let state = PullState { handle: order.handle, since_ms: now, bytes, region: None, queued: None };
        slot.pulls.insert(order.request, PullState { queued: Some(order), ..state });
    }
    // Pulls go out in request order as regions free up.
    for p in slot.pulls.values_mut().filter(|p| p.queued.is_some()) {
        let Some(r) = slot.regions.acquire(p.bytes) else { break };
        p.region = Some(r);
        let order = p.queued.take().expect("filtered");
        out.push((order.engine_id as usize, Msg::Pull(order, idx)));
    }
    for n in engine.take_notices() {
        let (engine_id, request, aborted) = match n {
            plateau_engine::Notice::Pulled { engine_id, request, .. } => (engine_id, request, false),
            plateau_engine::Notice::Aborted { engine_id, request, .. } => (engine_id, request, true),
        };
        out.push((engine_id as usize, Msg::Release(request, aborted)));
    }
    let held = engine.held_transfers() > 0;
    let pulls = slot.pulls.values().map(|p| p.since_ms + ns.kv_timeout_ms).min();
    for id in ended_twice {
        w.violate("request-ended-twice", &name, format!("request {id} came out of the engine but was not open"));
    }
    for (dst, m) in out.iter() {
        let dst = w.node_name(*dst);
        w.event(&name, format_args!("send {dst} {}", m.brief()));
    }
    let done = after.saturating_sub(before);
    if stepped && done > 0 {
        let (prefill, decode) = (done / 1_000_000, done % 1_000_000);
        return (ns.cost.step_ms(prefill, decode), 0);
    }
    let mut wait = if stepped { POLL_MS } else { 1_000 };
    if held {
        wait = wait.min((ns.kv_timeout_ms / 4).max(1));
    }
    if let Some(deadline) = pulls {
        wait = wait.min(deadline.saturating_sub(now).max(1));
    }
    (0, wait)
}

/// The router node: takes engine nodes' replies and decides each request's next hop.
async fn router_node(world: Shared) {
    let Ok(ep) = Endpoint::bind(addr(0, PORT)).await else { return };
    while let Ok((payload, _)) = ep.recv_from_raw(TAG).await {
        let Ok(msg) = payload.downcast::<Msg>() else { continue };
        let out = {
            let mut w = lock(&world);
            w.event("router", format_args!("recv {}", msg.brief()));
            route(&mut w, *msg)
        };
        send_all(&ep, out).await;
    }
}

fn conclude(w: &mut World, id: RequestId, outcome: Outcome) {
    let Some(p) = w.router.pending.remove(&id) else { return };
    w.event("router", format_args!("outcome {id} client={} {outcome:?}", p.client));
    if w.router.outcomes.insert(id, outcome).is_some() {
        w.violate("client-saw-two-outcomes", "router", format!("request {id} got a second outcome"));
    }
}

fn pick(w: &mut World, phase: Phase) -> usize {
    let (list, k) = match phase {
        Phase::Prefill => (&w.prefill, 0),
        Phase::Decode => (&w.decode, 1),
        Phase::Mono => (&w.mono, 2),
    };
    let node = list[w.router.next[k] % list.len()];
    w.router.next[k] += 1;
    node
}

fn route(w: &mut World, m: Msg) -> Vec<(usize, Msg)> {
    let mut out = Vec::new();
    match m {
        Msg::Output(o) => {
            let id = o.id;
            let Some(p) = w.router.pending.get(&id) else {
                // A late reply to a request that timed out: free its held KV at once.
                if let Some(t) = o.transfer {
                    out.push((t.engine_id as usize, Msg::Release(id, true)));
                }
                return out;
            };
            let finish = o.finish();
            match (p.phase, o.transfer) {
                (Phase::Prefill, Some(t)) if matches!(finish, FinishReason::Stopped | FinishReason::Length) => {
                    let prefill = t.engine_id as usize;
                    if p.abort_requested {
                        out.push((prefill, Msg::Release(id, true)));
                        conclude(w, id, Outcome::Aborted);
                    } else if ends_at_first_token(&p.original.params, t.first_token) {
                        out.push((prefill, Msg::Release(id, false)));
                        conclude(w, id, Outcome::Finished(finish));
                    } else {
                        let original = p.original.clone();
                        let decode = pick(w, Phase::Decode);
                        let p = w.router.pending.get_mut(&id).expect("looked up above");
                        p.phase = Phase::Decode;
                        p.node = decode;
                        out.push((decode, Msg::AddRemote(original, t)));
                    }
                }
                (_, t) => {
                    if let Some(t) = t {
                        out.push((t.engine_id as usize, Msg::Release(id, true)));
                    }
                    let outcome = match finish {
                        FinishReason::Aborted => Outcome::Aborted,
                        FinishReason::Error => Outcome::Failed(o.error.unwrap_or_else(|| "engine error".into())),
                        f => Outcome::Finished(f),
                    };
                    conclude(w, id, outcome);
                }
            }
        }
        Msg::Rejected(id, why) => conclude(w, id, Outcome::Failed(format!("rejected: {why}"))),
        _ => {}
    }
    for (dst, m) in &out {
        let dst = w.node_name(*dst);
        w.event("router", format_args!("send {dst} {}", m.brief()));
    }
    out
}

/// Client side, on the router node: sends requests, aborts some, fails those past their timeout.
async fn client(world: Shared, ns: Arc<NodeSpec>, plans: Vec<IterationPlan>) {
    let Ok(ep) = Endpoint::bind(addr(0, CLIENT_PORT)).await else { return };
    let timeout_ms = ns.spec.scenario.sim.request_timeout_ms;
    for (iter, plan) in plans.iter().enumerate() {
        let start = lock(&world).now_ms();
        // Timed actions: (time, order, request index, is_abort).
        let mut actions: Vec<(u64, usize, bool)> = Vec::new();
        for (k, p) in plan.requests.iter().enumerate() {
            actions.push((start + p.at_ms, k, false));
            if let Some(d) = p.abort_after_ms {
                actions.push((start + p.at_ms + d, k, true));
            }
        }
        actions.sort_by_key(|a| (a.0, a.2, a.1));
        let mut next = 0;
        loop {
            let now = lock(&world).now_ms();
            let mut out = Vec::new();
            {
                let mut w = lock(&world);
                while next < actions.len() && actions[next].0 <= now {
                    let (_, k, is_abort) = actions[next];
                    next += 1;
                    let p = &plan.requests[k];
                    if is_abort {
                        if let Some(pending) = w.router.pending.get_mut(&p.request.id) {
                            pending.abort_requested = true;
                            out.push((pending.node, Msg::Abort(p.request.id)));
                        }
                    } else {
                        out.push(submit(&mut w, p.request.clone(), p.client, now + timeout_ms));
                    }
                }
                expire(&mut w, now, &mut out);
                for (dst, m) in &out {
                    let dst = w.node_name(*dst);
                    w.event("client", format_args!("send {dst} {}", m.brief()));
                }
            }
            for (dst, m) in out {
                let _ = ep.send_to_raw(addr(dst, PORT), TAG, Box::new(m)).await;
            }
            if next == actions.len() && lock(&world).router.pending.is_empty() {
                break;
            }
            let until_next = actions.get(next).map_or(POLL_MS, |a| a.0.saturating_sub(now).clamp(1, POLL_MS));
            sleep(Duration::from_millis(until_next)).await;
        }
        let since = settle(&world, ns.kv_timeout_ms + 200).await;
        quiescent_point(&world, &ns, iter as u64 + 1, &plan.sleeps, since);
    }
}

fn submit(w: &mut World, r: Request, client: u32, deadline_ms: u64) -> (usize, Msg) {
    let id = r.id;
    w.router.submitted.insert(id);
    let disaggregate = r.params.n == 1 && r.images.is_empty() && !w.prefill.is_empty();
    let phase = if disaggregate || w.mono.is_empty() { Phase::Prefill } else { Phase::Mono };
    let node = pick(w, phase);
    let msg = if phase == Phase::Prefill {
        let mut first = r.clone();
        first.params.max_tokens = 1;
        Msg::Add(first)
    } else {
        Msg::Add(r.clone())
    };
    w.router.pending.insert(id, Pending { original: r, client, phase, node, deadline_ms, abort_requested: false });
    (node, msg)
}

/// Fails every request past its deadline, and asks its node to abort it.
fn expire(w: &mut World, now: u64, out: &mut Vec<(usize, Msg)>) {
    let late: Vec<(RequestId, usize, Phase)> =
        w.router.pending.iter().filter(|(_, p)| p.deadline_ms <= now).map(|(id, p)| (*id, p.node, p.phase)).collect();
    for (id, node, phase) in late {
        out.push((node, Msg::Abort(id)));
        conclude(w, id, Outcome::Failed(format!("timed out in {phase:?} on {}", w.node_name(node))));
    }
}

/// A client goes away: everything it has in flight is aborted.
fn disconnect(w: &mut World, client: u32) -> Vec<(usize, Msg)> {
    let mut out = Vec::new();
    for (id, p) in w.router.pending.iter_mut().filter(|(_, p)| p.client == client) {
        p.abort_requested = true;
        out.push((p.node, Msg::Abort(*id)));
    }
    out
}

/// Waits until no engine node that is up has work, held KV or pulls, at most `limit_ms`.
/// Returns when it started.
async fn settle(world: &Shared, limit_ms: u64) -> u64 {
    let start = lock(world).now_ms();
    loop {
        let (busy, now) = {
            let w = lock(world);
            (w.nodes.iter().skip(1).any(|n| n.down == Down::Up && n.busy()), w.now_ms())
        };
        if !busy || now >= start + limit_ms {
            return start;
        }
        sleep(Duration::from_millis(POLL_MS)).await;
    }
}

fn mapped_detail(mapped: u64, registered: u64) -> String {
    format!(
        "the kernel's view holds {mapped} bytes of transport mappings, the registration cache accounts for {registered}: {} bytes mapped outside any registry",
        mapped.saturating_sub(registered)
    )
}

/// The transport's figures, in the soak's names.
fn transport_metrics(r: &Regions, pulls: usize) -> [Metric; 4] {
    let m = |name: &str, kind, unit, value: u64| Metric { name: name.into(), kind, unit, value };
    [
        m(
            "registry.transport.regions",
            MetricKind::Bounded { capacity: r.capacity() as u64 },
            "count",
            r.registered() as u64,
        ),
        m("registry.transport.in_flight", MetricKind::PerRequest, "count", pulls as u64),
        m("engine.transport_region_bytes", MetricKind::Gauge, "bytes", r.registered_bytes()),
        m("proc.anon_transport_bytes", MetricKind::Gauge, "bytes", r.mapped_bytes()),
    ]
}

/// Samples every idle node's registries, then runs the iteration's sleep phases on them. A node
/// that was up through the whole settling (from `since`, longer than the KV timeout) and still
/// holds transfers kept them past their timeout.
fn quiescent_point(world: &Shared, ns: &NodeSpec, iter: u64, sleeps: &[(u8, bool)], since: u64) {
    let mut w = lock(world);
    let t = w.now_ms() as f64 / 1000.0;
    let settled_fully = w.now_ms() >= since + ns.kv_timeout_ms + 200;
    let overdue: Vec<(String, usize)> = w
        .nodes
        .iter()
        .skip(1)
        .filter(|n| settled_fully && n.down == Down::Up && n.up_since_ms <= since)
        .filter_map(|n| n.engine.as_ref().map(|e| (n.name.clone(), e.held_transfers())))
        .filter(|(_, held)| *held > 0)
        .collect();
    for (name, held) in overdue {
        let detail = format!(
            "{held} transfers still hold KV after {} ms of settling (timeout {} ms)",
            ns.kv_timeout_ms + 200,
            ns.kv_timeout_ms
        );
        w.violate("transfer-outlived-timeout", &name, detail);
    }
    let mut values = BTreeMap::new();
    let mut log = Vec::new();
    let mut mismatched = Vec::new();
    for (k, slot) in w.nodes.iter_mut().enumerate().skip(1) {
        if slot.down != Down::Up || slot.busy() {
            continue;
        }
        let Some(e) = slot.engine.as_mut() else { continue };
        let heap_bytes = Metric {
            name: "heap.allocated".into(),
            kind: MetricKind::Gauge,
            unit: "bytes",
            value: heap::live_bytes(k),
        };
        for m in e.stats().into_iter().chain(transport_metrics(&slot.regions, slot.pulls.len())).chain([heap_bytes]) {
            values.insert(format!("{}.{}", slot.name, m.name), (m.kind, m.unit, m.value));
        }
        if slot.regions.mapped_bytes() != slot.regions.registered_bytes() {
            mismatched.push((slot.name.clone(), slot.regions.mapped_bytes(), slot.regions.registered_bytes()));
        }
        for &(level, update) in sleeps {
            let r = e.sleep(level).and_then(|()| {
                if update {
                    let name = ns.spec.scenario.engine.preset.clone();
                    e.update_weights(WeightSource::Preset { name, seed: ns.spec.scenario.engine.weights_seed + iter })?;
                }
                e.wake()
            });
            log.push((slot.name.clone(), level, r.map_err(|e| e.to_string())));
        }
    }
    w.samples.push((iter, t, values));
    for (name, mapped, registered) in mismatched {
        w.violate("mapped-outside-registries", &name, mapped_detail(mapped, registered));
    }
    for (name, level, r) in log {
        match r {
            Ok(()) => w.event(&name, format_args!("sleep level {level} and wake at iteration {iter}")),
            Err(e) => w.violate("sleep-wake", &name, format!("sleep level {level} / wake failed: {e}")),
        }
    }
}

fn apply_fault(w: &mut World, f: &Fault, ids: &[madsim::task::NodeId]) -> Vec<(usize, Msg)> {
    let h = Handle::current();
    let net = NetSim::current();
    w.event("faults", format_args!("{f:?}"));
    match *f {
        Fault::Kill(n) => {
            h.kill(ids[n]);
            w.nodes[n].down = Down::Killed;
        }
        Fault::Restart(n) => {
            // `init` runs again and builds a fresh engine.
            w.nodes[n].down = Down::Up;
            h.restart(ids[n]);
        }
        Fault::Pause(n) => {
            h.pause(ids[n]);
            w.nodes[n].down = Down::Paused;
        }
        Fault::Resume(n) => {
            h.resume(ids[n]);
            w.nodes[n].down = Down::Up;
            w.nodes[n].up_since_ms = w.now_ms();
        }
        Fault::ClogNode(n) => net.clog_node(ids[n]),
        Fault::UnclogNode(n) => net.unclog_node(ids[n]),
        Fault::ClogLink(a, b) => net.clog_link(ids[a], ids[b]),
        Fault::UnclogLink(a, b) => net.unclog_link(ids[a], ids[b]),
        Fault::PacketLoss(permille) => net.update_config(|c| c.packet_loss_rate = f64::from(permille) / 1000.0),
        Fault::Latency(range) => net.update_config(|c| {
            let (lo, hi) = range.unwrap_or((1, 10));
            c.send_latency = Duration::from_millis(lo)..Duration::from_millis(hi);
        }),
        Fault::SlowTransfers(n, factor) => w.nodes[n].slowdown = factor,
        Fault::Disconnect(c) => return disconnect(w, c),
    }
    Vec::new()
}

async fn fault_task(world: Shared, plan: FaultPlan, ids: Vec<madsim::task::NodeId>) {
    let Ok(ep) = Endpoint::bind(addr(0, CLIENT_PORT + 1)).await else { return };
    for ev in plan.events {
        let now = lock(&world).now_ms();
        if ev.at_ms > now {
            sleep(Duration::from_millis(ev.at_ms - now)).await;
        }
        let out = {
            let mut w = lock(&world);
            if w.done {
                return;
            }
            let out = apply_fault(&mut w, &ev.fault, &ids);
            if ev.fault.is_end() {
                if let Some(k) = w.owed.iter().position(|f| *f == ev.fault) {
                    w.owed.remove(k);
                }
            } else if let Some(end) = plan_end(&ev.fault) {
                w.owed.push(end);
            }
            out
        };
        send_all(&ep, out).await;
    }
}

fn plan_end(f: &Fault) -> Option<Fault> {
    Some(match *f {
        Fault::Kill(n) => Fault::Restart(n),
        Fault::Pause(n) => Fault::Resume(n),
        Fault::ClogNode(n) => Fault::UnclogNode(n),
        Fault::ClogLink(a, b) => Fault::UnclogLink(a, b),
        Fault::PacketLoss(_) => Fault::PacketLoss(0),
        Fault::Latency(_) => Fault::Latency(None),
        Fault::SlowTransfers(n, _) => Fault::SlowTransfers(n, 1),
        _ => return None,
    })
}

/// After the workload and healing: every node drains, then must be idle and clean.
fn final_checks(w: &mut World, ns: &NodeSpec) {
    let missing: Vec<RequestId> =
        w.router.submitted.iter().filter(|id| !w.router.outcomes.contains_key(id)).copied().collect();
    for id in missing {
        w.violate("request-without-outcome", "router", format!("request {id} was sent and never ended for its client"));
    }
    let mut found = Vec::new();
    for slot in w.nodes.iter().skip(1) {
        let Some(e) = slot.engine.as_ref() else { continue };
        if e.held_transfers() > 0 {
            found.push((
                "transfer-outlived-timeout",
                slot.name.clone(),
                format!(
                    "{} transfers still hold KV {} ms after the last request ended (timeout {} ms)",
                    e.held_transfers(),
                    ns.kv_timeout_ms + 200,
                    ns.kv_timeout_ms
                ),
            ));
        }
        if slot.regions.mapped_bytes() != slot.regions.registered_bytes() {
            found.push((
                "mapped-outside-registries",
                slot.name.clone(),
                mapped_detail(slot.regions.mapped_bytes(), slot.regions.registered_bytes()),
            ));
        }
        if !slot.pulls.is_empty() {
            found.push((
                "transfer-outlived-timeout",
                slot.name.clone(),
                format!("{} pulls never ended", slot.pulls.len()),
            ));
        }
        if e.has_unfinished() {
            found.push((
                "node-never-idle",
                slot.name.clone(),
                format!("{} requests still in flight", e.num_in_flight()),
            ));
        }
        if let Some(id) = slot.open.iter().next() {
            found.push((
                "request-never-ended",
                slot.name.clone(),
                format!("request {id} (and {} more) was added and never came out", slot.open.len() - 1),
            ));
        }
        if let Err(v) = e.check_idle() {
            for i in v {
                found.push(("idle-after-drain", slot.name.clone(), format!("{}: {}", i.metric, i.detail)));
            }
        }
    }
    for (inv, node, detail) in found {
        w.violate(inv, &node, detail);
    }
}

/// Runs one seed to the end inside the current madsim runtime.
/// `faults` replaces the plan drawn from the seed and the profile (property tests shrink it).
pub async fn run(
    spec: RunSpec,
    seed: u64,
    plans: Vec<IterationPlan>,
    faults: Option<FaultPlan>,
    keep_trace: bool,
) -> RunReport {
    let s = &spec.scenario;
    let model = plateau_engine::ModelConfig::preset(&s.engine.preset).expect("checked by RunSpec");
    let kv_timeout_ms =
        s.pd.as_ref()
            .map_or(plateau_engine::EngineConfig::default().kv_transfer_timeout_ms, |p| p.kv_transfer_timeout_ms);
    let shape = (s.sim.prefill_nodes, s.sim.decode_nodes, s.sim.monolithic_nodes);
    let horizon_ms = spec.iterations * (s.sim.arrival_window_ms + 150);
    let engine_nodes = shape.0 + shape.1 + shape.2;
    let plan = faults.unwrap_or_else(|| {
        FaultPlan::generate(spec.profile, Shape { engine_nodes, clients: CLIENTS, horizon_ms }, seed)
    });
    let ns = Arc::new(NodeSpec {
        cost: CostModel::new(s.sim.kv_bandwidth_mb_per_s),
        kv_bytes_per_token: model.kv_bytes_per_token() as u64,
        kv_timeout_ms,
        regions: s.pd.as_ref().map_or(plateau_soak::scenario::PdSection::default().regions, |p| p.regions),
        seed,
        spec: spec.clone(),
    });
    let mut nodes = vec![NodeSlot::new("router".into(), Role::Monolithic)];
    let (mut prefill, mut decode, mut mono) = (Vec::new(), Vec::new(), Vec::new());
    for (count, role, prefix) in
        [(shape.0, Role::Prefill, "prefill"), (shape.1, Role::Decode, "decode"), (shape.2, Role::Monolithic, "mono")]
    {
        for k in 0..count {
            let idx = nodes.len();
            match role {
                Role::Prefill => prefill.push(idx),
                Role::Decode => decode.push(idx),
                Role::Monolithic => mono.push(idx),
            }
            nodes.push(NodeSlot::new(format!("{prefix}{k}"), role));
        }
    }
    let world: Shared = Arc::new(Mutex::new(World {
        t0: Instant::now(),
        trace: Trace::new(keep_trace),
        violations: Vec::new(),
        nodes,
        router: RouterState {
            pending: BTreeMap::new(),
            outcomes: BTreeMap::new(),
            submitted: BTreeSet::new(),
            next: [0; 3],
        },
        prefill,
        decode,
        mono,
        owed: Vec::new(),
        done: false,
        samples: Vec::new(),
    }));
    lock(&world)
        .event("sim", format_args!("seed {seed} shape {shape:?} faults {:?} plan {:?}", spec.profile, plan.events));
    let h = Handle::current();
    let mut ids = Vec::new();
    let w0 = world.clone();
    let router = h.create_node().name("router").ip(addr(0, PORT).ip()).init(move || router_node(w0.clone())).build();
    ids.push(router.id());
    for idx in 1..=engine_nodes {
        let (w, n) = (world.clone(), ns.clone());
        let name = lock(&world).nodes[idx].name.clone();
        let node = h
            .create_node()
            .name(name)
            .ip(addr(idx, PORT).ip())
            .init(move || engine_node(w.clone(), n.clone(), idx))
            .build();
        ids.push(node.id());
    }
    let faults = router.spawn(fault_task(world.clone(), plan, ids.clone()));
    router.spawn(client(world.clone(), ns.clone(), plans)).await.ok();
    let owed = {
        let mut w = lock(&world);
        w.done = true;
        std::mem::take(&mut w.owed)
    };
    faults.abort();
    {
        let mut w = lock(&world);
        w.event("faults", format_args!("heal: {owed:?}"));
        for f in &owed {
            apply_fault(&mut w, f, &ids);
        }
    }
    let _ = settle(&world, kv_timeout_ms + 200).await;
    sleep(Duration::from_millis(kv_timeout_ms + 200)).await;
    let mut guard = lock(&world);
    let w: &mut World = &mut guard;
    final_checks(w, &ns);
    let sim_ms = w.now_ms();
    let mut report = RunReport::new(seed, &mut w.trace, sim_ms, w.router.outcomes.values());
    report.violations = std::mem::take(&mut w.violations);
    report.judge_samples(&spec, std::mem::take(&mut w.samples));
    report
}

impl NodeSlot {
    fn new(name: String, role: Role) -> NodeSlot {
        NodeSlot {
            name,
            role,
            engine: None,
            incarnation: 0,
            down: Down::Up,
            open: BTreeSet::new(),
            pulls: BTreeMap::new(),
            regions: Regions::new(1, false),
            slowdown: 1,
            up_since_ms: 0,
        }
    }
}
