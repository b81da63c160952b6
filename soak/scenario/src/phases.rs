//! What an iteration runs, phase by phase: `batch` (requests at once, with aborts at a stage and
//! invalid requests mixed in), `pressure` (KV demand past the pool, forcing preemption) and
//! `sleep` (release and restore the KV cache, and the weights at level 2).

use serde::Deserialize;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Phase {
    Batch(Batch),
    Pressure(Pressure),
    Sleep(Sleep),
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Batch {
    pub requests: u32,
    /// Text; `{i}` or `{i:08}` is the run-wide request counter, `{iter}` the iteration.
    pub prompt: String,
    /// Pad the prompt with seeded bytes up to this many tokens.
    pub prompt_tokens: Option<u32>,
    /// Tokens shared by every request of the phase (the same in every iteration), before the text.
    pub shared_prefix_tokens: u32,
    pub n: u32,
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: u32,
    pub max_tokens: u32,
    pub ignore_eos: bool,
    pub stop_token_ids: Vec<u32>,
    pub abort: Option<Abort>,
    /// Invalid requests mixed into the batch; each must be refused.
    pub invalid: u32,
    /// Images for the prompt's `<|image_pad|>` placeholders: request i's j-th placeholder takes
    /// `images[(i + j) % len]`.
    pub images: Vec<ImageSpec>,
}

/// A seeded, photo-like image.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageSpec {
    pub width: u32,
    pub height: u32,
    /// How the client sends it: `jpeg`, `png` or `rgb` (raw pixels, as a decoded PIL image).
    #[serde(default = "ImageSpec::default_format")]
    pub format: ImageFormatSpec,
    /// A different image for every request (by default the same pixels each time, as in the
    /// reported reproduction, so the encoder cache hits).
    #[serde(default)]
    pub unique: bool,
}

impl ImageSpec {
    fn default_format() -> ImageFormatSpec {
        ImageFormatSpec::Rgb
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ImageFormatSpec {
    Jpeg,
    Png,
    Rgb,
}

impl Default for Batch {
    fn default() -> Self {
        Batch {
            requests: 20,
            prompt: "Question No.{i:08} Conclude this text in 10 words.".into(),
            prompt_tokens: None,
            shared_prefix_tokens: 0,
            n: 1,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            max_tokens: 16,
            ignore_eos: false,
            stop_token_ids: Vec::new(),
            abort: None,
            invalid: 0,
            images: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Abort {
    /// Fraction of the phase's requests aborted, in [0, 1].
    pub fraction: f64,
    pub stage: Stage,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Stage {
    /// Before it is first scheduled.
    Waiting,
    /// Its images partly or wholly encoded, its prompt not yet started.
    Encode,
    /// Decode side of a P/D pair: before its KV pull starts.
    AwaitingKv,
    /// Decode side of a P/D pair: while its KV is being pulled.
    PullingKv,
    /// After part of its prompt is computed, before its first token.
    Prefill,
    /// After it has produced tokens.
    Decode,
    /// While preempted back to the waiting queue.
    Preempted,
    /// At a seeded random step.
    Any,
}

/// Requests whose KV demand exceeds the pool `overcommit` times over, forcing preemption.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Pressure {
    pub prompt_tokens: u32,
    pub max_tokens: u32,
    pub n: u32,
    pub overcommit: f64,
    pub abort: Option<Abort>,
}

impl Default for Pressure {
    fn default() -> Self {
        Pressure { prompt_tokens: 96, max_tokens: 32, n: 1, overcommit: 1.5, abort: None }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Sleep {
    /// 1 releases the KV cache, 2 the weights too.
    pub level: u8,
    /// Replace the weights while asleep (new seed each iteration), as an RL trainer does.
    pub update_weights: bool,
    /// Reset the prefix cache once awake, as trainers do after a weight update (vLLM's
    /// `/reset_prefix_cache`, SGLang's `/flush_cache` over HTTP).
    pub reset_prefix_cache: bool,
}

impl Default for Sleep {
    fn default() -> Self {
        Sleep { level: 1, update_weights: false, reset_prefix_cache: false }
    }
}
