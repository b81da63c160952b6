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
use crate::model::backend::{Backend, Draw, ForwardBatch, Logits, RowSampling, SeqChunk};
use crate::model::weights::WeightSource;
use crate::sampler;
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

    /// How each chunk's row is sampled, for a backend that samples on the device: greedily, or
    /// with one draw taken here from the sequence's RNG (the draw `sampler::sample` would take
    /// after the pass, in the same order), where exactly one sequence samples the row with its
    /// request's parameters. A row sampled more than once (an n > 1 request's first token, taken
    /// by every sequence it forks into) or by an orphan of an abort (the defaults) stays a row.
    pub fn plan_sampling(chunks: &[Chunk], store: &mut RequestStore) -> Vec<RowSampling> {
        chunks
            .iter()
            .map(|c| {
                let request = store.seq(c.seq).request;
                let Some(r) = store.requests.get(&request) else { return RowSampling::Row };
                let p = &r.params;
                if !c.want_logits || (!r.forked && p.n > 1) {
                    RowSampling::Row
                } else if p.temperature == 0.0 {
                    RowSampling::Greedy
                } else {
                    let (inv_temperature, top_k, top_p) = (1.0 / p.temperature as f64, p.top_k, p.top_p);
                    let u = sampler::uniform(&mut store.seq_mut(c.seq).rng);
                    RowSampling::Draw(Draw { inv_temperature, top_k, top_p, u })
                }
            })
            .collect()
    }

    /// Computes a batch: for each chunk that wants logits, in order, its row or (where the plan
    /// allows and the backend samples on the device) its token.
    pub fn forward(&mut self, batch: &ForwardBatch, sampling: &[RowSampling]) -> Result<Vec<Logits>> {
        Ok(self.backend.forward_sampled(batch, sampling)?)
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
