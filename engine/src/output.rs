//! The output processor: what happens to a step's logits, and how sequences and requests end.
//!
//! After the model runner computes a step, `apply` records each chunk's computed tokens (and
//! publishes its full blocks to the prefix cache), samples where logits came back, forks an n>1
//! request into n sequences once its prompt is prefilled, and applies the stop rules (EOS, stop
//! tokens, max_tokens, the model's length). A sequence ends through `finish_seq`: its blocks go
//! back (or, on a prefill engine, are held for the decode side), and its request ends when its
//! last sequence does: `finalize` emits the request's one output and forgets the request, its
//! sequences and its encoder cache references. `abort` ends a request at whatever stage it is.
//!
//! Sequences that ended or started here leave or join the scheduler's queues when the engine
//! takes `ended` and `started` after each call.

use crate::encoder_cache::EncoderCache;
use crate::inject::{Injection, Injections};
use crate::kv_manager::{KvManager, SeqId};
use crate::metrics::Counters;
use crate::model::backend::{Logits, RowSampling};
use crate::pd::{KvConnector, Role};
use crate::plant::Garden;
use crate::registry::{MetricKind, Registries, TrackedQueue};
use crate::request::{AbortOutcome, FinishReason, RequestId, RequestOutput, SamplingParams, SeqOutput};
use crate::sampler;
use crate::scheduler::Chunk;
use crate::store::{ReqState, RequestStore};
use crate::tokenizer::EOS;

/// What ending a sequence touches.
pub(crate) struct Ctx<'a> {
    pub store: &'a mut RequestStore,
    pub kv: &'a mut KvManager,
    pub encoder: &'a mut EncoderCache,
    pub conn: &'a mut KvConnector,
    pub counters: &'a mut Counters,
}

#[derive(Debug)]
pub(crate) struct OutputProcessor {
    /// Outputs of requests that ended, until the step returns them.
    outputs: TrackedQueue<RequestOutput>,
    /// Sequences that ended since the engine last took them (they leave the queues).
    ended: Vec<SeqId>,
    /// Forked sequences that start running (they join the running queue).
    started: Vec<SeqId>,
    injections: Injections,
    max_model_len: usize,
    /// Written only by the `untracked-heap` injection: a history that no registry counts.
    history: Vec<Vec<u32>>,
    /// Ids of the requests that ended since the last step began: an abort of one of them is
    /// answered "already finished". Each step takes the set (`take_finished_ids`); the
    /// `id-set-never-drained` injection never does. Unordered: only membership is asked.
    finished_ids: std::collections::HashSet<RequestId>,
    /// The plants on (must-pass caches; plant.rs), fed each request that ends.
    garden: Garden,
}

impl OutputProcessor {
    pub fn new(injections: Injections, max_model_len: usize, book: &mut Registries) -> Self {
        OutputProcessor {
            outputs: book.queue("registry.pending_outputs", MetricKind::PerRequest),
            ended: Vec::new(),
            started: Vec::new(),
            garden: Garden::new(injections.plants()),
            injections,
            max_model_len,
            history: Vec::new(),
            finished_ids: Default::default(),
        }
    }

    /// A step begins: the ids of the requests that ended before it are handed off (with
    /// `id-set-never-drained`, kept).
    pub fn take_finished_ids(&mut self) {
        if !self.injections.on(Injection::IdSetNeverDrained) {
            drop(std::mem::take(&mut self.finished_ids));
        }
    }

    /// The shell's epoch reaches the plants.
    pub fn set_epoch(&mut self, epoch: u64) {
        self.garden.epoch(epoch);
    }

    pub fn has_pending(&self) -> bool {
        !self.outputs.is_empty()
    }

    pub fn drain(&mut self) -> Vec<RequestOutput> {
        self.outputs.drain_all()
    }

    /// The sequences that ended and the ones that started since the last call.
    pub fn take_changes(&mut self) -> (Vec<SeqId>, Vec<SeqId>) {
        (std::mem::take(&mut self.ended), std::mem::take(&mut self.started))
    }

    /// Records computed tokens, samples where logits came back, forks n>1 requests after their
    /// prompt, and finishes sequences that stop.
    pub fn apply(&mut self, cx: &mut Ctx, chunks: &[Chunk], logits: Vec<Logits>, sampling: &[RowSampling]) {
        let mut logits = logits.into_iter();
        for (i, c) in chunks.iter().enumerate() {
            let plan = sampling.get(i).copied().unwrap_or(RowSampling::Row);
            let request = cx.store.seq(c.seq).request;
            let extra = cx.store.requests.get(&request).map(ReqState::extra_keys).unwrap_or_default();
            let s = cx.store.seq_mut(c.seq);
            s.num_computed += c.len;
            if s.num_computed <= s.num_prompt {
                cx.counters.prompt_tokens_computed += c.len as u64;
            }
            let num_computed = s.num_computed;
            let tokens = std::mem::take(&mut s.tokens);
            cx.kv.publish(c.seq, &tokens, num_computed, &extra);
            cx.store.seq_mut(c.seq).tokens = tokens;
            if !c.want_logits {
                continue;
            }
            let row = logits.next().expect("one logits row per chunk wanting it");
            let Some(req) = cx.store.requests.get(&request) else {
                // An orphan (n-abort-orphans): it still samples and runs to its end.
                self.sample_and_check(cx, c.seq, &row, plan, None);
                continue;
            };
            if req.forked {
                self.sample_and_check(cx, c.seq, &row, plan, Some(request));
                continue;
            }
            let (n, seed) = (req.params.n, req.seed);
            let parent_tokens = cx.store.seq(c.seq).tokens.clone();
            let mut children = Vec::new();
            for i in 1..n {
                let child = cx.store.new_seq(request, i, parent_tokens.clone(), seed);
                cx.store.seq_mut(child).num_computed = num_computed;
                cx.kv.fork(c.seq, child);
                children.push(child);
            }
            let req = cx.store.requests.get_mut(&request).expect("request");
            req.forked = true;
            req.seqs.extend(children.iter().copied());
            self.sample_and_check(cx, c.seq, &row, plan, Some(request));
            for child in children {
                self.started.push(child);
                self.sample_and_check(cx, child, &row, RowSampling::Row, Some(request));
            }
        }
    }

    /// Samples sequence `sid`'s next token from its chunk's answer: the token a backend sampled
    /// by the plan, or the row, with the draw the plan already took or one taken now.
    fn sample_and_check(
        &mut self,
        cx: &mut Ctx,
        sid: SeqId,
        logits: &Logits,
        plan: RowSampling,
        request: Option<RequestId>,
    ) {
        let params = match request.and_then(|r| cx.store.requests.get(&r)) {
            Some(r) => r.params.clone(),
            None => SamplingParams { ignore_eos: true, ..SamplingParams::default() },
        };
        let s = cx.store.seq_mut(sid);
        let tok = match (logits, plan) {
            (Logits::Token(id), _) => {
                debug_assert_ne!(plan, RowSampling::Row, "a token came back for a row the plan kept");
                *id
            }
            (Logits::Row(row), RowSampling::Draw(d)) => sampler::sample_drawn(row, &params, d.u),
            (Logits::Row(row), _) => sampler::sample(row, &params, &mut s.rng),
        };
        s.tokens.push(tok);
        cx.counters.tokens_generated += 1;
        let generated = s.tokens.len() - s.num_prompt;
        let reason = if (!params.ignore_eos && tok == EOS) || params.stop_token_ids.contains(&tok) {
            Some(FinishReason::Stopped)
        } else if generated >= params.max_tokens as usize || s.tokens.len() >= self.max_model_len {
            Some(FinishReason::Length)
        } else {
            None
        };
        if let Some(r) = reason {
            self.finish_seq(cx, sid, r);
        }
    }

    /// Ends one sequence: its blocks go back (a prefill engine holds them for the decode side
    /// instead), and its request ends when its last sequence does.
    pub fn finish_seq(&mut self, cx: &mut Ctx, sid: SeqId, reason: FinishReason) {
        let request = cx.store.seq(sid).request;
        let hold = cx.conn.role() == Role::Prefill
            && matches!(reason, FinishReason::Stopped | FinishReason::Length)
            && cx.store.requests.contains_key(&request);
        if hold {
            cx.conn.hold(sid, request);
        } else {
            cx.kv.free(sid);
        }
        self.ended.push(sid);
        if cx.conn.is_waiting_for_kv(sid) {
            cx.conn.forget(request, sid, cx.store);
        }
        cx.store.seq_mut(sid).finished = Some(reason);
        let Some(req) = cx.store.requests.get(&request) else {
            return;
        };
        let all_done = req.seqs.iter().all(|id| cx.store.seqs.get(id).is_some_and(|s| s.finished.is_some()));
        if all_done && (req.forked || reason == FinishReason::Error || req.params.n == 1) {
            self.finalize(cx, request, true);
        }
    }

    /// Ends every live sequence of request `rid` with an error (its encoder failed).
    pub fn fail_request(&mut self, cx: &mut Ctx, rid: RequestId, error: String) {
        let Some(r) = cx.store.requests.get_mut(&rid) else { return };
        r.error = Some(error);
        for sid in r.seqs.clone() {
            if cx.store.is_live(sid) {
                self.finish_seq(cx, sid, FinishReason::Error);
            }
        }
    }

    /// Drops a request's encoder cache references once no live sequence of it still has image
    /// positions to compute (their KV now holds what the embeddings contributed).
    pub fn release_images_if_done(&mut self, cx: &mut Ctx, id: RequestId) {
        let Some(req) = cx.store.requests.get(&id) else { return };
        if req.images.is_empty() || !req.forked {
            return;
        }
        let end = req.images_end();
        let done = req
            .seqs
            .iter()
            .filter_map(|sid| cx.store.seqs.get(sid))
            .filter(|s| s.finished.is_none())
            .all(|s| s.num_computed >= end);
        if done {
            for i in &req.images {
                cx.encoder.release(i.hash, id);
            }
        }
    }

    /// Emits a request's one output and forgets it and its sequences; with `release_images` its
    /// encoder cache references go back too.
    fn finalize(&mut self, cx: &mut Ctx, id: RequestId, release_images: bool) {
        if release_images {
            if let Some(req) = cx.store.requests.get(&id) {
                for i in &req.images {
                    cx.encoder.release(i.hash, id);
                }
            }
        }
        let req = cx.store.requests.get(&id).expect("request");
        let first_finish = req.seqs.first().and_then(|f| cx.store.seqs.get(f)).and_then(|s| s.finished);
        let seqs = (0..req.params.n)
            .map(|i| match req.seqs.iter().filter_map(|sid| cx.store.seqs.get(sid)).find(|s| s.index == i) {
                Some(s) => SeqOutput {
                    index: i,
                    tokens: s.tokens[s.num_prompt..].to_vec(),
                    finish: s.finished.unwrap_or(FinishReason::Aborted),
                },
                // Never forked: the request ended before its prompt was prefilled.
                None => {
                    SeqOutput { index: i, tokens: Vec::new(), finish: first_finish.unwrap_or(FinishReason::Aborted) }
                }
            })
            .collect();
        let out = RequestOutput {
            transfer: cx.conn.params(id, cx.store, cx.kv),
            id,
            prompt_tokens: req.prompt.len() as u32,
            seqs,
            cached_prompt_tokens: req.cached_prompt_tokens,
            error: req.error.clone(),
        };
        match out.finish() {
            FinishReason::Aborted => cx.counters.requests_aborted += 1,
            FinishReason::Error => cx.counters.requests_failed += 1,
            _ => cx.counters.requests_finished += 1,
        }
        if self.injections.on(Injection::UntrackedHeap) {
            // The bug: every finished request's output tokens go into a history nothing counts.
            self.history.push(out.seqs.iter().flat_map(|s| s.tokens.iter().copied()).collect());
        }
        self.garden.request_ended(&req.prompt, out.seqs.iter().flat_map(|s| s.tokens.iter().copied()).collect());
        self.finished_ids.insert(id);
        for sid in req.seqs.clone() {
            cx.store.seqs.remove(&sid);
        }
        if !self.injections.on(Injection::RegistryRetainsFinished) {
            cx.store.requests.remove(&id);
        }
        self.outputs.push_back(out);
    }

    /// Aborts a request at whatever stage it is: waiting, mid-encode, mid-prefill, decoding,
    /// preempted, or waiting for its KV. Its output, finish reason aborted, comes out of the next
    /// `step()`.
    pub fn abort(&mut self, cx: &mut Ctx, id: RequestId) -> AbortOutcome {
        let Some(req) = cx.store.requests.get(&id) else {
            return if self.finished_ids.contains(&id) { AbortOutcome::AlreadyFinished } else { AbortOutcome::Unknown };
        };
        let live: Vec<SeqId> = req.seqs.iter().copied().filter(|&sid| cx.store.is_live(sid)).collect();
        if live.is_empty() {
            // Finished and retained (registry-retains-finished): not in flight.
            return AbortOutcome::Unknown;
        }
        let orphans = self.injections.on(Injection::NAbortOrphans) && req.forked;
        for sid in live {
            if orphans && cx.store.seq(sid).index != 0 {
                // The bug: children of an aborted n>1 request are left registered and running.
                continue;
            }
            cx.store.seq_mut(sid).finished = Some(FinishReason::Aborted);
            self.ended.push(sid);
            if cx.conn.is_waiting_for_kv(sid) {
                cx.conn.forget(id, sid, cx.store);
            }
            if !self.injections.on(Injection::AbortKeepsBlocks) {
                cx.kv.free(sid);
            }
        }
        if orphans {
            // The orphans stay in `seqs` and in the running queue: nobody will remove them.
            let req = cx.store.requests.get_mut(&id).expect("request");
            req.seqs.truncate(1);
        }
        // encoder-cache-abort: the abort path forgets the request's encoder cache references.
        self.finalize(cx, id, !self.injections.on(Injection::EncoderCacheAbort));
        AbortOutcome::Aborted
    }
}
