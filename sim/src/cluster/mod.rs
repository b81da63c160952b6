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
use plateau_engine::pd::{next_hop, NextHop};
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
use crate::report::{Outcome, RunReport, Violation};
use crate::spec::{ModelKind, RunSpec};
use crate::trace::Trace;

mod chaos;
mod checks;
mod node;
mod router;

use chaos::{apply_fault, fault_task};
use checks::{final_checks, quiescent_point, settle};
use node::{engine_node, send_all};
use router::{client, disconnect, router_node};

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
    /// The first quiescent iteration this incarnation was sampled at: its gauges are recorded
    /// only after a warm-up of its own (a restarted engine fills its caches again).
    sampled_since_iter: Option<u64>,
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
    samples: crate::report::QuiescentSamples,
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
    /// The largest KV transfer: a whole pool (every block of one request).
    max_transfer_bytes: u64,
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
    let shape = (spec.sim.prefill_nodes, spec.sim.decode_nodes, spec.sim.monolithic_nodes);
    let horizon_ms = spec.iterations * (spec.sim.arrival_window_ms + 150);
    let engine_nodes = shape.0 + shape.1 + shape.2;
    let plan = faults.unwrap_or_else(|| {
        FaultPlan::generate(spec.profile, Shape { engine_nodes, clients: CLIENTS, horizon_ms }, seed)
    });
    let ns = Arc::new(NodeSpec {
        cost: CostModel::new(spec.sim.kv_bandwidth_mb_per_s),
        kv_bytes_per_token: model.kv_bytes_per_token() as u64,
        kv_timeout_ms,
        regions: s.pd.as_ref().map_or(plateau_scenario::PdSection::default().regions, |p| p.regions),
        max_transfer_bytes: {
            let c = s.engine_config(spec.injections.clone(), seed);
            (c.num_kv_blocks * c.block_size) as u64 * model.kv_bytes_per_token() as u64
        },
        seed,
        spec: spec.clone(),
    });
    let (nodes, prefill, decode, mono) = node_slots(shape);
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
    let _ = settle(&world, node::settle_ms(kv_timeout_ms)).await;
    sleep(Duration::from_millis(node::settle_ms(kv_timeout_ms))).await;
    let mut guard = lock(&world);
    let w: &mut World = &mut guard;
    final_checks(w, &ns);
    let sim_ms = w.now_ms();
    let mut report = RunReport::new(seed, &mut w.trace, sim_ms, w.router.outcomes.values());
    report.violations = std::mem::take(&mut w.violations);
    report.judge_samples(&spec, std::mem::take(&mut w.samples));
    report
}

/// The cluster's slots: the router at index 0, then the prefill, decode and monolithic nodes of
/// `shape` in that order, with the indices of each role's nodes.
fn node_slots(shape: (usize, usize, usize)) -> (Vec<NodeSlot>, Vec<usize>, Vec<usize>, Vec<usize>) {
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
    (nodes, prefill, decode, mono)
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
            regions: Regions::new(1, 1, false),
            slowdown: 1,
            up_since_ms: 0,
            sampled_since_iter: None,
        }
    }
}
