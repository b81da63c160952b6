//! The KV connector: the P/D state machine of one engine, with no I/O (the lifecycle is in this
//! module's parent). On the prefill side it holds finished requests' blocks under transfer
//! handles until the decode side is done with them (or the transfer times out); on the decode side
//! it tracks requests waiting for their prompt's KV, pull orders for the shell's transport, and
//! notices for the prefill side. Every queue and map is a counted registry.

use crate::block_pool::BlockId;
use crate::inject::{Injection, Injections};
use crate::kv_manager::{KvManager, SeqId};
use crate::registry::{MetricKind, Registries, TrackedMap, TrackedQueue};
use crate::request::RequestId;
use crate::store::RequestStore;

use super::{Notice, PullOrder, Role, TransferParams};

/// KV held on the prefill side for a transfer.
#[derive(Debug)]
struct Held {
    seq: SeqId,
    handle: u64,
    since_ms: u64,
}

#[derive(Debug)]
pub(crate) struct KvConnector {
    role: Role,
    engine_id: u32,
    timeout_ms: u64,
    /// Decode side: pulls in flight at most (`EngineConfig::max_pulls_in_flight`).
    max_pulls: usize,
    injections: Injections,
    /// The time the shell last told the core (`advance_time`), in ms.
    now_ms: u64,
    /// Prefill side: requests whose KV is held for a transfer.
    held: TrackedMap<RequestId, Held>,
    /// Prefill side: live transfer handles.
    handles: TrackedMap<u64, RequestId>,
    next_handle: u64,
    /// Decode side: sequences waiting for their prompt's KV.
    waiting_for_kv: TrackedQueue<SeqId>,
    /// Decode side: pulls in flight.
    pulls: TrackedMap<RequestId, PullOrder>,
    /// Decode side: orders not yet taken by the transport.
    orders: TrackedQueue<PullOrder>,
    /// Decode side: notices not yet taken by the shell.
    notices: TrackedQueue<Notice>,
}

impl KvConnector {
    pub fn new(
        role: Role,
        engine_id: u32,
        timeout_ms: u64,
        max_pulls: usize,
        injections: Injections,
        book: &mut Registries,
    ) -> Self {
        use MetricKind::PerRequest;
        assert!(max_pulls > 0, "a connector that may start no pull would never drain");
        KvConnector {
            role,
            engine_id,
            timeout_ms,
            max_pulls,
            injections,
            now_ms: 0,
            held: book.map("registry.pd.held", PerRequest),
            handles: book.map("registry.pd.handles", PerRequest),
            next_handle: 0,
            waiting_for_kv: book.queue("registry.pd.waiting_for_kv", PerRequest),
            pulls: book.map("registry.pd.pulls", PerRequest),
            orders: book.queue("registry.pd.orders", PerRequest),
            notices: book.queue("registry.pd.notices", PerRequest),
        }
    }

    pub fn set_role(&mut self, role: Role, engine_id: u32, timeout_ms: u64) {
        (self.role, self.engine_id, self.timeout_ms) = (role, engine_id, timeout_ms);
    }

    pub fn role(&self) -> Role {
        self.role
    }

    /// Prefill side: keeps a finished request's blocks for its transfer.
    pub fn hold(&mut self, sid: SeqId, rid: RequestId) {
        self.next_handle += 1;
        let handle = (u64::from(self.engine_id) << 48) | self.next_handle;
        self.handles.insert(handle, rid);
        let previous = self.held.insert(rid, Held { seq: sid, handle, since_ms: self.now_ms });
        assert!(previous.is_none(), "request {rid} held twice");
    }

    /// Whether request `rid`'s KV is held here (its id is still in use).
    pub fn holds(&self, rid: RequestId) -> bool {
        self.held.contains_key(&rid)
    }

    /// What the decode side needs to pull a held request's KV.
    pub fn params(&self, rid: RequestId, store: &RequestStore, kv: &KvManager) -> Option<TransferParams> {
        let h = self.held.get(&rid)?;
        let s = store.seqs.get(&h.seq)?;
        Some(TransferParams {
            engine_id: self.engine_id,
            request_id: rid,
            handle: h.handle,
            block_ids: kv.block_table(h.seq).to_vec(),
            num_tokens: s.num_prompt,
            first_token: *s.tokens.last().expect("a held request sampled its first token"),
        })
    }

    /// Prefill side: the decode side is done with (or gave up on) request `rid`'s KV.
    /// `decode_aborted` says which. Unknown requests are a no-op (returns false).
    pub fn release(&mut self, rid: RequestId, decode_aborted: bool, kv: &mut KvManager) -> bool {
        if decode_aborted && self.injections.on(Injection::PdPrefillHold) {
            // The bug: an abort on the decode side never reaches the blocks.
            return false;
        }
        let Some(h) = self.held.remove(&rid) else { return false };
        kv.free(h.seq);
        if !self.injections.on(Injection::PdHandles) {
            self.handles.remove(&h.handle);
        }
        true
    }

    /// The time, in ms since the shell started. Expires held transfers whose timeout passed;
    /// returns how many.
    pub fn advance_time(&mut self, now_ms: u64, kv: &mut KvManager) -> usize {
        self.now_ms = self.now_ms.max(now_ms);
        if self.injections.on(Injection::PdPrefillHold) {
            return 0;
        }
        let (timeout, now) = (self.timeout_ms, self.now_ms);
        let expired: Vec<RequestId> = self
            .held
            .keys()
            .copied()
            .filter(|r| self.held.get(r).is_some_and(|h| h.since_ms.saturating_add(timeout) <= now))
            .collect();
        for r in &expired {
            self.release(*r, false, kv);
        }
        expired.len()
    }

    /// Whether a held transfer may still free its blocks (a pull or its timeout is still to come).
    /// Overdue holds that were not released never will be: the scheduler then stops waiting.
    pub fn held_may_free(&self) -> bool {
        self.held.values().any(|h| h.since_ms.saturating_add(self.timeout_ms) > self.now_ms)
    }

    pub fn held_len(&self) -> usize {
        self.held.len()
    }

    /// Prefill side: the blocks of held request `rid` that a transport may read. Refuses a stale
    /// request or handle, and blocks that are not the request's.
    pub fn exportable(&self, rid: RequestId, handle: u64, blocks: &[BlockId], kv: &KvManager) -> Result<(), String> {
        let h = self
            .held
            .get(&rid)
            .filter(|h| h.handle == handle)
            .ok_or_else(|| format!("stale transfer: request {rid} holds no KV under handle {handle:#x}"))?;
        let table = kv.block_table(h.seq);
        match blocks.iter().find(|b| !table.contains(b)) {
            Some(b) => Err(format!(
                "block {b} is not one of request {rid}'s {} blocks (pool has {})",
                table.len(),
                kv.counts().total
            )),
            None => Ok(()),
        }
    }

    /// Decode side: a remote request's sequence waits for its prompt's KV.
    #[track_caller]
    pub fn wait_for_kv(&mut self, sid: SeqId) {
        self.waiting_for_kv.push_back(sid);
    }

    pub fn is_waiting_for_kv(&self, sid: SeqId) -> bool {
        self.waiting_for_kv.contains(&sid)
    }

    pub fn is_pulling(&self, rid: RequestId) -> bool {
        self.pulls.contains_key(&rid)
    }

    pub fn num_waiting_for_kv(&self) -> usize {
        self.waiting_for_kv.len()
    }

    /// Decode side, at the start of a step: allocates local blocks for requests waiting for
    /// remote KV and emits their pull orders (prefix-cache hits are not pulled). Returns the
    /// prefix-hit tokens, and the sequences that can never get room (`nothing_running`, no pull
    /// in flight) with the reason, for the engine to end.
    pub fn start_pulls(
        &mut self,
        store: &mut RequestStore,
        kv: &mut KvManager,
        nothing_running: bool,
    ) -> (u64, Vec<(SeqId, String)>) {
        let (mut hit_tokens, mut failed) = (0, Vec::new());
        let waiting: Vec<SeqId> = self.waiting_for_kv.iter().copied().collect();
        for sid in waiting {
            let Some(s) = store.seqs.get(&sid) else { continue };
            let rid = s.request;
            let Some(remote) = store.requests.get(&rid).and_then(|r| r.remote.clone()) else { continue };
            if remote.pulling {
                continue;
            }
            // The rest wait, in arrival order, for a pull to end.
            if self.pulls.len() >= self.max_pulls {
                break;
            }
            let n = remote.params.num_tokens;
            let hits = kv.prefix_hits(&s.tokens[..n], &[]);
            let start = hits.len() * kv.block_size();
            if kv.allocate(sid, &hits, start, n).is_err() {
                if nothing_running && self.pulls.is_empty() {
                    failed.push((sid, "KV cache exhausted: no room to pull the prompt's KV".to_string()));
                }
                continue;
            }
            store.seq_mut(sid).num_computed = start;
            hit_tokens += start as u64;
            let table = kv.block_table(sid);
            let order = PullOrder {
                request: rid,
                engine_id: remote.params.engine_id,
                handle: remote.params.handle,
                remote_blocks: remote.params.block_ids[hits.len()..].to_vec(),
                local_blocks: table[hits.len()..].to_vec(),
            };
            if let Some(r) = store.requests.get_mut(&rid) {
                r.cached_prompt_tokens = start as u32;
                if let Some(rem) = r.remote.as_mut() {
                    rem.pulling = true;
                }
            }
            self.pulls.insert(rid, order.clone());
            self.orders.push_back(order);
        }
        (hit_tokens, failed)
    }

    pub fn take_orders(&mut self) -> Vec<PullOrder> {
        self.orders.drain_all()
    }

    pub fn take_notices(&mut self) -> Vec<Notice> {
        self.notices.drain_all()
    }

    /// Decode side: the transport is done with `rid`'s pull: its order, if one was in flight.
    pub fn remove_pull(&mut self, rid: RequestId) -> Option<PullOrder> {
        self.pulls.remove(&rid)
    }

    /// Decode side: `sid` no longer waits for KV (its pull ended, whatever the outcome).
    pub fn done_waiting(&mut self, sid: SeqId) {
        self.waiting_for_kv.remove_item(&sid);
    }

    /// Decode side: tells the prefill side how a pull ended.
    pub fn notify(&mut self, order: &PullOrder, pulled: bool) {
        let (engine_id, request, handle) = (order.engine_id, order.request, order.handle);
        self.notices.push_back(if pulled {
            Notice::Pulled { engine_id, request, handle }
        } else {
            Notice::Aborted { engine_id, request, handle }
        });
    }

    /// Decode side: a remote request leaves before its KV arrived (abort, error).
    pub fn forget(&mut self, rid: RequestId, sid: SeqId, store: &RequestStore) {
        let was_waiting = self.waiting_for_kv.remove_item(&sid);
        let order = self.pulls.remove(&rid);
        let remote =
            store.requests.get(&rid).and_then(|r| r.remote.as_ref()).map(|r| (r.params.engine_id, r.params.handle));
        if let (true, Some((engine_id, handle))) = (was_waiting || order.is_some(), remote) {
            self.notices.push_back(Notice::Aborted { engine_id, request: rid, handle });
        }
    }
}
