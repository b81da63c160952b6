//! The scheduler: continuous batching under a token budget and a cap on running sequences.
//!
//! Each step: running sequences first, in arrival order, each taking what it still has to compute
//! (one token when decoding, a chunk of its prompt when prefilling) within the budget. When the KV
//! pool cannot grow a sequence, the newest running sequence is preempted by recompute: its blocks
//! go back and it returns to the front of the waiting queue. Only when nothing was preempted are
//! waiting sequences admitted, first come first served, starting from their prefix-cache hits; the
//! first that does not fit stops admission, so no request overtakes an earlier one.

use std::sync::Arc;

use crate::engine::{Engine, ReqState};
use crate::kv_manager::{BlockCopy, SeqId};
use crate::multimodal::image::PixelTensor;
use crate::request::FinishReason;
use crate::request::RequestId;

/// One sequence's share of a step: tokens `start..start + len`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub seq: SeqId,
    pub start: usize,
    pub len: usize,
    pub want_logits: bool,
}

/// Whether a waiting request's images are ready for its prefill.
enum Images {
    Ready,
    /// At least one image was encoded in this step.
    EncodedNow,
    /// The step's encoder budget is spent.
    StepBudgetSpent,
    /// The encoder cache cannot make room (every entry held).
    NoRoom,
    /// Encoding failed; the request ended with an error.
    Failed,
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
            let (start, len) = (s.num_computed, (s.tokens.len() - s.num_computed).min(budget));
            match self.kv.allocate(sid, &[], start, start + len) {
                Ok(copies) => {
                    out.copies.extend(copies);
                    let want_logits = start + len == s.tokens.len();
                    out.chunks.push(Chunk { seq: sid, start, len, want_logits });
                    budget -= len;
                    i += 1;
                }
                Err(e) => {
                    preempted = true;
                    let victim = *self.running.back().expect("running is not empty");
                    if victim != sid {
                        self.preempt(victim);
                    } else if self.running.len() == 1 && !self.held_may_free() {
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
        let mut encoder_budget = self.config.max_encoder_tokens_per_step;
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
            let request = s.request;
            let extra = req.map(ReqState::extra_keys).unwrap_or_default();
            let hits = self.kv.prefix_hits(&s.tokens, &extra);
            let start = hits.len() * self.kv.block_size();
            match self.ensure_images(request, start, &mut encoder_budget) {
                Images::Ready => {}
                // Encoding takes its step: the request prefills in a later one (FCFS holds).
                Images::EncodedNow | Images::StepBudgetSpent => break,
                Images::NoRoom if self.running.is_empty() && out.chunks.is_empty() && !self.held_may_free() => {
                    if let Some(r) = self.requests.get_mut(&request) {
                        r.error = Some("encoder cache exhausted: every entry is held and nothing is running".into());
                    }
                    self.finish_seq(sid, FinishReason::Error);
                    continue;
                }
                Images::NoRoom => break,
                Images::Failed => continue,
            }
            let s = self.seqs.get(&sid).expect("waiting seq exists");
            let len = (s.tokens.len() - start).min(budget);
            let want_logits = start + len == s.tokens.len();
            match self.kv.allocate(sid, &hits, start, start + len) {
                Ok(copies) => {
                    out.copies.extend(copies);
                    let is_prompt = s.num_prompt == s.tokens.len();
                    self.seqs.get_mut(&sid).expect("seq").num_computed = start;
                    if is_prompt {
                        self.counters.prefix_cache_hit_tokens += start as u64;
                        if let Some(r) = self.requests.get_mut(&request) {
                            r.cached_prompt_tokens = r.cached_prompt_tokens.max(start as u32);
                        }
                    }
                    self.waiting.pop_front();
                    self.running.push_back(sid);
                    out.chunks.push(Chunk { seq: sid, start, len, want_logits });
                    budget -= len;
                }
                Err(e) => {
                    if self.running.is_empty() && out.chunks.is_empty() && !self.held_may_free() {
                        // Nothing runs that could ever free a block: waiting would never end.
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

    /// Makes sure request `rid` holds the encoder outputs of every image with placeholders at or
    /// after `from_pos`: a cache hit takes a reference; a miss encodes the image now, within the
    /// step's encoder budget and after making room in the cache.
    fn ensure_images(&mut self, rid: RequestId, from_pos: usize, budget: &mut usize) -> Images {
        let Some(req) = self.requests.get(&rid) else { return Images::Ready };
        let needed: Vec<(u64, usize, Arc<PixelTensor>)> = req
            .images
            .iter()
            .filter(|i| i.start + i.len > from_pos)
            .map(|i| (i.hash, i.len, Arc::clone(&i.pixels)))
            .collect();
        let mut encoded = false;
        for (hash, len, pixels) in needed {
            if self.encoder_cache.holds(hash, rid) {
                continue;
            }
            if self.encoder_cache.acquire(hash, rid) {
                self.counters.encoder_cache_hits += 1;
                continue;
            }
            if len > *budget {
                return if encoded { Images::EncodedNow } else { Images::StepBudgetSpent };
            }
            if !self.encoder_cache.make_room(len) {
                return if encoded { Images::EncodedNow } else { Images::NoRoom };
            }
            match self.backend.encode_image(&pixels) {
                Ok(embeds) => {
                    self.encoder_cache.insert(hash, embeds, len, rid);
                    self.counters.encoder_runs += 1;
                    *budget -= len;
                    encoded = true;
                }
                Err(e) => {
                    let first = self.requests.get_mut(&rid).map(|r| {
                        r.error = Some(format!("vision encoder: {e}"));
                        r.seqs.clone()
                    });
                    for sid in first.unwrap_or_default() {
                        if self.seqs.get(&sid).is_some_and(|s| s.finished.is_none()) {
                            self.finish_seq(sid, FinishReason::Error);
                        }
                    }
                    return Images::Failed;
                }
            }
        }
        if encoded {
            Images::EncodedNow
        } else {
            Images::Ready
        }
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
