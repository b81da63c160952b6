//! The backend trait: what the engine core asks of a device. The core decides what to compute;
//! a backend only computes it, and owns the memory it computes in (weights, KV pool).

use crate::config::ModelConfig;
use crate::error::Result;
use crate::weights::{ModelWeights, WeightSource};

/// A block of the KV pool, by index: the engine's block pool hands them out, a backend stores a
/// block's K and V at that index.
pub type BlockId = u32;

/// A block copy the backend must perform before the next forward pass (copy-on-write).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockCopy {
    pub src: BlockId,
    pub dst: BlockId,
}

/// What a backend does with its KV pool when the engine sleeps: drops it, or (the engine's
/// `sleep-keeps-kv` injection) keeps it beside the pool that wake allocates. Every backend releases
/// through [`PoolRelease::release`], so the injection has one structure on the CPU, the GPU and in
/// the simulator.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PoolRelease {
    #[default]
    Drop,
    KeepBeside,
}

impl PoolRelease {
    /// Releases `pool`: dropped, or kept in `kept`.
    pub fn release<P>(self, pool: &mut Option<P>, kept: &mut Vec<P>) {
        if let Some(p) = pool.take() {
            if self == PoolRelease::KeepBeside {
                kept.push(p);
            }
        }
    }
}

/// One sequence's share of a forward pass: `tokens` at positions `start_pos..`, written into the
/// KV slots that `block_table` maps those positions to.
#[derive(Debug, Clone, PartialEq)]
pub struct SeqChunk {
    pub tokens: Vec<u32>,
    pub start_pos: usize,
    pub block_table: Vec<BlockId>,
    /// Return the logits of the chunk's last position.
    pub want_logits: bool,
    /// Image embeddings (rows of the hidden size) replacing the token embeddings of placeholder
    /// positions from the given start position on.
    pub embeds: Vec<(usize, std::sync::Arc<Vec<f32>>)>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct ForwardBatch {
    /// Block copies (copy-on-write) to perform before computing.
    pub copies: Vec<BlockCopy>,
    pub chunks: Vec<SeqChunk>,
}

/// How the engine samples a chunk's row, which says what a backend may answer with
/// ([`Backend::forward_sampled`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RowSampling {
    /// The caller needs the row itself (it samples it more than once, as an n > 1 request's first
    /// tokens, or with parameters the backend is not told).
    Row,
    /// Greedy: the token is the argmax (the lowest id among the largest logits).
    Greedy,
    /// One draw of the seeded sampler, its uniform `u` already taken from the sequence's RNG.
    Draw(Draw),
}

/// A draw's parameters, as the engine's sampler defines the draw: candidates ranked by logit
/// (ties to the lower id), the first `top_k` (0: all), then those whose weights
/// `exp((logit - max) * inv_temperature)` reach `top_p` of the total, then `u` times the kept
/// weight walks them in rank order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Draw {
    pub inv_temperature: f64,
    pub top_k: u32,
    pub top_p: f32,
    pub u: f64,
}

/// A chunk's answer from [`Backend::forward_sampled`]: its logits row, or the token where the
/// backend sampled it where the logits are.
#[derive(Debug, Clone, PartialEq)]
pub enum Logits {
    Row(Vec<f32>),
    Token(u32),
}

/// Memory a backend holds, in bytes, and how many KV pools are alive (one when awake, none asleep).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BackendMemory {
    pub weight_bytes: u64,
    pub kv_bytes: u64,
    pub kv_pools: u64,
}

pub trait Backend: Send {
    fn name(&self) -> &'static str;
    fn config(&self) -> &ModelConfig;
    /// Allocates a KV pool of `num_blocks` blocks of `block_size` tokens.
    fn allocate_kv(&mut self, num_blocks: usize, block_size: usize) -> Result<()>;
    /// Releases the KV pool (sleep).
    fn release_kv(&mut self);
    fn load_weights(&mut self, weights: ModelWeights) -> Result<()>;
    /// Loads the weights `source` names (a wake after a level-2 sleep, a weight update). A backend
    /// that computes with the weights reads them all; one that only models their size (the
    /// simulator's hash model) checks their shape and need not draw or read a byte of them.
    fn load_weights_from(&mut self, source: &WeightSource) -> Result<()> {
        self.load_weights(source.load()?)
    }
    /// Releases the weights (sleep level 2).
    fn release_weights(&mut self);
    /// Computes the batch; returns one logits row per chunk with `want_logits`, in order.
    fn forward(&mut self, batch: &ForwardBatch) -> Result<Vec<Vec<f32>>>;
    /// Computes the batch and answers each chunk that wants logits, in order: its row, or the
    /// token where `sampling[i]` (one per chunk of the batch) says how chunk i is sampled and the
    /// backend can sample it on the device (reading back a token id instead of a row of the
    /// vocabulary). A backend may answer any chunk with its row. The default returns every row.
    fn forward_sampled(&mut self, batch: &ForwardBatch, sampling: &[RowSampling]) -> Result<Vec<Logits>> {
        let _ = sampling;
        Ok(self.forward(batch)?.into_iter().map(Logits::Row).collect())
    }
    /// The K and V of `blocks`, layer by layer (for each layer: K of every block, then V).
    fn read_kv(&self, blocks: &[BlockId]) -> Result<Vec<f32>>;
    /// Writes what `read_kv` returned (from another engine of the same shape) into `blocks`.
    fn write_kv(&mut self, blocks: &[BlockId], data: &[f32]) -> Result<()>;
    /// Runs the vision encoder on one image: `num_tokens` rows of the hidden size.
    fn encode_image(&mut self, pixels: &crate::vision::PixelTensor) -> Result<Vec<f32>>;
    fn memory(&self) -> BackendMemory;
    /// Device figures beyond `memory` (a GPU backend's allocator by category, the driver's view).
    fn device_metrics(&self) -> Vec<crate::metric::Metric> {
        Vec::new()
    }
}
