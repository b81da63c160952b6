//! The scheduler: continuous batching under a token budget and a cap on running sequences.
//!
//! Each step: running sequences first, in arrival order, each taking what it still has to compute
//! (one token when decoding, a chunk of its prompt when prefilling) within the budget. When the KV
//! pool cannot grow a sequence, the newest running sequence is preempted by recompute: its blocks
//! go back and it returns to the front of the waiting queue. Only when nothing was preempted are
//! waiting sequences admitted, first come first served, starting from their prefix-cache hits; the
//! first that does not fit stops admission, so no request overtakes an earlier one.

use crate::engine::Engine;
use crate::kv_manager::{BlockCopy, SeqId};
use crate::request::FinishReason;

/// One sequence's share of a step: tokens `start..start + len`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub seq: SeqId,
    pub start: usize,
    pub len: usize,
    pub want_logits: bool,
}

#[derive(Debug, Default)]
pub struct Scheduled {
    pub chunks: Vec<Chunk>,
    pub copies: Vec<BlockCopy>,
}

impl Engine {
    pub(crate) fn schedule(&mut self) -> Scheduled {
        let mut out = Scheduled::default();
        let mut budget = self.config.max_num_batched_tokens;
        let mut preempted = false;
        let mut i = 0;
        // Bounded: each pass either advances `i` or removes one sequence from `running`.
        while i < self.running.len() && budget > 0 {
            let sid = *self.running.iter().nth(i).expect("index in range");
            let s = self.seqs.get(&sid).expect("running seq exists");
            let (start, len) = (
                s.num_computed,
                (s.tokens.len() - s.num_computed).min(budget),
            );
            match self.kv.allocate(sid, &[], start, start + len) {
                Ok(copies) => {
                    out.copies.extend(copies);
                    let want_logits = start + len == s.tokens.len();
                    out.chunks.push(Chunk {
                        seq: sid,
                        start,
                        len,
                        want_logits,
                    });
                    budget -= len;
                    i += 1;
                }
                Err(e) => {
                    preempted = true;
                    let victim = *self.running.back().expect("running is not empty");
                    if victim != sid {
                        self.preempt(victim);
                    } else if self.running.len() == 1 {
                        // Alone and still no room: it can never fit.
                        let req = self.seqs.get(&sid).expect("seq").request;
                        if let Some(r) = self.requests.get_mut(&req) {
                            r.error = Some(format!(
                                "KV cache too small: the sequence needs {} more blocks, {} are free",
                                e.needed, e.available
                            ));
                        }
                        self.finish_seq(sid, FinishReason::Error);
                    } else {
                        self.preempt(sid);
                    }
                }
            }
        }
        if preempted {
            return out;
        }
        while budget > 0 {
            let Some(&sid) = self.waiting.front() else {
                break;
            };
            let s = self.seqs.get(&sid).expect("waiting seq exists");
            let req = self.requests.get(&s.request);
            let unforked_n = req.filter(|r| !r.forked).map_or(1, |r| r.params.n as usize);
            if self.running.len() + unforked_n > self.config.max_num_seqs {
                break;
            }
            let hits = self.kv.prefix_hits(&s.tokens, &[]);
            let start = hits.len() * self.kv.block_size();
            let len = (s.tokens.len() - start).min(budget);
            let want_logits = start + len == s.tokens.len();
            match self.kv.allocate(sid, &hits, start, start + len) {
                Ok(copies) => {
                    out.copies.extend(copies);
                    let is_prompt = s.num_prompt == s.tokens.len();
                    let request = s.request;
                    self.seqs.get_mut(&sid).expect("seq").num_computed = start;
                    if is_prompt {
                        self.counters.prefix_cache_hit_tokens += start as u64;
                        if let Some(r) = self.requests.get_mut(&request) {
                            r.cached_prompt_tokens = r.cached_prompt_tokens.max(start as u32);
                        }
                    }
                    self.waiting.pop_front();
                    self.running.push_back(sid);
                    out.chunks.push(Chunk {
                        seq: sid,
                        start,
                        len,
                        want_logits,
                    });
                    budget -= len;
                }
                Err(e) => {
                    if self.running.is_empty() && out.chunks.is_empty() {
                        // Nothing runs that could ever free a block: waiting would never end.
                        let request = s.request;
                        if let Some(r) = self.requests.get_mut(&request) {
                            r.error = Some(format!(
                                "KV cache exhausted: the prompt needs {} blocks, {} are free and no sequence is running",
                                e.needed, e.available
                            ));
                        }
                        self.finish_seq(sid, FinishReason::Error);
                        continue;
                    }
                    break;
                }
            }
        }
        out
    }

    /// Preemption by recompute: the sequence's blocks go back to the pool (its full blocks stay
    /// cached for the recompute to hit) and it waits at the front of the queue.
    fn preempt(&mut self, sid: SeqId) {
        self.kv.free(sid);
        self.running.remove_item(&sid);
        let s = self.seqs.get_mut(&sid).expect("seq");
        s.num_computed = 0;
        s.preemptions += 1;
        self.waiting.push_front(sid);
        self.counters.preemptions += 1;
    }
}
