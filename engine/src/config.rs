//! The engine's configuration: the model, the KV pool, the batch limits, images and the P/D role.

use crate::error::{EngineError, Result};
use crate::inject::Injections;
use crate::model::weights::WeightSource;
use crate::multimodal::image::ImageLimits;

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
    /// Decode side: KV pulls in flight at once. A transfer engine bounds its in-flight reads; the
    /// requests past the bound stay queued awaiting their KV (no blocks allocated yet) until a
    /// pull ends, which is where a client's abort finds them.
    pub max_pulls_in_flight: usize,
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
            max_pulls_in_flight: 64,
        }
    }
}

impl EngineConfig {
    /// Checks the limits against each other and the model; returns the maximum model length.
    pub(crate) fn check(&self, max_position_embeddings: usize) -> Result<usize> {
        if self.block_size == 0 || self.num_kv_blocks == 0 {
            return Err(EngineError::Config("block_size and num_kv_blocks must be positive".into()));
        }
        if self.max_pulls_in_flight == 0 {
            return Err(EngineError::Config("max_pulls_in_flight must be positive".into()));
        }
        if self.max_num_seqs == 0 || self.max_num_batched_tokens == 0 {
            return Err(EngineError::Config("max_num_seqs and max_num_batched_tokens must be positive".into()));
        }
        let max_model_len = self.max_model_len.unwrap_or(max_position_embeddings);
        if max_model_len < 2 || max_model_len > max_position_embeddings {
            return Err(EngineError::Config(format!(
                "max_model_len {max_model_len} must be in 2..={max_position_embeddings}"
            )));
        }
        Ok(max_model_len)
    }
}
