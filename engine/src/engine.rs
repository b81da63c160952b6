//! The engine core: a synchronous, deterministic state machine.
//!
//! `add_request` -> `step()` (schedule, compute, sample, finish) repeated until `has_unfinished()`
//! is false; `abort` at any point; `sleep`/`wake` between batches; `stats()` and `check_idle()` for
//! the harness. It owns no thread, clock or global RNG: every random draw comes from a sequence's
//! RNG seeded from its request's seed, and every container is ordered.

use std::sync::Arc;

use rand_chacha::ChaCha8Rng;

use crate::block_pool::PoolCounts;
use crate::error::{EngineError, Result};
use crate::inject::{Injection, Injections};
use crate::kv_manager::{ExtraKey, KvManager, SeqId};
use crate::model::backend::{Backend, ForwardBatch, SeqChunk};
use crate::model::config::ModelConfig;
use crate::model::cpu::CpuBackend;
use crate::model::weights::WeightSource;
use crate::multimodal::encoder_cache::EncoderCache;
use crate::multimodal::image::{self, ImageLimits, PixelTensor};
use crate::registry::{Metric, MetricKind, Registries, TrackedMap, TrackedQueue};
use crate::request::{FinishReason, Request, RequestId, RequestOutput, SamplingParams, SeqOutput};
use crate::sampler;
use crate::tokenizer::{EOS, IMAGE_PAD};

#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    pub model: WeightSource,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Blocks in the KV pool.
    pub num_kv_blocks: usize,
    /// Sequences running at once.
    pub max_num_seqs: usize,
    /// Tokens computed per step (prefill chunks and decodes together).
    pub max_num_batched_tokens: usize,
    /// Prompt plus output length limit; None takes the model's.
    pub max_model_len: Option<usize>,
    pub enable_prefix_caching: bool,
    /// Seeds requests that carry no seed of their own.
    pub seed: u64,
    pub injections: Injections,
    /// Resizing range and hard limit for images.
    pub image_limits: ImageLimits,
    /// Encoder cache budget, in embeddings (encoder output tokens).
    pub encoder_cache_tokens: usize,
    /// Encoder cache entries at most (images).
    pub encoder_cache_entries: usize,
    /// Encoder output tokens computed per step at most.
    pub max_encoder_tokens_per_step: usize,
    /// Monolithic, or one side of a prefill/decode pair.
    pub role: crate::pd::Role,
    /// This engine's id in transfer parameters.
    pub engine_id: u32,
    /// Prefill side: how long KV is held for a decode side that never pulls it.
    pub kv_transfer_timeout_ms: u64,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            model: WeightSource::Preset { name: "tiny".into(), seed: 0 },
            block_size: 16,
            num_kv_blocks: 512,
            max_num_seqs: 64,
            max_num_batched_tokens: 512,
            max_model_len: None,
            enable_prefix_caching: true,
            seed: 0,
            injections: Injections::none(),
            image_limits: ImageLimits::default(),
            encoder_cache_tokens: 4096,
            encoder_cache_entries: 64,
            max_encoder_tokens_per_step: 1024,
            role: crate::pd::Role::Monolithic,
            engine_id: 0,
            kv_transfer_timeout_ms: 5_000,
        }
    }
}

/// One image of a request: its placeholder positions `start..start + len` in the expanded prompt,
/// its content hash, and its pixel tensor, kept for the request's life (a preempted request may
/// need to encode it again if its encoder cache entry was evicted meanwhile).
#[derive(Debug, Clone)]
pub(crate) struct ImageItem {
    pub start: usize,
    pub len: usize,
    pub hash: u64,
    pub pixels: Arc<PixelTensor>,
}

/// Where a request in flight is in its life (its furthest-along live sequence decides).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub enum RequestStage {
    /// Never scheduled yet.
    Waiting,
    /// Some of its images encoded, not all: mid-encode.
    Encoding,
    /// Every image encoded, no prompt token computed yet.
    Encoded,
    /// Decode side: waiting for its prompt's KV to be pulled.
    AwaitingKv,
    /// Decode side: its prompt's KV is being pulled.
    PullingKv,
    /// Part of its prompt computed, no token yet.
    Prefill,
    /// Producing tokens.
    Decode,
    /// Preempted: back in the waiting queue to be recomputed.
    Preempted,
}

/// What `abort` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbortOutcome {
    /// The request was in flight; its output (finish reason aborted) comes out of the next step.
    Aborted,
    /// No request in flight has that id: nothing was done.
    Unknown,
}

#[derive(Debug)]
pub(crate) struct Seq {
    pub request: RequestId,
    pub index: u32,
    /// Prompt followed by the generated tokens.
    pub tokens: Vec<u32>,
    pub num_prompt: usize,
    /// Tokens whose KV is in the sequence's blocks.
    pub num_computed: usize,
    pub rng: ChaCha8Rng,
    pub finished: Option<FinishReason>,
    /// Times preempted; nonzero while waiting means it waits to be recomputed.
    pub preemptions: u32,
}

#[derive(Debug)]
pub(crate) struct ReqState {
    pub params: SamplingParams,
    pub seed: u64,
    pub prompt: Vec<u32>,
    /// Sequence ids; one until the prompt is prefilled, then n.
    pub seqs: Vec<SeqId>,
    pub forked: bool,
    pub cached_prompt_tokens: u32,
    pub error: Option<String>,
    pub images: Vec<ImageItem>,
    /// Decode side of a disaggregated request: where its prompt's KV comes from.
    pub remote: Option<crate::pd::Remote>,
}

impl ReqState {
    pub fn new(
        params: SamplingParams,
        seed: u64,
        prompt: Vec<u32>,
        sid: SeqId,
        images: Vec<ImageItem>,
        remote: Option<crate::pd::Remote>,
    ) -> Self {
        ReqState {
            params,
            seed,
            prompt,
            seqs: vec![sid],
            forked: false,
            cached_prompt_tokens: 0,
            error: None,
            images,
            remote,
        }
    }
    /// Prefix-cache extra keys: each image's content hash over its placeholder positions.
    pub fn extra_keys(&self) -> Vec<ExtraKey> {
        self.images.iter().map(|i| ExtraKey { start: i.start, end: i.start + i.len, hash: i.hash }).collect()
    }

    /// The end of the last image's placeholders (0 without images).
    pub fn images_end(&self) -> usize {
        self.images.iter().map(|i| i.start + i.len).max().unwrap_or(0)
    }
}

/// Monotonic counts, reported as `engine.*` counters.
#[derive(Debug, Default, Clone)]
pub(crate) struct Counters {
    pub steps: u64,
    pub requests_added: u64,
    pub requests_finished: u64,
    pub requests_aborted: u64,
    pub requests_failed: u64,
    pub prompt_tokens_computed: u64,
    pub prefix_cache_hit_tokens: u64,
    pub tokens_generated: u64,
    pub preemptions: u64,
    pub block_copies: u64,
    pub encoder_runs: u64,
    pub encoder_cache_hits: u64,
}

/// A report of everything that is not idle when it should be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdleViolation {
    pub metric: String,
    pub value: u64,
    pub detail: String,
}

pub struct Engine {
    pub(crate) config: EngineConfig,
    pub(crate) model: ModelConfig,
    pub(crate) max_model_len: usize,
    pub(crate) book: Registries,
    pub(crate) requests: TrackedMap<RequestId, ReqState>,
    pub(crate) seqs: TrackedMap<SeqId, Seq>,
    pub(crate) waiting: TrackedQueue<SeqId>,
    pub(crate) running: TrackedQueue<SeqId>,
    pub(crate) outputs: TrackedQueue<RequestOutput>,
    pub(crate) kv: KvManager,
    pub(crate) encoder_cache: EncoderCache,
    pub(crate) backend: Box<dyn Backend>,
    pub(crate) asleep: Option<u8>,
    pub(crate) counters: Counters,
    pub(crate) next_seq: SeqId,
    pub(crate) pd: crate::pd::PdState,
    /// The time the shell last told the core (`advance_time`), in ms.
    pub(crate) now_ms: u64,
    /// Written only by the `untracked-heap` injection: a history that no registry counts.
    history: Vec<Vec<u32>>,
}

impl Engine {
    /// An engine on the CPU backend.
    pub fn new(config: EngineConfig) -> Result<Engine> {
        let weights = config.model.load()?;
        let backend = CpuBackend::new(weights, config.injections.clone())?;
        Engine::with_backend(config, Box::new(backend))
    }

    /// An engine on a given backend (holding the weights of `config.model`).
    pub fn with_backend(config: EngineConfig, mut backend: Box<dyn Backend>) -> Result<Engine> {
        let model = backend.config().clone();
        if config.block_size == 0 || config.num_kv_blocks == 0 {
            return Err(EngineError::Config("block_size and num_kv_blocks must be positive".into()));
        }
        if config.max_num_seqs == 0 || config.max_num_batched_tokens == 0 {
            return Err(EngineError::Config("max_num_seqs and max_num_batched_tokens must be positive".into()));
        }
        let max_model_len = config.max_model_len.unwrap_or(model.max_position_embeddings);
        if max_model_len < 2 || max_model_len > model.max_position_embeddings {
            return Err(EngineError::Config(format!(
                "max_model_len {max_model_len} must be in 2..={}",
                model.max_position_embeddings
            )));
        }
        backend.allocate_kv(config.num_kv_blocks, config.block_size)?;
        let mut book = Registries::new();
        let kv = KvManager::new(config.num_kv_blocks, config.block_size, config.enable_prefix_caching, &mut book);
        let encoder_cache = EncoderCache::new(config.encoder_cache_tokens, config.encoder_cache_entries, &mut book);
        let pd = crate::pd::PdState::new(&mut book);
        Ok(Engine {
            requests: book.map("registry.requests", MetricKind::PerRequest),
            seqs: book.map("registry.sequences", MetricKind::PerRequest),
            waiting: book.queue("registry.waiting", MetricKind::PerRequest),
            running: book.queue("registry.running", MetricKind::PerRequest),
            outputs: book.queue("registry.pending_outputs", MetricKind::PerRequest),
            config,
            model,
            max_model_len,
            book,
            kv,
            encoder_cache,
            backend,
            asleep: None,
            counters: Counters::default(),
            next_seq: 0,
            history: Vec::new(),
            pd,
            now_ms: 0,
        })
    }

    /// Makes this engine one side of a prefill/decode pair (before any request is added).
    pub fn set_role(&mut self, role: crate::pd::Role, engine_id: u32, kv_transfer_timeout_ms: u64) {
        assert_eq!(self.counters.requests_added, 0, "role set after requests were added");
        self.config.role = role;
        self.config.engine_id = engine_id;
        self.config.kv_transfer_timeout_ms = kv_transfer_timeout_ms;
    }

    pub fn model_config(&self) -> &ModelConfig {
        &self.model
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    pub fn max_model_len(&self) -> usize {
        self.max_model_len
    }

    pub fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    pub(crate) fn validate(&self, r: &Request) -> Result<()> {
        let bad = |reason: String| Err(EngineError::InvalidRequest { id: r.id, reason });
        let p = &r.params;
        if let Some(level) = self.asleep {
            return Err(EngineError::Asleep(level));
        }
        if self.requests.contains_key(&r.id) {
            return Err(EngineError::DuplicateRequest(r.id));
        }
        if r.prompt.is_empty() {
            return bad("empty prompt".into());
        }

        if let Some(&t) = r.prompt.iter().find(|&&t| t as usize >= self.model.vocab_size) {
            return bad(format!("token id {t} is outside the vocabulary of {}", self.model.vocab_size));
        }
        if p.n == 0 {
            return bad("n must be at least 1".into());
        }
        if p.n as usize > self.config.max_num_seqs {
            return bad(format!("n = {} exceeds max_num_seqs = {}", p.n, self.config.max_num_seqs));
        }
        if p.max_tokens == 0 {
            return bad("max_tokens must be at least 1".into());
        }
        if self.config.role != crate::pd::Role::Monolithic && (p.n != 1 || !r.images.is_empty()) {
            return bad("disaggregated requests take n = 1 and no images".into());
        }
        if !(p.top_p > 0.0 && p.top_p <= 1.0) {
            return bad(format!("top_p {} is outside (0, 1]", p.top_p));
        }
        if !(p.temperature >= 0.0) || !p.temperature.is_finite() {
            return bad(format!("temperature {} must be finite and >= 0", p.temperature));
        }
        if let Some(&t) = p.stop_token_ids.iter().find(|&&t| t as usize >= self.model.vocab_size) {
            return bad(format!("stop token id {t} is outside the vocabulary of {}", self.model.vocab_size));
        }
        let pads = r.prompt.iter().filter(|&&t| t == IMAGE_PAD).count();
        if pads != r.images.len() {
            return bad(format!("the prompt has {pads} image placeholders and the request {} images", r.images.len()));
        }
        if !r.images.is_empty() && self.model.vision.is_none() {
            return bad("the model has no vision encoder: images need a model such as the tiny-vl preset".into());
        }
        Ok(())
    }

    /// Processes a request's images and expands each placeholder to its encoder output length.
    fn expand_images(&self, r: &Request) -> Result<(Vec<u32>, Vec<ImageItem>)> {
        let bad = |reason: String| EngineError::InvalidRequest { id: r.id, reason };
        let mut prompt = Vec::with_capacity(r.prompt.len());
        let mut items = Vec::with_capacity(r.images.len());
        let mut inputs = r.images.iter().enumerate();
        for &t in &r.prompt {
            if t != IMAGE_PAD {
                prompt.push(t);
                continue;
            }
            let (k, input) = inputs.next().expect("placeholders counted");
            let v = self.model.vision.as_ref().expect("checked");
            let px = image::process(input, &self.config.image_limits, v.grid_factor())
                .map_err(|m| bad(format!("image {k}: {m}")))?;
            let len = crate::model::vision::num_tokens(v, px.width, px.height);
            if len > self.config.encoder_cache_tokens.min(self.config.max_encoder_tokens_per_step) {
                return Err(bad(format!(
                    "image {k} encodes to {len} embeddings, more than the encoder cache budget ({}) or step budget ({})",
                    self.config.encoder_cache_tokens, self.config.max_encoder_tokens_per_step
                )));
            }
            items.push(ImageItem { start: prompt.len(), len, hash: px.hash, pixels: Arc::new(px) });
            prompt.extend(std::iter::repeat_n(IMAGE_PAD, len));
        }
        let mut distinct: Vec<(u64, usize)> = items.iter().map(|i| (i.hash, i.len)).collect();
        distinct.sort_unstable();
        distinct.dedup();
        let total: usize = distinct.iter().map(|d| d.1).sum();
        if total > self.config.encoder_cache_tokens || distinct.len() > self.config.encoder_cache_entries {
            return Err(bad(format!(
                "{} distinct images encode to {total} embeddings, more than the encoder cache holds ({} embeddings, {} entries)",
                distinct.len(),
                self.config.encoder_cache_tokens,
                self.config.encoder_cache_entries
            )));
        }
        if prompt.len() >= self.max_model_len {
            return Err(bad(format!(
                "prompt of {} tokens leaves no room under the maximum length of {} tokens",
                prompt.len(),
                self.max_model_len
            )));
        }
        let blocks = self.kv.blocks_for(prompt.len() + 1);
        if blocks > self.config.num_kv_blocks {
            return Err(bad(format!(
                "the prompt needs {blocks} KV blocks and the pool has {}",
                self.config.num_kv_blocks
            )));
        }
        Ok((prompt, items))
    }

    /// Adds a request to the waiting queue. A rejected request changes nothing.
    pub fn add_request(&mut self, r: Request) -> Result<()> {
        self.validate(&r)?;
        let (prompt, images) = self.expand_images(&r)?;
        let seed = self.request_seed(&r);
        let sid = self.new_seq(r.id, 0, prompt.clone(), seed);
        self.requests.insert(r.id, ReqState::new(r.params, seed, prompt, sid, images, None));
        self.waiting.push_back(sid);
        self.counters.requests_added += 1;
        Ok(())
    }

    pub(crate) fn new_seq(&mut self, request: RequestId, index: u32, tokens: Vec<u32>, seed: u64) -> SeqId {
        let id = self.next_seq;
        self.next_seq += 1;
        let num_prompt = tokens.len();
        self.seqs.insert(
            id,
            Seq {
                request,
                index,
                tokens,
                num_prompt,
                num_computed: 0,
                rng: sampler::seq_rng(seed, index as usize),
                finished: None,
                preemptions: 0,
            },
        );
        id
    }

    /// The stage of request `id`, or None when it is not in flight.
    pub fn stage(&self, id: RequestId) -> Option<RequestStage> {
        let req = self.requests.get(&id)?;
        req.seqs
            .iter()
            .filter_map(|sid| self.seqs.get(sid).filter(|s| s.finished.is_none()).map(|s| (sid, s)))
            .map(|(sid, s)| {
                if self.pd.waiting_for_kv.contains(sid) {
                    if self.pd.pulls.contains_key(&id) {
                        RequestStage::PullingKv
                    } else {
                        RequestStage::AwaitingKv
                    }
                } else if self.waiting.contains(sid) {
                    let held = req.images.iter().filter(|i| self.encoder_cache.holds(i.hash, id)).count();
                    if s.preemptions > 0 {
                        RequestStage::Preempted
                    } else if held == 0 {
                        RequestStage::Waiting
                    } else if held < req.images.len() {
                        RequestStage::Encoding
                    } else {
                        RequestStage::Encoded
                    }
                } else if s.tokens.len() > s.num_prompt {
                    RequestStage::Decode
                } else {
                    RequestStage::Prefill
                }
            })
            .max()
    }

    /// True while any sequence is waiting or running (the harness drains until this is false).
    pub fn has_unfinished(&self) -> bool {
        !self.waiting.is_empty()
            || !self.running.is_empty()
            || !self.outputs.is_empty()
            || !self.pd.waiting_for_kv.is_empty()
    }

    /// Requests in flight (added, not yet finished).
    pub fn num_in_flight(&self) -> usize {
        self.waiting.len() + self.running.len() + self.pd.waiting_for_kv.len()
    }

    /// Prompt tokens computed and tokens generated so far: what a shell's cost model charges a
    /// step for (the difference across it), without building `stats()`.
    pub fn tokens_computed(&self) -> (u64, u64) {
        (self.counters.prompt_tokens_computed, self.counters.tokens_generated)
    }

    /// One engine step: schedule, compute, sample, finish. Returns the requests that ended.
    pub fn step(&mut self) -> Result<Vec<RequestOutput>> {
        if self.asleep.is_none() && !self.pd.waiting_for_kv.is_empty() {
            self.start_pulls();
        }
        if self.asleep.is_none() && (!self.waiting.is_empty() || !self.running.is_empty()) {
            self.counters.steps += 1;
            let mut sched = self.schedule();
            // A sequence that ended while the step was scheduled (an encoder failure ends every
            // sequence of its request) computes nothing.
            sched.chunks.retain(|c| self.seqs.get(&c.seq).is_some_and(|s| s.finished.is_none()));
            if !sched.chunks.is_empty() {
                let batch = ForwardBatch {
                    copies: sched.copies,
                    chunks: sched
                        .chunks
                        .iter()
                        .map(|c| {
                            let s = &self.seqs.get(&c.seq).expect("scheduled seq exists");
                            let end = c.start + c.len;
                            let embeds = self
                                .requests
                                .get(&s.request)
                                .map(|r| {
                                    r.images
                                        .iter()
                                        .filter(|i| i.start < end && i.start + i.len > c.start)
                                        .map(|i| {
                                            let e = self.encoder_cache.get(i.hash).expect("held while prefilling");
                                            (i.start, e)
                                        })
                                        .collect()
                                })
                                .unwrap_or_default();
                            SeqChunk {
                                tokens: s.tokens[c.start..end].to_vec(),
                                start_pos: c.start,
                                block_table: self.kv.block_table(c.seq).to_vec(),
                                want_logits: c.want_logits,
                                embeds,
                            }
                        })
                        .collect(),
                };
                self.counters.block_copies += batch.copies.len() as u64;
                let logits = self.backend.forward(&batch)?;
                self.apply(&sched.chunks, logits);
                let mut touched: Vec<RequestId> =
                    sched.chunks.iter().filter_map(|c| self.seqs.get(&c.seq).map(|s| s.request)).collect();
                touched.dedup();
                for r in touched {
                    self.release_images_if_done(r);
                }
            }
        }
        Ok(self.outputs.drain_all())
    }

    /// Records computed tokens, samples where logits came back, forks n>1 requests after their
    /// prompt, and finishes sequences that stop.
    fn apply(&mut self, chunks: &[crate::scheduler::Chunk], logits: Vec<Vec<f32>>) {
        let mut logits = logits.into_iter();
        for c in chunks {
            let request = self.seqs.get(&c.seq).expect("seq exists").request;
            let extra = self.requests.get(&request).map(ReqState::extra_keys).unwrap_or_default();
            let s = self.seqs.get_mut(&c.seq).expect("seq exists");
            s.num_computed += c.len;
            if s.num_computed <= s.num_prompt {
                self.counters.prompt_tokens_computed += c.len as u64;
            }
            let (num_computed, request) = (s.num_computed, s.request);
            let tokens = std::mem::take(&mut s.tokens);
            self.kv.publish(c.seq, &tokens, num_computed, &extra);
            self.seqs.get_mut(&c.seq).expect("seq").tokens = tokens;
            if !c.want_logits {
                continue;
            }
            let row = logits.next().expect("one logits row per chunk wanting it");
            let Some(req) = self.requests.get(&request) else {
                // An orphan (n-abort-orphans): it still samples and runs to its end.
                self.sample_and_check(c.seq, &row, None);
                continue;
            };
            if !req.forked {
                let (n, seed) = (req.params.n, req.seed);
                let parent_tokens = self.seqs.get(&c.seq).expect("seq").tokens.clone();
                let mut children = Vec::new();
                for i in 1..n {
                    let child = self.new_seq(request, i, parent_tokens.clone(), seed);
                    let cs = self.seqs.get_mut(&child).expect("child");
                    cs.num_computed = num_computed;
                    self.kv.fork(c.seq, child);
                    children.push(child);
                }
                let req = self.requests.get_mut(&request).expect("request");
                req.forked = true;
                req.seqs.extend(children.iter().copied());
                self.sample_and_check(c.seq, &row, Some(request));
                for child in children {
                    self.running.push_back(child);
                    self.sample_and_check(child, &row, Some(request));
                }
            } else {
                self.sample_and_check(c.seq, &row, Some(request));
            }
        }
    }

    fn sample_and_check(&mut self, sid: SeqId, logits: &[f32], request: Option<RequestId>) {
        let params = match request.and_then(|r| self.requests.get(&r)) {
            Some(r) => r.params.clone(),
            None => SamplingParams { ignore_eos: true, ..SamplingParams::default() },
        };
        let s = self.seqs.get_mut(&sid).expect("seq");
        let tok = sampler::sample(logits, &params, &mut s.rng);
        s.tokens.push(tok);
        self.counters.tokens_generated += 1;
        let generated = s.tokens.len() - s.num_prompt;
        let reason = if (!params.ignore_eos && tok == EOS) || params.stop_token_ids.contains(&tok) {
            Some(FinishReason::Stopped)
        } else if generated >= params.max_tokens as usize || s.tokens.len() >= self.max_model_len {
            Some(FinishReason::Length)
        } else {
            None
        };
        if let Some(r) = reason {
            self.finish_seq(sid, r);
        }
    }

    /// Ends one sequence: its blocks go back, and its request ends when its last sequence does.
    pub(crate) fn finish_seq(&mut self, sid: SeqId, reason: FinishReason) {
        let request = self.seqs.get(&sid).expect("seq").request;
        let hold = self.config.role == crate::pd::Role::Prefill
            && matches!(reason, FinishReason::Stopped | FinishReason::Length)
            && self.requests.contains_key(&request);
        if hold {
            // Prefill side: the blocks stay for the decode side to pull.
            self.hold_for_transfer(sid, request);
        } else {
            self.kv.free(sid);
        }
        self.running.remove_item(&sid);
        self.waiting.remove_item(&sid);
        if self.pd.waiting_for_kv.contains(&sid) {
            self.forget_remote(request, sid);
        }
        let s = self.seqs.get_mut(&sid).expect("seq");
        s.finished = Some(reason);
        let request = s.request;
        let Some(req) = self.requests.get(&request) else {
            return;
        };
        let all_done = req.seqs.iter().all(|id| self.seqs.get(id).is_some_and(|s| s.finished.is_some()));
        if all_done && (req.forked || reason == FinishReason::Error || req.params.n == 1) {
            self.finalize(request, true);
        }
    }

    /// Drops a request's encoder cache references once no live sequence of it still has image
    /// positions to compute (their KV now holds what the embeddings contributed).
    fn release_images_if_done(&mut self, id: RequestId) {
        let Some(req) = self.requests.get(&id) else { return };
        if req.images.is_empty() || !req.forked {
            return;
        }
        let end = req.images_end();
        let done = req
            .seqs
            .iter()
            .filter_map(|sid| self.seqs.get(sid))
            .filter(|s| s.finished.is_none())
            .all(|s| s.num_computed >= end);
        if done {
            for i in &req.images {
                self.encoder_cache.release(i.hash, id);
            }
        }
    }

    /// Emits a request's one output and forgets it and its sequences; with `release_images` its
    /// encoder cache references go back too.
    fn finalize(&mut self, id: RequestId, release_images: bool) {
        if release_images {
            if let Some(req) = self.requests.get(&id) {
                for i in &req.images {
                    self.encoder_cache.release(i.hash, id);
                }
            }
        }
        let req = self.requests.get(&id).expect("request");
        let n = req.params.n;
        let mut seqs = Vec::with_capacity(n as usize);
        for i in 0..n {
            let s = req.seqs.iter().filter_map(|sid| self.seqs.get(sid)).find(|s| s.index == i);
            seqs.push(match s {
                Some(s) => SeqOutput {
                    index: i,
                    tokens: s.tokens[s.num_prompt..].to_vec(),
                    finish: s.finished.unwrap_or(FinishReason::Aborted),
                },
                // Never forked: the request ended before its prompt was prefilled.
                None => SeqOutput {
                    index: i,
                    tokens: Vec::new(),
                    finish: req
                        .seqs
                        .first()
                        .and_then(|f| self.seqs.get(f))
                        .and_then(|s| s.finished)
                        .unwrap_or(FinishReason::Aborted),
                },
            });
        }
        let transfer = self.transfer_params(id);
        let out = RequestOutput {
            transfer,
            id,
            prompt_tokens: req.prompt.len() as u32,
            seqs,
            cached_prompt_tokens: req.cached_prompt_tokens,
            error: req.error.clone(),
        };
        match out.finish() {
            FinishReason::Aborted => self.counters.requests_aborted += 1,
            FinishReason::Error => self.counters.requests_failed += 1,
            _ => self.counters.requests_finished += 1,
        }
        if self.config.injections.on(Injection::UntrackedHeap) {
            self.history.push(out.seqs.iter().flat_map(|s| s.tokens.iter().copied()).collect());
        }
        let seq_ids = req.seqs.clone();
        for sid in seq_ids {
            self.seqs.remove(&sid);
        }
        if !self.config.injections.on(Injection::RegistryRetainsFinished) {
            self.requests.remove(&id);
        }
        self.outputs.push_back(out);
    }

    /// Aborts a request at whatever stage it is: waiting, mid-prefill, decoding or preempted. Its
    /// output, with finish reason aborted, comes out of the next `step()`.
    pub fn abort(&mut self, id: RequestId) -> AbortOutcome {
        let Some(req) = self.requests.get(&id) else {
            return AbortOutcome::Unknown;
        };
        let live: Vec<SeqId> =
            req.seqs.iter().copied().filter(|sid| self.seqs.get(sid).is_some_and(|s| s.finished.is_none())).collect();
        if live.is_empty() {
            // Finished and retained (registry-retains-finished): not in flight.
            return AbortOutcome::Unknown;
        }
        let forked = req.forked;
        let orphans = self.config.injections.on(Injection::NAbortOrphans) && forked;
        for sid in live {
            let s = self.seqs.get_mut(&sid).expect("seq");
            if orphans && s.index != 0 {
                // The bug: children of an aborted n>1 request are left registered and running.
                continue;
            }
            s.finished = Some(FinishReason::Aborted);
            self.running.remove_item(&sid);
            self.waiting.remove_item(&sid);
            if self.pd.waiting_for_kv.contains(&sid) {
                self.forget_remote(id, sid);
            }
            if !self.config.injections.on(Injection::AbortKeepsBlocks) {
                self.kv.free(sid);
            }
        }
        if orphans {
            let req = self.requests.get_mut(&id).expect("request");
            let keep = req.seqs[0];
            let orphaned: Vec<SeqId> = req.seqs.drain(..).filter(|&s| s != keep).collect();
            req.seqs.push(keep);
            let _ = orphaned; // still in `seqs` and `running`: nobody will remove them
        }
        // encoder-cache-abort: the abort path forgets the request's encoder cache references.
        self.finalize(id, !self.config.injections.on(Injection::EncoderCacheAbort));
        AbortOutcome::Aborted
    }

    /// Sleep level 1 releases the KV pool; level 2 releases the weights too. Only with nothing in
    /// flight. While asleep, `add_request` is refused and `step` computes nothing.
    pub fn sleep(&mut self, level: u8) -> Result<()> {
        if !(1..=2).contains(&level) {
            return Err(EngineError::BadSleepLevel(level));
        }
        if self.asleep.is_some() {
            return Ok(());
        }
        let busy = self.num_in_flight() + self.pd.held.len();
        if busy > 0 {
            return Err(EngineError::Busy(busy));
        }
        self.kv.reset_prefix_cache();
        self.backend.release_kv();
        if level == 2 {
            self.backend.release_weights();
        }
        self.asleep = Some(level);
        Ok(())
    }

    /// Restores what sleep released: the KV pool, and after level 2 the weights of `config.model`.
    pub fn wake(&mut self) -> Result<()> {
        let Some(level) = self.asleep else {
            return Err(EngineError::NotAsleep);
        };
        if level == 2 {
            self.backend.load_weights(self.config.model.load()?)?;
        }
        self.backend.allocate_kv(self.config.num_kv_blocks, self.config.block_size)?;
        self.asleep = None;
        Ok(())
    }

    /// Replaces the weights (an RL trainer's update). Asleep at level 2 they load at `wake`;
    /// otherwise at once. The prefix cache is dropped: its KV came from the old weights.
    pub fn update_weights(&mut self, source: WeightSource) -> Result<()> {
        if source.config()? != self.model {
            return Err(EngineError::Weights("new weights have another model shape".into()));
        }
        if self.asleep != Some(2) {
            let busy = self.num_in_flight() + self.pd.held.len();
            if busy > 0 {
                return Err(EngineError::Busy(busy));
            }
            self.backend.load_weights(source.load()?)?;
            self.kv.reset_prefix_cache();
        }
        self.config.model = source;
        Ok(())
    }

    pub fn is_asleep(&self) -> bool {
        self.asleep.is_some()
    }

    pub fn kv_counts(&self) -> PoolCounts {
        self.kv.counts()
    }

    /// Every registry, the KV pool by state, the backend's memory and the counters.
    pub fn stats(&self) -> Vec<Metric> {
        let mut m: Vec<Metric> = self.book.metrics().collect();
        let k = self.kv.counts();
        let total = k.total as u64;
        let count = |name: &str, kind, value| Metric { name: name.to_string(), kind, unit: "count", value };
        m.push(count("registry.kv.blocks_used", MetricKind::PerRequest, k.used as u64));
        m.push(count("registry.kv.blocks_cached", MetricKind::Bounded { capacity: total }, k.cached as u64));
        m.push(count("registry.kv.blocks_free", MetricKind::Bounded { capacity: total }, k.free as u64));
        let mem = self.backend.memory();
        m.push(count("registry.kv_pools", MetricKind::Bounded { capacity: 1 }, mem.kv_pools));
        let ec = &self.encoder_cache;
        m.push(count("registry.encoder_cache.refs", MetricKind::PerRequest, ec.refs() as u64));
        m.push(count(
            "registry.encoder_cache.embeddings",
            MetricKind::Bounded { capacity: ec.budget_tokens() as u64 },
            ec.used_tokens() as u64,
        ));
        let bytes =
            |name: &str, value| Metric { name: name.to_string(), kind: MetricKind::Gauge, unit: "bytes", value };
        m.push(bytes("engine.kv_pool_bytes", mem.kv_bytes));
        m.push(bytes("engine.weight_bytes", mem.weight_bytes));
        let c = &self.counters;
        for (name, v) in [
            ("engine.steps", c.steps),
            ("engine.requests_added", c.requests_added),
            ("engine.requests_finished", c.requests_finished),
            ("engine.requests_aborted", c.requests_aborted),
            ("engine.requests_failed", c.requests_failed),
            ("engine.prompt_tokens_computed", c.prompt_tokens_computed),
            ("engine.prefix_cache_hit_tokens", c.prefix_cache_hit_tokens),
            ("engine.tokens_generated", c.tokens_generated),
            ("engine.preemptions", c.preemptions),
            ("engine.block_copies", c.block_copies),
            ("engine.encoder_runs", c.encoder_runs),
            ("engine.encoder_cache_hits", c.encoder_cache_hits),
        ] {
            m.push(count(name, MetricKind::Counter, v));
        }
        m.extend(self.backend.device_metrics());
        m
    }

    /// The engine's idle self-check: every per-request registry empty, every bounded one within its
    /// capacity, and the KV pool's accounting whole. Call it when nothing is in flight.
    pub fn check_idle(&self) -> std::result::Result<(), Vec<IdleViolation>> {
        let mut v = Vec::new();
        for m in self.stats() {
            match m.kind {
                MetricKind::PerRequest if m.value > 0 => v.push(IdleViolation {
                    detail: format!("{} holds {} entries with nothing in flight", m.name, m.value),
                    metric: m.name,
                    value: m.value,
                }),
                MetricKind::Bounded { capacity } if m.value > capacity => v.push(IdleViolation {
                    detail: format!("{} holds {} entries, above its capacity {capacity}", m.name, m.value),
                    metric: m.name,
                    value: m.value,
                }),
                _ => {}
            }
        }
        if let Err(e) = self.kv.check() {
            v.push(IdleViolation {
                metric: "check.kv_accounting".into(),
                value: 0,
                detail: format!("KV accounting: {e}"),
            });
        }
        // Every request added has ended exactly one way.
        let c = &self.counters;
        let ended = c.requests_finished + c.requests_aborted + c.requests_failed;
        if c.requests_added != ended {
            v.push(IdleViolation {
                metric: "check.request_counts".into(),
                value: c.requests_added.abs_diff(ended),
                detail: format!(
                    "{} requests added but {} finished + {} aborted + {} failed = {ended} ended",
                    c.requests_added, c.requests_finished, c.requests_aborted, c.requests_failed
                ),
            });
        }
        if v.is_empty() {
            Ok(())
        } else {
            Err(v)
        }
    }
}
