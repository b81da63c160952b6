//! `plateau node`: one engine of a prefill/decode pair in its own process, served over TCP, so
//! that each role is sampled as its own process (as the second incident required).
//!
//! The driver (the router) connects as controller and makes calls ([`Call`]) step by step; the
//! decode node also connects to the prefill node as a peer and pulls KV over that connection into
//! its registered regions. A node exits when its controller's connection closes.

use std::collections::BTreeMap;
use std::io::{BufReader, BufWriter};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use plateau_engine::{Engine, MetricKind, Notice, RequestOutput, RequestStage, Role, SamplingParams, TransferParams};
use serde::{Deserialize, Serialize};

use super::region::RegionCache;
use super::wire::{read_frame, write_frame, WireError};
use plateau_probes::mappings::Mapping;
use plateau_probes::probes::{ProcessProbes, Settle};

/// A call from the controller (or, for `ExportKv`, from the decode peer).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Call {
    /// The first call of the decode node's peer connection.
    Peer,
    Add {
        id: u64,
        prompt: Vec<u32>,
        params: SamplingParams,
    },
    AddRemote {
        id: u64,
        prompt: Vec<u32>,
        params: SamplingParams,
        transfer: TransferParams,
    },
    Step {
        now_ms: u64,
    },
    Stage {
        id: u64,
    },
    Abort {
        id: u64,
    },
    Release {
        id: u64,
        aborted: bool,
    },
    ExportKv {
        id: u64,
        handle: u64,
        blocks: Vec<u32>,
    },
    Stats,
    /// The node process's own probes (allocator, /proc), settled as the controller says.
    Probes {
        settle: Settle,
    },
    CheckIdle,
    /// The iteration the controller is in (stamps registry entries).
    SetEpoch {
        epoch: u64,
    },
    Residues,
    Held,
    Mappings,
    Sleep {
        level: u8,
    },
    Wake,
    ResetPrefixCache,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Reply {
    Done,
    Failed(String),
    Stepped {
        outputs: Vec<RequestOutput>,
        notices: Vec<Notice>,
        unfinished: bool,
    },
    Stage(Option<RequestStage>),
    Flag(bool),
    /// The KV is in the frame's blob.
    Kv,
    Stats(Vec<WireMetric>),
    Probes(Vec<WireMetric>),
    /// Failed idle checks: (metric or check name, what it found).
    Idle(Vec<(String, String)>),
    Residues(Vec<plateau_probes::system::Residue>),
    Count(usize),
    Mappings(Vec<Mapping>),
}

/// A metric as it crosses the wire.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireMetric {
    pub name: String,
    pub kind: String,
    pub unit: String,
    pub capacity: Option<u64>,
    pub value: f64,
    #[serde(default)]
    pub quantum: Option<f64>,
}

struct Node {
    /// A controller connected (the first connection whose first call is not `Peer`): the node
    /// serves it, and exits when it leaves. Connections before it that close without a call, or
    /// with a bad frame, are strays and change nothing.
    controller: bool,
    engine: Engine,
    probes: ProcessProbes,
    regions: RegionCache,
    peer: Option<(BufReader<TcpStream>, BufWriter<TcpStream>)>,
    peer_addr: Option<String>,
}

fn kind_name(k: MetricKind) -> (String, Option<u64>) {
    match k {
        MetricKind::Bounded { capacity } => ("bounded".into(), Some(capacity)),
        other => (other.as_str().into(), None),
    }
}

impl Node {
    /// Pulls one order's KV from the prefill peer into a registered region.
    fn pull(&mut self, order: &plateau_engine::PullOrder) -> Result<Vec<f32>, String> {
        if self.peer.is_none() {
            let addr = self.peer_addr.clone().ok_or("decode node has no --peer")?;
            let s = TcpStream::connect(&addr).map_err(|e| format!("connecting to prefill peer {addr}: {e}"))?;
            s.set_nodelay(true).ok();
            let mut w = BufWriter::new(s.try_clone().map_err(|e| e.to_string())?);
            write_frame(&mut w, &Call::Peer, &[]).map_err(|e| e.to_string())?;
            self.peer = Some((BufReader::new(s), w));
        }
        let (r, w) = self.peer.as_mut().expect("connected");
        let call = Call::ExportKv { id: order.request, handle: order.handle, blocks: order.remote_blocks.clone() };
        write_frame(w, &call, &[]).map_err(|e| format!("KV pull: {e}"))?;
        let (reply, blob): (Reply, Vec<u8>) = read_frame(r).map_err(|e| format!("KV pull: {e}"))?;
        match reply {
            Reply::Kv => {}
            Reply::Failed(m) => return Err(m),
            other => return Err(format!("KV pull: unexpected reply {other:?}")),
        }
        let idx = self.regions.acquire(blob.len())?.ok_or("every transfer region is in use")?;
        let region = self.regions.bytes_mut(idx);
        region[..blob.len()].copy_from_slice(&blob);
        let data = region[..blob.len()].chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        self.regions.release(idx);
        Ok(data)
    }

    /// The engine's registries and the transport's regions, as the controller samples them.
    fn stats(&self) -> Vec<WireMetric> {
        let mut out = Vec::new();
        for m in self.engine.stats() {
            let (kind, capacity) = kind_name(m.kind);
            out.push(WireMetric {
                name: m.name,
                kind,
                unit: m.unit.into(),
                capacity,
                value: m.value as f64,
                quantum: None,
            });
        }
        let r = &self.regions;
        out.push(WireMetric {
            name: "registry.transport.regions".into(),
            kind: "bounded".into(),
            unit: "count".into(),
            capacity: Some(r.capacity() as u64),
            value: r.len() as f64,
            quantum: None,
        });
        out
    }

    /// This process's probes, settled as asked: values as measured, each as the process read it.
    fn probes(&mut self, settle: Settle) -> Vec<WireMetric> {
        let (mut values, mut cost) = (BTreeMap::new(), BTreeMap::new());
        self.probes.sample("", settle, &mut values, &mut cost);
        ProcessProbes::specs("")
            .into_iter()
            .filter_map(|(name, spec)| {
                let value = *values.get(&name)?;
                Some(WireMetric {
                    name,
                    kind: spec.kind.as_str().into(),
                    unit: spec.unit,
                    capacity: spec.capacity,
                    value,
                    quantum: spec.quantum,
                })
            })
            .collect()
    }

    fn handle(&mut self, call: Call) -> (Reply, Vec<u8>) {
        let e = &mut self.engine;
        let reply = match call {
            Call::Peer => Reply::Done,
            Call::Add { id, prompt, params } => {
                match e.add_request(plateau_engine::Request { id, prompt, params, images: vec![] }) {
                    Ok(()) => Reply::Done,
                    Err(err) => Reply::Failed(err.to_string()),
                }
            }
            Call::AddRemote { id, prompt, params, transfer } => {
                match e.add_remote_request(plateau_engine::Request { id, prompt, params, images: vec![] }, transfer) {
                    Ok(()) => Reply::Done,
                    Err(err) => Reply::Failed(err.to_string()),
                }
            }
            Call::Step { now_ms } => {
                e.advance_time(now_ms);
                for order in e.take_pull_orders() {
                    let got = self.pull(&order);
                    self.engine.pull_done(order.request, got);
                }
                let e = &mut self.engine;
                match e.step() {
                    Ok(outputs) => {
                        Reply::Stepped { outputs, notices: e.take_notices(), unfinished: e.has_unfinished() }
                    }
                    Err(err) => Reply::Failed(err.to_string()),
                }
            }
            Call::Stage { id } => Reply::Stage(e.stage(id)),
            Call::Abort { id } => Reply::Flag(e.abort(id) == plateau_engine::AbortOutcome::Aborted),
            Call::Release { id, aborted } => Reply::Flag(e.release_transfer(id, aborted)),
            Call::ExportKv { id, handle, blocks } => match e.export_kv(id, handle, &blocks) {
                Ok(data) => return (Reply::Kv, data.iter().flat_map(|f| f.to_le_bytes()).collect()),
                Err(m) => Reply::Failed(m),
            },
            Call::Stats => Reply::Stats(self.stats()),
            Call::Probes { settle } => Reply::Probes(self.probes(settle)),
            Call::CheckIdle => Reply::Idle(match e.check_idle() {
                Ok(()) => vec![],
                Err(v) => v.into_iter().map(|v| (v.metric, v.detail)).collect(),
            }),
            Call::SetEpoch { epoch } => {
                e.set_epoch(epoch);
                Reply::Done
            }
            Call::Residues => {
                Reply::Residues(e.residues().into_iter().map(plateau_probes::system::Residue::from).collect())
            }
            Call::Held => Reply::Count(e.held_transfers()),
            Call::Mappings => Reply::Mappings(self.probes.mappings()),
            Call::Sleep { level } => match e.sleep(level) {
                Ok(()) => Reply::Done,
                Err(err) => Reply::Failed(err.to_string()),
            },
            Call::Wake => match e.wake() {
                Ok(()) => Reply::Done,
                Err(err) => Reply::Failed(err.to_string()),
            },
            Call::ResetPrefixCache => match e.reset_prefix_cache() {
                Ok(()) => Reply::Done,
                Err(err) => Reply::Failed(err.to_string()),
            },
        };
        (reply, Vec::new())
    }
}

/// Serves one engine on `listener` until the controller's connection closes. Prints `listening
/// ADDR` first.
pub fn serve(
    engine: Engine,
    listener: TcpListener,
    peer: Option<String>,
    leak_on_remap: bool,
    regions: usize,
) -> Result<(), String> {
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    plateau_shell::outln!("listening {addr}");
    use std::io::Write;
    std::io::stdout().flush().ok();
    let node = Arc::new(Mutex::new(Node {
        controller: false,
        engine,
        probes: ProcessProbes::new(),
        regions: RegionCache::new(regions, leak_on_remap),
        peer: None,
        peer_addr: peer,
    }));
    for stream in listener.incoming() {
        let stream = stream.map_err(|e| e.to_string())?;
        stream.set_nodelay(true).ok();
        let node = Arc::clone(&node);
        std::thread::spawn(move || {
            let is_controller = connection(stream, &node);
            if is_controller {
                std::process::exit(0);
            }
        });
    }
    Ok(())
}

/// Who a connection turned out to be, from its first call.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Caller {
    /// No valid call yet: a stray until it makes one.
    Unknown,
    Controller,
    Peer,
}

/// Serves one connection; true if it was the controller's (the node then exits). A connection
/// that closes or sends a bad frame before its first valid call is a stray: ignored. A second
/// would-be controller is refused.
fn connection(stream: TcpStream, node: &Mutex<Node>) -> bool {
    let Ok(w) = stream.try_clone() else { return false };
    let (mut r, mut w) = (BufReader::new(stream), BufWriter::new(w));
    let mut caller = Caller::Unknown;
    loop {
        let call: Call = match read_frame(&mut r) {
            Ok((c, _)) => c,
            Err(WireError::Closed) => return caller == Caller::Controller,
            Err(e) => {
                // A corrupted or truncated frame is never applied; the connection is dropped.
                plateau_shell::errln!("plateau node: rejected a frame: {e}");
                return caller == Caller::Controller;
            }
        };
        let Ok(mut n) = node.lock() else { return caller == Caller::Controller };
        if caller == Caller::Unknown {
            caller = match call {
                Call::Peer => Caller::Peer,
                _ if n.controller => {
                    let refusal = Reply::Failed("a controller is already connected to this node".into());
                    let _ = write_frame(&mut w, &refusal, &[]);
                    return false;
                }
                _ => {
                    n.controller = true;
                    Caller::Controller
                }
            };
        }
        let (reply, blob) = n.handle(call);
        drop(n);
        if write_frame(&mut w, &reply, &blob).is_err() {
            return caller == Caller::Controller;
        }
    }
}

/// Role from its name.
pub fn parse_role(s: &str) -> Result<Role, String> {
    match s {
        "prefill" => Ok(Role::Prefill),
        "decode" => Ok(Role::Decode),
        other => Err(format!("--role `{other}` is not prefill or decode")),
    }
}
