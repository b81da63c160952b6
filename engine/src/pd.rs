//! Prefill/decode disaggregation: the KV connector as a state machine with no I/O.
//!
//! Lifecycle of a disaggregated request:
//! 1. Prefill engine (role `Prefill`): the router adds the request with max_tokens = 1. When its
//!    prompt is computed and its first token sampled, the engine *holds* its KV blocks instead of
//!    freeing them, under a transfer handle, and the request's output carries [`TransferParams`].
//! 2. Decode engine (role `Decode`): `add_remote_request` takes the request and those parameters.
//!    The request waits for remote KV; at the next step the connector allocates local blocks
//!    (prefix-cache hits are not pulled) and emits a [`PullOrder`] for the shell's transport.
//! 3. The transport reads the held blocks from the prefill side (`export_kv`, which refuses a
//!    stale request or a block that is not the request's) and hands the bytes to `pull_done`; the
//!    request then decodes like any other. Each end on the decode side (pulled, aborted, failed)
//!    emits a [`Notice`] that the shell forwards to the prefill side's `release_transfer`.
//! 4. The prefill side frees the blocks and the handle on that notice, or when the transfer
//!    timeout expires (the decode side may have died): `advance_time` is how the shell tells the
//!    core what time it is; the core owns no clock.

use serde::{Deserialize, Serialize};

use crate::block_pool::BlockId;
use crate::engine::{Engine, ReqState};
use crate::error::{EngineError, Result};
use crate::inject::Injection;
use crate::kv_manager::SeqId;
use crate::request::{FinishReason, Request, RequestId};

/// What an engine does in a deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    #[default]
    Monolithic,
    Prefill,
    Decode,
}

/// What the decode side needs to pull a request's KV from the prefill side.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferParams {
    pub engine_id: u32,
    pub request_id: RequestId,
    pub handle: u64,
    /// The prefill side's blocks, in order.
    pub block_ids: Vec<BlockId>,
    /// Prompt tokens whose KV the blocks hold.
    pub num_tokens: usize,
    /// The token the prefill side sampled.
    pub first_token: u32,
}

/// A transfer for the shell's transport: remote blocks into local blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullOrder {
    pub request: RequestId,
    pub engine_id: u32,
    pub handle: u64,
    pub remote_blocks: Vec<BlockId>,
    pub local_blocks: Vec<BlockId>,
}

/// A message from the decode side to the prefill side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Notice {
    /// The KV arrived: the prefill side may free it.
    Pulled { engine_id: u32, request: RequestId, handle: u64 },
    /// The request ended on the decode side before or during its pull.
    Aborted { engine_id: u32, request: RequestId, handle: u64 },
}

/// KV held on the prefill side for a transfer.
#[derive(Debug)]
pub(crate) struct Held {
    pub seq: SeqId,
    pub handle: u64,
    pub since_ms: u64,
}

/// The decode side's view of a remote request.
#[derive(Debug, Clone)]
pub(crate) struct Remote {
    pub params: TransferParams,
    pub pulling: bool,
}

/// Whether a request's first token, sampled on the prefill side, already ends it: then the router
/// releases the held KV instead of forwarding the request to a decode side.
pub fn ends_at_first_token(p: &crate::request::SamplingParams, first_token: u32) -> bool {
    p.max_tokens == 1
        || (!p.ignore_eos && first_token == crate::tokenizer::EOS)
        || p.stop_token_ids.contains(&first_token)
}

impl Engine {
    /// Prefill side: keeps a finished request's blocks for its transfer. Returns the parameters.
    pub(crate) fn hold_for_transfer(&mut self, sid: SeqId, rid: RequestId) {
        self.pd.next_handle += 1;
        let handle = (u64::from(self.config.engine_id) << 48) | self.pd.next_handle;
        self.pd.handles.insert(handle, rid);
        let previous = self.pd.held.insert(rid, Held { seq: sid, handle, since_ms: self.now_ms });
        assert!(previous.is_none(), "request {rid} held twice");
    }

    pub(crate) fn transfer_params(&self, rid: RequestId) -> Option<TransferParams> {
        let h = self.pd.held.get(&rid)?;
        let s = self.seqs.get(&h.seq)?;
        Some(TransferParams {
            engine_id: self.config.engine_id,
            request_id: rid,
            handle: h.handle,
            block_ids: self.kv.block_table(h.seq).to_vec(),
            num_tokens: s.num_prompt,
            first_token: *s.tokens.last().expect("a held request sampled its first token"),
        })
    }

    /// Prefill side: the decode side is done with (or gave up on) request `rid`'s KV.
    /// `decode_aborted` says which. Unknown requests are a no-op (returns false).
    pub fn release_transfer(&mut self, rid: RequestId, decode_aborted: bool) -> bool {
        if decode_aborted && self.config.injections.on(Injection::PdPrefillHold) {
            // The bug: an abort on the decode side never reaches the blocks.
            return false;
        }
        let Some(h) = self.pd.held.remove(&rid) else { return false };
        self.kv.free(h.seq);
        if !self.config.injections.on(Injection::PdHandles) {
            self.pd.handles.remove(&h.handle);
        }
        true
    }

    /// Tells the core the time, in ms since the shell started. Expires held transfers whose
    /// timeout passed; returns how many.
    pub fn advance_time(&mut self, now_ms: u64) -> usize {
        self.now_ms = self.now_ms.max(now_ms);
        if self.config.injections.on(Injection::PdPrefillHold) {
            return 0;
        }
        let timeout = self.config.kv_transfer_timeout_ms;
        let expired: Vec<RequestId> = self
            .pd
            .held
            .keys()
            .copied()
            .filter(|r| self.pd.held.get(r).is_some_and(|h| h.since_ms.saturating_add(timeout) <= self.now_ms))
            .collect();
        for r in &expired {
            self.release_transfer(*r, false);
        }
        expired.len()
    }

    /// Whether a held transfer may still free its blocks (a pull or its timeout is still to come).
    /// Overdue holds that were not released never will be: the scheduler then stops waiting.
    pub(crate) fn held_may_free(&self) -> bool {
        let timeout = self.config.kv_transfer_timeout_ms;
        self.pd.held.values().any(|h| h.since_ms.saturating_add(timeout) > self.now_ms)
    }

    /// Transfers held on the prefill side.
    pub fn held_transfers(&self) -> usize {
        self.pd.held.len()
    }

    /// Prefill side: the KV of `blocks` of held request `rid`, for a transport. Refuses a stale
    /// request or handle, and blocks that are not the request's.
    pub fn export_kv(&self, rid: RequestId, handle: u64, blocks: &[BlockId]) -> std::result::Result<Vec<f32>, String> {
        let h = self
            .pd
            .held
            .get(&rid)
            .filter(|h| h.handle == handle)
            .ok_or_else(|| format!("stale transfer: request {rid} holds no KV under handle {handle:#x}"))?;
        let table = self.kv.block_table(h.seq);
        if let Some(b) = blocks.iter().find(|b| !table.contains(b)) {
            return Err(format!(
                "block {b} is not one of request {rid}'s {} blocks (pool has {})",
                table.len(),
                self.kv.counts().total
            ));
        }
        self.backend.read_kv(blocks).map_err(|e| e.to_string())
    }

    /// Decode side: adds a request whose prompt KV is on a prefill engine.
    pub fn add_remote_request(&mut self, r: Request, params: TransferParams) -> Result<()> {
        let bad = |reason: String| Err(EngineError::InvalidRequest { id: r.id, reason });
        if self.config.role != crate::pd::Role::Decode {
            return Err(EngineError::Config("add_remote_request needs an engine in the decode role".into()));
        }
        if r.params.n != 1 || !r.images.is_empty() {
            return bad("disaggregated requests take n = 1 and no images".into());
        }
        if params.request_id != r.id {
            return bad(format!("transfer parameters are for request {}", params.request_id));
        }
        if params.num_tokens != r.prompt.len() || params.block_ids.len() != self.kv.blocks_for(params.num_tokens) {
            return bad(format!(
                "transfer parameters do not match the prompt: {} tokens in {} blocks for a {}-token prompt",
                params.num_tokens,
                params.block_ids.len(),
                r.prompt.len()
            ));
        }
        if params.first_token as usize >= self.model.vocab_size {
            return bad(format!("first token {} is outside the vocabulary", params.first_token));
        }
        self.validate(&r)?;
        let seed = self.request_seed(&r);
        let mut tokens = r.prompt.clone();
        tokens.push(params.first_token);
        let sid = self.new_seq(r.id, 0, tokens, seed);
        let s = self.seqs.get_mut(&sid).expect("new seq");
        s.num_prompt = r.prompt.len();
        if r.params.temperature > 0.0 {
            // The prefill side made this sequence's first draw.
            let _ = rand_core::RngCore::next_u64(&mut s.rng);
        }
        let remote = crate::pd::Remote { params, pulling: false };
        self.requests.insert(r.id, ReqState::new(r.params, seed, r.prompt, sid, Vec::new(), Some(remote)));
        self.requests.get_mut(&r.id).expect("inserted").forked = true;
        self.pd.waiting_for_kv.push_back(sid);
        self.counters.requests_added += 1;
        Ok(())
    }

    /// Decode side, at the start of a step: allocates local blocks for requests waiting for
    /// remote KV and emits their pull orders. Prefix-cache hits are not pulled.
    pub(crate) fn start_pulls(&mut self) {
        let waiting: Vec<SeqId> = self.pd.waiting_for_kv.iter().copied().collect();
        for sid in waiting {
            let Some(s) = self.seqs.get(&sid) else { continue };
            let rid = s.request;
            let Some(remote) = self.requests.get(&rid).and_then(|r| r.remote.clone()) else { continue };
            if remote.pulling {
                continue;
            }
            let n = remote.params.num_tokens;
            let hits = self.kv.prefix_hits(&s.tokens[..n], &[]);
            let start = hits.len() * self.kv.block_size();
            if self.kv.allocate(sid, &hits, start, n).is_err() {
                if self.running.is_empty() && self.pd.pulls.is_empty() {
                    if let Some(r) = self.requests.get_mut(&rid) {
                        r.error = Some("KV cache exhausted: no room to pull the prompt's KV".into());
                    }
                    self.finish_seq(sid, FinishReason::Error);
                }
                continue;
            }
            self.seqs.get_mut(&sid).expect("seq").num_computed = start;
            self.counters.prefix_cache_hit_tokens += start as u64;
            let table = self.kv.block_table(sid);
            let order = PullOrder {
                request: rid,
                engine_id: remote.params.engine_id,
                handle: remote.params.handle,
                remote_blocks: remote.params.block_ids[hits.len()..].to_vec(),
                local_blocks: table[hits.len()..].to_vec(),
            };
            if let Some(r) = self.requests.get_mut(&rid) {
                r.cached_prompt_tokens = start as u32;
                if let Some(rem) = r.remote.as_mut() {
                    rem.pulling = true;
                }
            }
            self.pd.pulls.insert(rid, order.clone());
            self.pd.orders.push_back(order);
        }
    }

    /// Decode side: pull orders for the transport.
    pub fn take_pull_orders(&mut self) -> Vec<PullOrder> {
        self.pd.orders.drain_all()
    }

    /// Decode side: the transport finished pulling `rid`'s KV (or failed). A request that ended
    /// meanwhile (aborted) is a no-op that returns false.
    pub fn pull_done(&mut self, rid: RequestId, result: std::result::Result<Vec<f32>, String>) -> bool {
        let Some(order) = self.pd.pulls.remove(&rid) else { return false };
        let Some(sid) = self.requests.get(&rid).map(|r| r.seqs[0]) else { return false };
        let written =
            result.and_then(|data| self.backend.write_kv(&order.local_blocks, &data).map_err(|e| e.to_string()));
        self.pd.waiting_for_kv.remove_item(&sid);
        match written {
            Ok(()) => {
                let s = self.seqs.get_mut(&sid).expect("seq");
                s.num_computed = s.num_prompt;
                let tokens = std::mem::take(&mut s.tokens);
                self.kv.publish(sid, &tokens, tokens.len() - 1, &[]);
                self.seqs.get_mut(&sid).expect("seq").tokens = tokens;
                self.running.push_back(sid);
                self.pd.notices.push_back(Notice::Pulled {
                    engine_id: order.engine_id,
                    request: rid,
                    handle: order.handle,
                });
                true
            }
            Err(e) => {
                if let Some(r) = self.requests.get_mut(&rid) {
                    r.error = Some(format!("KV pull failed: {e}"));
                }
                self.pd.notices.push_back(Notice::Aborted {
                    engine_id: order.engine_id,
                    request: rid,
                    handle: order.handle,
                });
                self.finish_seq(sid, FinishReason::Error);
                true
            }
        }
    }

    /// Decode side: notices for the prefill side, to forward.
    pub fn take_notices(&mut self) -> Vec<Notice> {
        self.pd.notices.drain_all()
    }

    /// Decode side: a remote request leaves before its KV arrived (abort, error).
    pub(crate) fn forget_remote(&mut self, rid: RequestId, sid: SeqId) {
        let was_waiting = self.pd.waiting_for_kv.remove_item(&sid);
        let order = self.pd.pulls.remove(&rid);
        let remote =
            self.requests.get(&rid).and_then(|r| r.remote.as_ref()).map(|r| (r.params.engine_id, r.params.handle));
        if let (true, Some((engine_id, handle))) = (was_waiting || order.is_some(), remote) {
            self.pd.notices.push_back(Notice::Aborted { engine_id, request: rid, handle });
        }
    }

    /// A request's seed: its own, or one mixed from the engine seed and its id.
    pub(crate) fn request_seed(&self, r: &Request) -> u64 {
        r.params.seed.unwrap_or_else(|| {
            let mut z = self.config.seed ^ r.id.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z ^ (z >> 31)
        })
    }
}

/// The connector's registries, created through the engine's book.
#[derive(Debug)]
pub(crate) struct PdState {
    /// Prefill side: requests whose KV is held for a transfer.
    pub held: crate::registry::TrackedMap<RequestId, Held>,
    /// Prefill side: live transfer handles.
    pub handles: crate::registry::TrackedMap<u64, RequestId>,
    pub next_handle: u64,
    /// Decode side: sequences waiting for their prompt's KV.
    pub waiting_for_kv: crate::registry::TrackedQueue<SeqId>,
    /// Decode side: pulls in flight.
    pub pulls: crate::registry::TrackedMap<RequestId, PullOrder>,
    /// Decode side: orders not yet taken by the transport.
    pub orders: crate::registry::TrackedQueue<PullOrder>,
    /// Decode side: notices not yet taken by the shell.
    pub notices: crate::registry::TrackedQueue<Notice>,
}

impl PdState {
    pub fn new(book: &mut crate::registry::Registries) -> Self {
        use crate::registry::MetricKind::PerRequest;
        PdState {
            held: book.map("registry.pd.held", PerRequest),
            handles: book.map("registry.pd.handles", PerRequest),
            next_handle: 0,
            waiting_for_kv: book.queue("registry.pd.waiting_for_kv", PerRequest),
            pulls: book.map("registry.pd.pulls", PerRequest),
            orders: book.queue("registry.pd.orders", PerRequest),
            notices: book.queue("registry.pd.notices", PerRequest),
        }
    }
}
