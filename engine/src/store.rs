//! The request and sequence store: what the engine knows of every request in flight.
//!
//! A request is admitted with one sequence holding its (expanded) prompt. Once its prompt is
//! prefilled, an n>1 request forks into n sequences sharing the prompt's KV blocks. Each sequence
//! ends on its own (stop rule, length, abort, error); the request ends when its last sequence
//! does, and is then removed with all its sequences (`finalize` in the output processor). Both
//! maps are counted registries: a request or sequence left behind with nothing in flight is a
//! leak the harness sees at once.

use std::sync::Arc;

use rand_chacha::ChaCha8Rng;

use crate::kv_manager::{ExtraKey, SeqId};
use crate::multimodal::image::PixelTensor;
use crate::registry::{MetricKind, Registries, TrackedMap};
use crate::request::{FinishReason, RequestId, SamplingParams};
use crate::sampler;

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
    pub remote: Option<Remote>,
}

impl ReqState {
    pub fn new(params: SamplingParams, seed: u64, prompt: Vec<u32>, sid: SeqId, images: Vec<ImageItem>) -> Self {
        ReqState {
            params,
            seed,
            prompt,
            seqs: vec![sid],
            forked: false,
            cached_prompt_tokens: 0,
            error: None,
            images,
            remote: None,
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

/// Requests and sequences in flight, by id.
#[derive(Debug)]
pub(crate) struct RequestStore {
    pub requests: TrackedMap<RequestId, ReqState>,
    pub seqs: TrackedMap<SeqId, Seq>,
    next_seq: SeqId,
}

impl RequestStore {
    pub fn new(book: &mut Registries) -> Self {
        RequestStore {
            requests: book.map("registry.requests", MetricKind::PerRequest),
            seqs: book.map("registry.sequences", MetricKind::PerRequest),
            next_seq: 0,
        }
    }

    /// A new sequence of `request` (its `index`-th) with its own RNG, seeded from the request's
    /// seed and the index, so every sampled token is reproducible whatever the batch.
    #[track_caller]
    pub fn new_seq(&mut self, request: RequestId, index: u32, tokens: Vec<u32>, seed: u64) -> SeqId {
        let id = self.next_seq;
        self.next_seq += 1;
        let num_prompt = tokens.len();
        let rng = sampler::seq_rng(seed, index as usize);
        let seq = Seq { request, index, tokens, num_prompt, num_computed: 0, rng, finished: None, preemptions: 0 };
        self.seqs.insert(id, seq);
        id
    }

    pub fn seq(&self, sid: SeqId) -> &Seq {
        self.seqs.get(&sid).expect("a sequence in flight")
    }

    pub fn seq_mut(&mut self, sid: SeqId) -> &mut Seq {
        self.seqs.get_mut(&sid).expect("a sequence in flight")
    }

    /// Whether `sid` exists and has not ended.
    pub fn is_live(&self, sid: SeqId) -> bool {
        self.seqs.get(&sid).is_some_and(|s| s.finished.is_none())
    }

    /// Records `error` as the reason request `rid` failed (a no-op for a request already gone).
    pub fn set_error(&mut self, rid: RequestId, error: String) {
        if let Some(r) = self.requests.get_mut(&rid) {
            r.error = Some(error);
        }
    }
}

/// The decode side's view of a request whose prompt's KV another instance computed: where to pull
/// it from, and whether the pull is under way (the P/D connector, `pd/connector.rs`, drives it).
#[derive(Debug, Clone)]
pub(crate) struct Remote {
    pub params: crate::request::TransferParams,
    pub pulling: bool,
}
