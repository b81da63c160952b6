//! The scheduler: continuous batching under a token budget and a cap on running sequences.
//!
//! It owns the waiting and running queues and decides, each step, what runs; it computes nothing
//! and ends nothing. Each step: running sequences first, in arrival order, each taking what it
//! still has to compute (one token when decoding, a chunk of its prompt when prefilling) within
//! the budget. When the KV pool cannot grow a sequence, the newest running sequence is preempted
//! by recompute: its blocks go back and it returns to the front of the waiting queue. Only when
//! nothing was preempted are waiting sequences admitted, first come first served, starting from
//! their prefix-cache hits; the first that does not fit stops admission, so no request overtakes
//! an earlier one. A waiting request's images are looked up in the encoder cache; a miss becomes
//! an encode job (its room reserved), and encoding takes its own step before the prefill.
//!
//! A sequence that can never be served (alone and still no room; nothing running that could free
//! a block or an encoder cache entry) leaves the queues and is reported through `on_error` at
//! once, so that what it held comes back before the next request is considered.

use std::sync::Arc;

use crate::encoder_cache::EncoderCache;
use crate::kv_manager::{BlockCopy, KvManager, SeqId};
use crate::multimodal::image::PixelTensor;
use crate::registry::{MetricKind, Registries, TrackedQueue};
use crate::request::RequestId;
use crate::store::{ReqState, RequestStore};

/// One sequence's share of a step: tokens `start..start + len`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub seq: SeqId,
    pub start: usize,
    pub len: usize,
    pub want_logits: bool,
}

/// An image to encode this step, its room in the encoder cache already reserved.
#[derive(Debug, Clone)]
pub(crate) struct EncodeJob {
    pub hash: u64,
    pub pixels: Arc<PixelTensor>,
}

/// What a step runs, and what scheduling it counted.
#[derive(Debug, Default)]
pub(crate) struct SchedulerOutput {
    pub chunks: Vec<Chunk>,
    pub copies: Vec<BlockCopy>,
    pub encode: Vec<EncodeJob>,
    pub preemptions: u64,
    pub prefix_hit_tokens: u64,
    pub encoder_cache_hits: u64,
}

/// Whether a waiting request's images are ready for its prefill.
enum Images {
    Ready,
    /// At least one image is to be encoded in this step.
    EncodeNow,
    /// The step's encoder budget is spent.
    StepBudgetSpent,
    /// The encoder cache cannot make room (every entry held).
    NoRoom,
}

/// What scheduling reads and changes besides the queues.
pub(crate) struct SchedCtx<'a> {
    pub store: &'a mut RequestStore,
    pub kv: &'a mut KvManager,
    pub encoder: &'a mut EncoderCache,
    /// KV held for a P/D transfer may still be freed (by a pull or a timeout): waiting is not
    /// hopeless even with nothing running.
    pub held_may_free: bool,
}

/// A sequence that can never be served, with the reason; the engine ends it at once.
pub(crate) type OnError<'e> = dyn FnMut(&mut SchedCtx, SeqId, String) + 'e;

#[derive(Debug)]
pub(crate) struct Scheduler {
    waiting: TrackedQueue<SeqId>,
    running: TrackedQueue<SeqId>,
    max_num_batched_tokens: usize,
    max_num_seqs: usize,
    max_encoder_tokens_per_step: usize,
}

impl Scheduler {
    pub fn new(
        max_num_batched_tokens: usize,
        max_num_seqs: usize,
        max_encoder_tokens: usize,
        book: &mut Registries,
    ) -> Self {
        Scheduler {
            waiting: book.queue("registry.waiting", MetricKind::PerRequest),
            running: book.queue("registry.running", MetricKind::PerRequest),
            max_num_batched_tokens,
            max_num_seqs,
            max_encoder_tokens_per_step: max_encoder_tokens,
        }
    }

    #[track_caller]
    pub fn add(&mut self, sid: SeqId) {
        self.waiting.push_back(sid);
    }

    /// A sequence that starts running without being scheduled (a forked child, a pulled request).
    #[track_caller]
    pub fn add_running(&mut self, sid: SeqId) {
        self.running.push_back(sid);
    }

    /// Takes `sid` out of both queues (it ended).
    pub fn remove(&mut self, sid: SeqId) {
        self.running.remove_item(&sid);
        self.waiting.remove_item(&sid);
    }

    pub fn is_waiting(&self, sid: SeqId) -> bool {
        self.waiting.contains(&sid)
    }

    pub fn has_running(&self) -> bool {
        !self.running.is_empty()
    }

    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    pub fn num_queued(&self) -> usize {
        self.waiting.len() + self.running.len()
    }

    /// Decides one step: chunks to compute, block copies, encode jobs. Reports sequences that can
    /// never be served through `on_error` as it finds them.
    pub fn schedule(&mut self, cx: &mut SchedCtx, on_error: &mut OnError) -> SchedulerOutput {
        let mut out = SchedulerOutput::default();
        let mut budget = self.max_num_batched_tokens;
        // A step that had to preempt admits nothing new: the room it freed goes to what runs.
        if !self.schedule_running(cx, on_error, &mut out, &mut budget) {
            self.admit_waiting(cx, on_error, &mut out, budget);
        }
        out
    }

    /// The running sequences' next chunks, in order, within `budget`; a sequence that finds no
    /// room preempts the newest (itself last). Returns whether anything was preempted.
    fn schedule_running(
        &mut self,
        cx: &mut SchedCtx,
        on_error: &mut OnError,
        out: &mut SchedulerOutput,
        budget: &mut usize,
    ) -> bool {
        let mut preempted = false;
        let mut i = 0;
        // Bounded: each pass either advances `i` or removes one sequence from `running`.
        while i < self.running.len() && *budget > 0 {
            let sid = *self.running.iter().nth(i).expect("index in range");
            let s = cx.store.seq(sid);
            let (start, len) = (s.num_computed, (s.tokens.len() - s.num_computed).min(*budget));
            match cx.kv.allocate(sid, &[], start, start + len) {
                Ok(copies) => {
                    out.copies.extend(copies);
                    let want_logits = start + len == s.tokens.len();
                    out.chunks.push(Chunk { seq: sid, start, len, want_logits });
                    *budget -= len;
                    i += 1;
                }
                Err(e) => {
                    preempted = true;
                    let victim = *self.running.back().expect("running is not empty");
                    if victim != sid {
                        self.preempt(victim, cx, out);
                    } else if self.running.len() == 1 && !cx.held_may_free {
                        // Alone and still no room: it can never fit.
                        self.remove(sid);
                        let why = format!(
                            "KV cache too small: the sequence needs {} more blocks, {} are free",
                            e.needed, e.available
                        );
                        on_error(cx, sid, why);
                    } else {
                        self.preempt(sid, cx, out);
                    }
                }
            }
        }
        preempted
    }

    /// Admits waiting sequences first come, first served, while `budget`, the sequence limit, the
    /// encoder's budget and the KV cache allow; a request that can never be served is reported.
    fn admit_waiting(
        &mut self,
        cx: &mut SchedCtx,
        on_error: &mut OnError,
        out: &mut SchedulerOutput,
        mut budget: usize,
    ) {
        let mut encoder_budget = self.max_encoder_tokens_per_step;
        while budget > 0 {
            let Some(&sid) = self.waiting.front() else {
                break;
            };
            let s = cx.store.seq(sid);
            let req = cx.store.requests.get(&s.request);
            let unforked_n = req.filter(|r| !r.forked).map_or(1, |r| r.params.n as usize);
            if self.running.len() + unforked_n > self.max_num_seqs {
                break;
            }
            let request = s.request;
            let extra = req.map(ReqState::extra_keys).unwrap_or_default();
            let hits = cx.kv.prefix_hits(&s.tokens, &extra);
            let start = hits.len() * cx.kv.block_size();
            let hopeless = self.running.is_empty() && out.chunks.is_empty() && !cx.held_may_free;
            match self.ensure_images(request, start, &mut encoder_budget, cx, out) {
                Images::Ready => {}
                // Encoding takes its step: the request prefills in a later one (FCFS holds).
                Images::EncodeNow | Images::StepBudgetSpent => break,
                Images::NoRoom if hopeless => {
                    self.remove(sid);
                    on_error(cx, sid, "encoder cache exhausted: every entry is held and nothing is running".into());
                    continue;
                }
                Images::NoRoom => break,
            }
            let s = cx.store.seq(sid);
            let len = (s.tokens.len() - start).min(budget);
            let want_logits = start + len == s.tokens.len();
            match cx.kv.allocate(sid, &hits, start, start + len) {
                Ok(copies) => {
                    out.copies.extend(copies);
                    let is_prompt = s.num_prompt == s.tokens.len();
                    cx.store.seq_mut(sid).num_computed = start;
                    if is_prompt {
                        out.prefix_hit_tokens += start as u64;
                        if let Some(r) = cx.store.requests.get_mut(&request) {
                            r.cached_prompt_tokens = r.cached_prompt_tokens.max(start as u32);
                        }
                    }
                    self.waiting.pop_front();
                    self.running.push_back(sid);
                    out.chunks.push(Chunk { seq: sid, start, len, want_logits });
                    budget -= len;
                }
                Err(e) if hopeless => {
                    // Nothing runs that could ever free a block: waiting would never end.
                    self.remove(sid);
                    let why = format!(
                        "KV cache exhausted: the prompt needs {} blocks, {} are free and no sequence is running",
                        e.needed, e.available
                    );
                    on_error(cx, sid, why);
                    continue;
                }
                Err(_) => break,
            }
        }
    }

    /// Makes sure request `rid` holds the encoder outputs of every image with placeholders at or
    /// after `from_pos`: a cache hit takes a reference; a miss reserves the entry's room (after
    /// evicting freed entries) and becomes an encode job, within the step's encoder budget.
    fn ensure_images(
        &mut self,
        rid: RequestId,
        from_pos: usize,
        budget: &mut usize,
        cx: &mut SchedCtx,
        out: &mut SchedulerOutput,
    ) -> Images {
        let Some(req) = cx.store.requests.get(&rid) else { return Images::Ready };
        let needed: Vec<(u64, usize, Arc<PixelTensor>)> = req
            .images
            .iter()
            .filter(|i| i.start + i.len > from_pos)
            .map(|i| (i.hash, i.len, Arc::clone(&i.pixels)))
            .collect();
        let mut encoding = false;
        for (hash, len, pixels) in needed {
            if cx.encoder.holds(hash, rid) {
                continue;
            }
            if cx.encoder.acquire(hash, rid) {
                out.encoder_cache_hits += 1;
                continue;
            }
            if len > *budget {
                return if encoding { Images::EncodeNow } else { Images::StepBudgetSpent };
            }
            if !cx.encoder.make_room(len) {
                return if encoding { Images::EncodeNow } else { Images::NoRoom };
            }
            cx.encoder.reserve(hash, len, rid);
            out.encode.push(EncodeJob { hash, pixels });
            *budget -= len;
            encoding = true;
        }
        if encoding {
            Images::EncodeNow
        } else {
            Images::Ready
        }
    }

    /// Preemption by recompute: the sequence's blocks go back to the pool (its full blocks stay
    /// cached for the recompute to hit) and it waits at the front of the queue.
    fn preempt(&mut self, sid: SeqId, cx: &mut SchedCtx, out: &mut SchedulerOutput) {
        cx.kv.free(sid);
        self.running.remove_item(&sid);
        let s = cx.store.seq_mut(sid);
        s.num_computed = 0;
        s.preemptions += 1;
        self.waiting.push_front(sid);
        out.preemptions += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::SamplingParams;

    struct World {
        book: Registries,
        store: RequestStore,
        kv: KvManager,
        encoder: EncoderCache,
        sched: Scheduler,
    }

    /// A world with `blocks` KV blocks of 4 tokens and a step budget of `budget` tokens.
    fn world(blocks: usize, budget: usize, max_seqs: usize) -> World {
        let mut book = Registries::new();
        let store = RequestStore::new(&mut book);
        let kv = KvManager::new(blocks, 4, true, &mut book);
        let encoder = EncoderCache::new(64, 4, &mut book);
        let sched = Scheduler::new(budget, max_seqs, 64, &mut book);
        World { book, store, kv, encoder, sched }
    }

    impl World {
        /// Adds request `id` with a prompt of `len` distinct tokens and `n` sequences.
        fn add(&mut self, id: u64, len: usize, n: u32) -> SeqId {
            let prompt: Vec<u32> = (0..len as u32).map(|t| t + 1000 * id as u32).collect();
            let sid = self.store.new_seq(id, 0, prompt.clone(), id);
            let params = SamplingParams { n, ..SamplingParams::default() };
            self.store.requests.insert(id, ReqState::new(params, id, prompt, sid, Vec::new()));
            self.sched.add(sid);
            sid
        }

        fn step(&mut self) -> (SchedulerOutput, Vec<(SeqId, String)>) {
            let mut errors = Vec::new();
            let mut cx =
                SchedCtx { store: &mut self.store, kv: &mut self.kv, encoder: &mut self.encoder, held_may_free: false };
            let out = self.sched.schedule(&mut cx, &mut |_, sid, why| errors.push((sid, why)));
            (out, errors)
        }

        /// Marks every scheduled chunk computed, as the model runner and output processor would.
        fn compute(&mut self, out: &SchedulerOutput) {
            for c in &out.chunks {
                self.store.seq_mut(c.seq).num_computed = c.start + c.len;
                if c.want_logits {
                    self.store.seq_mut(c.seq).tokens.push(7);
                }
            }
        }
    }

    #[test]
    fn prompts_are_chunked_under_the_token_budget_first_come_first_served() {
        let mut w = world(64, 10, 8);
        let a = w.add(1, 7, 1);
        let b = w.add(2, 7, 1);
        let (out, errors) = w.step();
        assert!(errors.is_empty());
        // a whole, then 3 of b's 7 tokens (budget 10).
        assert_eq!(
            out.chunks,
            vec![
                Chunk { seq: a, start: 0, len: 7, want_logits: true },
                Chunk { seq: b, start: 0, len: 3, want_logits: false },
            ]
        );
        w.compute(&out);
        let (out, _) = w.step();
        // Running first: a decodes one token, b finishes its prompt.
        assert_eq!(out.chunks[0], Chunk { seq: a, start: 7, len: 1, want_logits: true });
        assert_eq!(out.chunks[1], Chunk { seq: b, start: 3, len: 4, want_logits: true });
    }

    #[test]
    fn the_newest_running_sequence_is_preempted_when_the_pool_runs_dry() {
        // 4 blocks of 4 tokens: two 8-token prompts fill the pool; the next decode needs a block.
        let mut w = world(4, 64, 8);
        let a = w.add(1, 8, 1);
        let b = w.add(2, 8, 1);
        let (out, _) = w.step();
        assert_eq!(out.chunks.len(), 2);
        w.compute(&out);
        let (out, errors) = w.step();
        assert!(errors.is_empty());
        assert_eq!(out.preemptions, 1);
        assert!(w.sched.is_waiting(b), "the newest went back to waiting");
        assert_eq!(w.store.seq(b).num_computed, 0, "preempted by recompute");
        assert_eq!(out.chunks, vec![Chunk { seq: a, start: 8, len: 1, want_logits: true }]);
    }

    #[test]
    fn admission_respects_max_num_seqs_counting_every_sequence_of_an_unforked_request() {
        let mut w = world(64, 64, 2);
        w.add(1, 4, 2);
        w.add(2, 4, 2);
        let (out, _) = w.step();
        // The first runs as one sequence until it forks; the second would need 2 more: 1 + 2 > 2.
        assert_eq!(out.chunks.len(), 1);
    }

    #[test]
    fn a_prompt_larger_than_the_pool_with_nothing_running_is_reported_not_waited_on() {
        let mut w = world(2, 64, 8);
        let a = w.add(1, 12, 1);
        let (out, errors) = w.step();
        assert!(out.chunks.is_empty());
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].0, a);
        assert!(errors[0].1.contains("KV cache exhausted"), "{}", errors[0].1);
        assert!(!w.sched.has_work(), "it left the queues");
        let _ = &w.book;
    }
}
