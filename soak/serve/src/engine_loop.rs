//! The engine thread behind `plateau serve`: the only place the engine lives (one engine, or a P/D
//! proxy's router over its nodes: a [`System`] either way).
//!
//! Lifecycle: HTTP handlers send [`Command`]s through one bounded channel. The thread blocks on the
//! channel while the engine is idle; while requests are in flight it drains what has arrived, aborts
//! every request whose client has gone (its event receiver dropped: the stream was closed), steps
//! the engine once, and sends each request the tokens its sequences generated since the last step,
//! then its output when it ends. When the last request ends, the thread flushes its allocator cache
//! and gives unused pages back to the kernel, so that the server's memory at rest is its live
//! memory (`plateau_settled` says so in /metrics). Giving them back at every idle moment, rather
//! than at one scrape in four as the in-process soak does, keeps the dirty set small and the
//! allocator's own bookkeeping (`jemalloc.metadata`) level: at one purge per scrape, clean 200-
//! iteration runs saw it creep by 25 B per iteration in 2 of 5 seeds. A proxy's nodes are told to
//! do the same. While a prefill node holds KV that may never be pulled, the thread keeps stepping
//! between short waits, so the hold ends at its timeout. Sleep and wake commands (vLLM's control
//! endpoints) run between steps, with nothing in flight. The engine core stays what it is
//! everywhere else: one thread, no clock of its own (this thread's clock is passed to it), every
//! draw from seeded RNGs.

use std::collections::BTreeMap;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

use plateau_engine::{Metric, Request, RequestOutput};

use plateau_probes::system::System;
use tokio::sync::{mpsc, oneshot};

/// Commands the engine thread takes from the first one waiting, this many per step at most: a
/// bounded share of a step's work, so a burst of requests cannot starve those in flight.
const COMMANDS_PER_STEP: usize = 256;

/// How long the idle thread waits on its channel before looking again (it exits when every
/// sender is gone).
const IDLE_POLL: Duration = Duration::from_millis(200);

/// How long the thread waits for a command while KV is held for a transfer that may never be
/// pulled (a P/D system's prefill side): it steps between waits so the hold times out on time.
const HELD_POLL: Duration = Duration::from_millis(10);

/// What a handler asks of the engine thread.
pub enum Command {
    /// A request (its id is assigned by the thread); its events go to `events`.
    Submit { request: Request, events: mpsc::Sender<Event> },
    /// The engine's registries and counters, for /metrics.
    Stats { reply: oneshot::Sender<Snapshot> },
    /// vLLM's `/sleep`: release the KV pool (level 1) and the weights (level 2). Refused while
    /// requests are in flight.
    Sleep { level: u8, reply: oneshot::Sender<Result<(), String>> },
    /// vLLM's `/wake_up`: wake what `tags` names (None: everything). The engine wakes whole once
    /// no tag is left asleep, as vLLM reports `is_sleeping` until then.
    WakeUp { tags: Option<Vec<Tag>>, reply: oneshot::Sender<Result<(), String>> },
    /// vLLM's `/is_sleeping`.
    IsSleeping { reply: oneshot::Sender<bool> },
    /// vLLM's `/reset_prefix_cache`.
    ResetPrefixCache { reply: oneshot::Sender<Result<(), String>> },
}

/// What a vLLM wake-up names: the weights or the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tag {
    Weights,
    KvCache,
}

impl Tag {
    pub const ALL: [Tag; 2] = [Tag::Weights, Tag::KvCache];

    pub fn parse(s: &str) -> Result<Tag, String> {
        match s {
            "weights" => Ok(Tag::Weights),
            "kv_cache" => Ok(Tag::KvCache),
            other => Err(format!("tags: {other:?} is not a tag; weights or kv_cache")),
        }
    }
}

/// What a request's handler hears back, in order: tokens as they come, then exactly one of
/// `Finished` or `Refused`.
#[derive(Debug)]
pub enum Event {
    Tokens {
        index: u32,
        tokens: Vec<u32>,
    },
    Finished(RequestOutput),
    /// The engine would not take the request (why).
    Refused(String),
}

pub struct Snapshot {
    pub stats: Vec<Metric>,
    /// Requests in flight.
    pub in_flight: u64,
    /// Failed idle self-checks (name, detail), taken only when nothing is in flight.
    pub idle_violations: Vec<(String, String)>,
    /// Whether nothing ran since unused pages were last given back: the process's memory is then
    /// its live memory.
    pub settled: bool,
    /// A P/D proxy's nodes' own heap figures, role-prefixed (`decode.jemalloc.allocated`,
    /// `decode.proc.anon_outside_heap`), with their specs: what a probe of the node's process
    /// from outside cannot see. Empty for one engine, whose figures the handler reads itself.
    pub nodes: BTreeMap<String, f64>,
    pub node_specs: BTreeMap<String, plateau_reports::MetricSpec>,
}

/// Whether a node's own figure is one only the node can give: its allocator's, and its memory
/// outside that heap (the kernel's view of its process is read from outside).
fn node_only(name: &str) -> bool {
    name.contains(".jemalloc.") || name.ends_with(".proc.anon_outside_heap")
}

/// One request in flight: where its events go and how many tokens each sequence has been sent.
struct Live {
    events: mpsc::Sender<Event>,
    sent: BTreeMap<u32, usize>,
}

/// Runs the engine until every command sender is gone. Returns the engine's error, if it failed.
pub fn run(mut engine: Box<dyn System + Send>, commands: Receiver<Command>) -> Result<(), String> {
    let start = Instant::now();
    let mut live: BTreeMap<u64, Live> = BTreeMap::new();
    let mut next_id: u64 = 0;
    // Tags still asleep since the last sleep: empty while awake.
    let mut asleep: std::collections::BTreeSet<Tag> = std::collections::BTreeSet::new();
    loop {
        let waiting = live.is_empty() && !engine.has_unfinished();
        let held = waiting && engine.unsettled() > 0;
        let idle = waiting && !held;
        for k in 0..COMMANDS_PER_STEP {
            let cmd = if waiting && k == 0 {
                match commands.recv_timeout(if idle { IDLE_POLL } else { HELD_POLL }) {
                    Ok(c) => c,
                    Err(RecvTimeoutError::Timeout) => break,
                    Err(RecvTimeoutError::Disconnected) => return Ok(()),
                }
            } else {
                match commands.try_recv() {
                    Ok(c) => c,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) if live.is_empty() => return Ok(()),
                    Err(TryRecvError::Disconnected) => break,
                }
            };
            match cmd {
                Command::Submit { mut request, events } => {
                    request.id = next_id;
                    next_id += 1;
                    match engine.add_request(request) {
                        Ok(()) => {
                            live.insert(next_id - 1, Live { events, sent: BTreeMap::new() });
                        }
                        Err(e) => {
                            let _ = events.try_send(Event::Refused(e.to_string()));
                        }
                    }
                }
                Command::Sleep { level, reply } => {
                    let r = end_abandoned(engine.as_mut(), &mut live, start)
                        .and_then(|()| engine.sleep(level).map_err(|e| e.to_string()));
                    if r.is_ok() {
                        asleep.extend(Tag::ALL);
                        release_pages(engine.as_ref());
                    }
                    let _ = reply.send(r);
                }
                Command::WakeUp { tags, reply } => {
                    let r = if asleep.is_empty() {
                        Ok(())
                    } else {
                        for t in tags.unwrap_or_else(|| Tag::ALL.to_vec()) {
                            asleep.remove(&t);
                        }
                        let woke = if asleep.is_empty() { engine.wake().map_err(|e| e.to_string()) } else { Ok(()) };
                        release_pages(engine.as_ref());
                        woke
                    };
                    let _ = reply.send(r);
                }
                Command::IsSleeping { reply } => {
                    let _ = reply.send(!asleep.is_empty());
                }
                Command::ResetPrefixCache { reply } => {
                    let _ = reply.send(engine.reset_prefix_cache().map_err(|e| e.to_string()));
                }
                Command::Stats { reply } => {
                    // Idle, the pages were given back when the last request ended.
                    let settled = live.is_empty() && !engine.has_unfinished();
                    let _ = reply.send(snapshot(engine.as_mut(), live.len(), settled));
                }
            }
        }
        abort_abandoned(engine.as_mut(), &live);
        if !engine.has_unfinished() && !held {
            if idle {
                continue;
            }
            // Outputs of requests aborted just now come out of the next step.
            if live.is_empty() {
                release_pages(engine.as_ref());
                continue;
            }
        }
        let outputs = engine.step(start.elapsed().as_millis() as u64).map_err(|e| format!("engine step: {e}"))?;
        deliver(engine.as_ref(), &mut live, outputs);
        if !engine.has_unfinished() {
            // Every request ends with one output; one still waiting here would wait forever.
            for (_, l) in std::mem::take(&mut live) {
                let _ = l.events.try_send(Event::Refused("the engine ended the request without an output".into()));
            }
            release_pages(engine.as_ref());
        }
    }
}

/// What `/metrics` reads: the engine's registries, the requests in flight, the idle self-check
/// where `settled` (nothing in flight), and each node's own process gauges.
fn snapshot(engine: &mut (dyn System + Send), in_flight: usize, settled: bool) -> Snapshot {
    let idle_violations = match settled.then(|| engine.check_idle()) {
        Some(Err(v)) => v.into_iter().map(|x| (x.metric, x.detail)).collect(),
        _ => Vec::new(),
    };
    let mut nodes = BTreeMap::new();
    engine.sample_processes(plateau_probes::probes::Settle::Flush, &mut nodes);
    nodes.retain(|k, _| node_only(k));
    let mut node_specs = engine.process_specs();
    node_specs.retain(|k, _| nodes.contains_key(k));
    Snapshot { stats: engine.stats(), in_flight: in_flight as u64, idle_violations, settled, nodes, node_specs }
}

/// A step's new tokens to each request's stream, and each finished request's output to its own.
fn deliver(engine: &(dyn System + Send), live: &mut BTreeMap<u64, Live>, outputs: Vec<RequestOutput>) {
    for (&id, l) in live.iter_mut() {
        for (index, tokens) in engine.generated(id) {
            send_new(l, index, &tokens);
        }
    }
    for out in outputs {
        let Some(mut l) = live.remove(&out.id) else { continue };
        for s in &out.seqs {
            send_new(&mut l, s.index, &s.tokens);
        }
        let _ = l.events.try_send(Event::Finished(out));
    }
}

/// Steps a request whose client has gone (closed its stream) cannot outlast: aborted, its output
/// comes out of the next step.
const ABANDONED_STEPS: usize = 4;

/// Ends the requests whose clients have gone before a command that needs nothing in flight
/// (sleep). A client that aborted closes its stream and may send the command at once, before this
/// thread has seen the stream closed: those requests are aborted and stepped out here (at most
/// [`ABANDONED_STEPS`] steps) instead of refusing the command. A request whose client still
/// listens is left alone, and the command is refused as busy.
fn end_abandoned(
    engine: &mut (dyn System + Send),
    live: &mut BTreeMap<u64, Live>,
    start: Instant,
) -> Result<(), String> {
    if live.is_empty() || live.values().any(|l| !l.events.is_closed()) {
        return Ok(());
    }
    abort_abandoned(engine, live);
    for _ in 0..ABANDONED_STEPS {
        if !engine.has_unfinished() {
            break;
        }
        for out in engine.step(start.elapsed().as_millis() as u64).map_err(|e| format!("engine step: {e}"))? {
            live.remove(&out.id);
        }
    }
    if !engine.has_unfinished() {
        live.clear();
    }
    Ok(())
}

/// A client that went away (closed its stream) aborts its request, as vLLM does; its output
/// comes out of the next step.
fn abort_abandoned(engine: &mut (dyn System + Send), live: &BTreeMap<u64, Live>) {
    for (&id, l) in live {
        if l.events.is_closed() {
            engine.abort(id);
        }
    }
}

/// Sends a sequence's tokens past those already sent. A full or closed channel drops them: the
/// channel holds every token a request can make, so only a client that left is ever skipped.
fn send_new(l: &mut Live, index: u32, tokens: &[u32]) {
    let sent = l.sent.entry(index).or_insert(0);
    if tokens.len() > *sent {
        let _ = l.events.try_send(Event::Tokens { index, tokens: tokens[*sent..].to_vec() });
        *sent = tokens.len();
    }
}

/// This thread's allocator cache flushed and every unused dirty page returned: the server at rest
/// holds only live memory, so the kernel's view of it (RSS) is comparable from one idle moment to
/// the next (plateau's allocator keeps freed pages until told, see `probes::MALLOC_CONF`). A
/// system whose engines run in node processes (a P/D proxy) has them do the same.
fn release_pages(engine: &dyn System) {
    // Flushes this thread's cache too (Purge), so the engine's freed memory is counted freed.
    plateau_probes::probes::settle_allocator(plateau_probes::probes::Settle::Purge);
    engine.sample_processes(plateau_probes::probes::Settle::Purge, &mut BTreeMap::new());
}

/// The capacity of a request's event channel: one event per generated token of each sequence at
/// most, plus the output, so that the engine thread never waits on a handler.
pub fn event_capacity(request: &Request) -> usize {
    (request.params.n.max(1) as usize).saturating_mul(request.params.max_tokens.max(1) as usize).saturating_add(2)
}
