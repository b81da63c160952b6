//! The engine's prefill/decode surface: thin calls into its KV connector (`pd::connector`), plus
//! what needs the other components (the request store to admit a remote request, the model runner
//! to read and write KV, the output processor to end a request whose pull failed).

use rand_core::RngCore;

use super::Engine;
use crate::admission;
use crate::block_pool::BlockId;
use crate::error::{EngineError, Result};
use crate::pd::{Notice, PullOrder, Role, TransferParams};
use crate::request::{FinishReason, Request, RequestId};
use crate::store::Remote;
use crate::store::ReqState;

impl Engine {
    /// Prefill side: the decode side is done with (or gave up on) request `rid`'s KV.
    /// `decode_aborted` says which. Unknown requests are a no-op (returns false).
    pub fn release_transfer(&mut self, rid: RequestId, decode_aborted: bool) -> bool {
        self.conn.release(rid, decode_aborted, &mut self.kv)
    }

    /// Tells the core the time, in ms since the shell started. Expires held transfers whose
    /// timeout passed; returns how many.
    pub fn advance_time(&mut self, now_ms: u64) -> usize {
        self.conn.advance_time(now_ms, &mut self.kv)
    }

    /// Transfers held on the prefill side.
    pub fn held_transfers(&self) -> usize {
        self.conn.held_len()
    }

    /// Prefill side: the KV of `blocks` of held request `rid`, for a transport. Refuses a stale
    /// request or handle, and blocks that are not the request's.
    pub fn export_kv(&self, rid: RequestId, handle: u64, blocks: &[BlockId]) -> std::result::Result<Vec<f32>, String> {
        self.conn.exportable(rid, handle, blocks, &self.kv)?;
        self.runner.read_kv(blocks).map_err(|e| e.to_string())
    }

    /// Decode side: adds a request whose prompt KV is on a prefill engine.
    pub fn add_remote_request(&mut self, r: Request, params: TransferParams) -> Result<()> {
        let bad = |reason: String| Err(EngineError::InvalidRequest { id: r.id, reason });
        if self.config.role != Role::Decode {
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
        let state = admission::State { asleep: self.asleep, id_in_use: self.id_in_use(r.id) };
        admission::validate(&self.limits(), state, &r)?;
        let seed = admission::request_seed(self.config.seed, &r);
        let mut tokens = r.prompt.clone();
        tokens.push(params.first_token);
        let sid = self.store.new_seq(r.id, 0, tokens, seed);
        let s = self.store.seq_mut(sid);
        s.num_prompt = r.prompt.len();
        if r.params.temperature > 0.0 {
            // The prefill side made this sequence's first draw.
            let _ = s.rng.next_u64();
        }
        let mut req = ReqState::new(r.params, seed, r.prompt, sid, Vec::new());
        req.remote = Some(Remote { params, pulling: false });
        req.forked = true;
        self.store.requests.insert(r.id, req);
        self.conn.wait_for_kv(sid);
        self.counters.requests_added += 1;
        Ok(())
    }

    /// Decode side, at the start of a step: local blocks for requests waiting for remote KV, and
    /// their pull orders. A request that can never get room ends with an error.
    pub(super) fn start_pulls(&mut self) {
        let nothing_running = !self.scheduler.has_running();
        let (hits, failed) = self.conn.start_pulls(&mut self.store, &mut self.kv, nothing_running);
        self.counters.prefix_cache_hit_tokens += hits;
        for (sid, why) in failed {
            let rid = self.store.seq(sid).request;
            self.store.set_error(rid, why);
            let (output, mut cx) = self.parts();
            output.finish_seq(&mut cx, sid, FinishReason::Error);
        }
        self.sync_queues();
    }

    /// Decode side: pull orders for the transport.
    pub fn take_pull_orders(&mut self) -> Vec<PullOrder> {
        self.conn.take_orders()
    }

    /// Decode side: the transport finished pulling `rid`'s KV (or failed). A request that ended
    /// meanwhile (aborted) is a no-op that returns false.
    pub fn pull_done(&mut self, rid: RequestId, result: std::result::Result<Vec<f32>, String>) -> bool {
        let Some(order) = self.conn.remove_pull(rid) else { return false };
        let Some(sid) = self.store.requests.get(&rid).map(|r| r.seqs[0]) else { return false };
        let written =
            result.and_then(|data| self.runner.write_kv(&order.local_blocks, &data).map_err(|e| e.to_string()));
        self.conn.done_waiting(sid);
        match written {
            Ok(()) => {
                let s = self.store.seq_mut(sid);
                s.num_computed = s.num_prompt;
                let tokens = std::mem::take(&mut s.tokens);
                self.kv.publish(sid, &tokens, tokens.len() - 1, &[]);
                self.store.seq_mut(sid).tokens = tokens;
                self.scheduler.add_running(sid);
                self.conn.notify(&order, true);
            }
            Err(e) => {
                self.store.set_error(rid, format!("KV pull failed: {e}"));
                self.conn.notify(&order, false);
                let (output, mut cx) = self.parts();
                output.finish_seq(&mut cx, sid, FinishReason::Error);
                self.sync_queues();
            }
        }
        true
    }

    /// Decode side: notices for the prefill side, to forward.
    pub fn take_notices(&mut self) -> Vec<Notice> {
        self.conn.take_notices()
    }
}
