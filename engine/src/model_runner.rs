//! The model runner: owns the backend, turns the scheduler's decisions into work for it, and
//! manages what the backend holds across sleep and wake.
//!
//! Each step it runs the step's encode jobs (vision encoder outputs for images whose room the
//! scheduler reserved) and then one forward pass: every scheduled chunk's tokens, positions,
//! block table and the image embeddings its positions cover, with the step's block copies first.
//! Sleep level 1 releases the KV pool, level 2 the weights too; wake restores them.

use crate::block_pool::BlockId;
use crate::encoder_cache::EncoderCache;
use crate::error::Result;
use crate::kv_manager::{BlockCopy, KvManager};
use crate::model::backend::{Backend, ForwardBatch, Logits, SeqChunk};
use crate::model::weights::WeightSource;
use crate::scheduler::{Chunk, EncodeJob};
use crate::store::RequestStore;

pub(crate) struct ModelRunner {
    backend: Box<dyn Backend>,
}

impl ModelRunner {
    pub fn new(backend: Box<dyn Backend>) -> Self {
        ModelRunner { backend }
    }

    pub fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    pub fn allocate_kv(&mut self, num_blocks: usize, block_size: usize) -> Result<()> {
        Ok(self.backend.allocate_kv(num_blocks, block_size)?)
    }

    /// Runs one encode job: the image's embeddings, or the encoder's error.
    pub fn encode(&mut self, job: &EncodeJob) -> Result<Vec<f32>> {
        Ok(self.backend.encode_image(&job.pixels)?)
    }

    /// The forward batch of a step: each chunk's tokens and block table, and the embeddings of
    /// the images whose placeholder positions it covers (held in the encoder cache while the
    /// request prefills them).
    pub fn build_batch(
        chunks: &[Chunk],
        copies: Vec<BlockCopy>,
        store: &RequestStore,
        kv: &KvManager,
        encoder: &EncoderCache,
    ) -> ForwardBatch {
        let chunks = chunks
            .iter()
            .map(|c| {
                let s = store.seq(c.seq);
                let end = c.start + c.len;
                let embeds = store
                    .requests
                    .get(&s.request)
                    .map(|r| {
                        r.images
                            .iter()
                            .filter(|i| i.start < end && i.start + i.len > c.start)
                            .map(|i| (i.start, encoder.get(i.hash).expect("encoded before its request prefills")))
                            .collect()
                    })
                    .unwrap_or_default();
                SeqChunk {
                    tokens: s.tokens[c.start..end].to_vec(),
                    start_pos: c.start,
                    block_table: kv.block_table(c.seq).to_vec(),
                    want_logits: c.want_logits,
                    embeds,
                }
            })
            .collect();
        ForwardBatch { copies, chunks }
    }

    /// For each chunk: whether its row is sampled greedily (temperature 0). A sequence whose request
    /// is gone (an orphan of an abort) samples with the defaults, so its row is never greedy here.
    pub fn greedy_rows(chunks: &[Chunk], store: &RequestStore) -> Vec<bool> {
        chunks
            .iter()
            .map(|c| {
                let request = store.seq(c.seq).request;
                store.requests.get(&request).is_some_and(|r| r.params.temperature == 0.0)
            })
            .collect()
    }

    /// Computes a batch: for each chunk that wants logits, in order, its row or (where every
    /// sequence sampling it is greedy) its argmax, picked where the backend computed the logits.
    pub fn forward(&mut self, batch: &ForwardBatch, greedy: &[bool]) -> Result<Vec<Logits>> {
        Ok(self.backend.forward_sampled(batch, greedy)?)
    }

    /// Releases the KV pool, and at level 2 the weights too.
    pub fn sleep(&mut self, level: u8) {
        self.backend.release_kv();
        if level == 2 {
            self.backend.release_weights();
        }
    }

    pub fn load_weights(&mut self, source: &WeightSource) -> Result<()> {
        Ok(self.backend.load_weights_from(source)?)
    }

    pub fn read_kv(&self, blocks: &[BlockId]) -> Result<Vec<f32>> {
        Ok(self.backend.read_kv(blocks)?)
    }

    pub fn write_kv(&mut self, blocks: &[BlockId], data: &[f32]) -> Result<()> {
        Ok(self.backend.write_kv(blocks, data)?)
    }
}
