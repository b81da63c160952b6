//! Requests as the engine receives them and outputs as it returns them.
//!
//! Lifecycle of a request: `add_request` validates it and puts its first sequence in the waiting
//! queue -> scheduled (prefill, possibly in chunks) -> running (decode) -> possibly preempted back
//! to waiting (its KV freed, recomputed later) -> finished with one [`FinishReason`] per sequence.
//! An n>1 request prefills its prompt once and forks into n sequences sharing the prompt's blocks.
//! Exactly one [`RequestOutput`] comes out of `step()` per request, whatever way it ended.

use serde::{Deserialize, Serialize};

use crate::block_pool::BlockId;

pub type RequestId = u64;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SamplingParams {
    /// Sequences generated from one prompt.
    pub n: u32,
    /// 0 is greedy.
    pub temperature: f32,
    /// Nucleus mass kept, in (0, 1].
    pub top_p: f32,
    /// Candidates kept; 0 keeps all.
    pub top_k: u32,
    /// New tokens per sequence, at least 1.
    pub max_tokens: u32,
    /// Token ids that end a sequence (the stop token is the output's last token).
    pub stop_token_ids: Vec<u32>,
    /// Keep generating past EOS.
    pub ignore_eos: bool,
    /// Seed of the request's RNGs; None derives one from the engine seed and the request id.
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            n: 1,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            max_tokens: 16,
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            seed: None,
        }
    }
}

/// A request to add to the engine. Each `IMAGE_PAD` token of the prompt stands for one image, in
/// order; the engine expands it to as many positions as the vision encoder produces for that image.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub id: RequestId,
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    pub images: Vec<crate::multimodal::image::ImageInput>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// EOS or a stop token.
    Stopped,
    /// max_tokens or the model's maximum length reached.
    Length,
    Aborted,
    /// The engine could not serve it (for example, more KV than the whole pool).
    Error,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeqOutput {
    pub index: u32,
    pub tokens: Vec<u32>,
    pub finish: FinishReason,
}

/// What the decode side of a prefill/decode pair needs to pull a request's KV from the prefill
/// side (`crate::pd` says how a transfer lives); a prefill engine's output carries it.
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

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestOutput {
    pub id: RequestId,
    pub prompt_tokens: u32,
    /// One per sequence, by index. An abort before the fork reports the sequences it never made
    /// as aborted with no tokens.
    pub seqs: Vec<SeqOutput>,
    /// Prompt tokens served from the prefix cache.
    pub cached_prompt_tokens: u32,
    /// A reason when `finish` is Error.
    pub error: Option<String>,
    /// Prefill side of a disaggregated pair: where the decode side pulls this request's KV.
    pub transfer: Option<TransferParams>,
}

impl RequestOutput {
    /// The request's overall ending: aborted or error if any sequence was, else the first's.
    pub fn finish(&self) -> FinishReason {
        for r in [FinishReason::Error, FinishReason::Aborted] {
            if self.seqs.iter().any(|s| s.finish == r) {
                return r;
            }
        }
        self.seqs.first().map(|s| s.finish).unwrap_or(FinishReason::Aborted)
    }
}

/// Where a request in flight is in its life (its furthest-along live sequence decides).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
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
    /// The request ended since the last step began: its output is out, or comes with the next
    /// step; nothing was done.
    AlreadyFinished,
    /// No request in flight has that id: nothing was done.
    Unknown,
}
