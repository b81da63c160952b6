//! The CPU backend: the reference implementation of the Llama-style decoder over the paged KV
//! cache. Matrix products go through `matrixmultiply` (single-threaded: the core owns no threads);
//! every other operation is a plain loop written to compute each token's row independently of the
//! rest of the batch, so a sequence's logits do not depend on what it is batched with.

use crate::attention::{attend, Context};
use crate::backend::BlockId;
use crate::backend::PoolRelease;
use crate::backend::{Backend, BackendMemory, ForwardBatch};
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::{linear, rms_norm, rope};
use crate::weights::ModelWeights;

/// The KV cache: per layer, K and V for `num_blocks * block_size` slots of `kv_dim` floats.
#[derive(Debug)]
struct KvPool {
    block_size: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

impl KvPool {
    fn bytes(&self) -> u64 {
        self.k.iter().chain(&self.v).map(|t| t.len() as u64 * 4).sum()
    }
}

pub struct CpuBackend {
    config: ModelConfig,
    weights: Option<ModelWeights>,
    kv: Option<KvPool>,
    /// KV pools kept past their release: only `sleep-keeps-kv` puts anything here.
    kept_kv: Vec<KvPool>,
    pool_release: PoolRelease,
    inv_freq: Vec<f32>,
}

impl CpuBackend {
    pub fn new(weights: ModelWeights, pool_release: PoolRelease) -> Result<CpuBackend> {
        weights.config.validate()?;
        let config = weights.config.clone();
        let hd = config.head_dim;
        let inv_freq = (0..hd / 2).map(|i| 1.0 / config.rope_theta.powf((2 * i) as f32 / hd as f32)).collect();
        Ok(CpuBackend { config, weights: Some(weights), kv: None, kept_kv: Vec::new(), pool_release, inv_freq })
    }
}

fn slot(table: &[BlockId], pos: usize, block_size: usize) -> usize {
    table[pos / block_size] as usize * block_size + pos % block_size
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn allocate_kv(&mut self, num_blocks: usize, block_size: usize) -> Result<()> {
        if self.kv.is_some() {
            return Err(ModelError::Backend("KV pool already allocated".into()));
        }
        let n = num_blocks * block_size * self.config.kv_dim();
        let layers = self.config.num_hidden_layers;
        self.kv = Some(KvPool { block_size, k: vec![vec![0.0; n]; layers], v: vec![vec![0.0; n]; layers] });
        Ok(())
    }

    fn release_kv(&mut self) {
        self.pool_release.release(&mut self.kv, &mut self.kept_kv);
    }

    fn load_weights(&mut self, weights: ModelWeights) -> Result<()> {
        if weights.config != self.config {
            return Err(ModelError::Weights(format!(
                "new weights have another shape: {:?}, engine has {:?}",
                weights.config, self.config
            )));
        }
        self.weights = Some(weights);
        Ok(())
    }

    fn release_weights(&mut self) {
        self.weights = None;
    }

    fn read_kv(&self, blocks: &[BlockId]) -> Result<Vec<f32>> {
        let kv = self.kv.as_ref().ok_or_else(|| ModelError::Backend("KV pool is released".into()))?;
        let per_block = kv.block_size * self.config.kv_dim();
        let total = kv.k[0].len() / per_block;
        if let Some(b) = blocks.iter().find(|&&b| b as usize >= total) {
            return Err(ModelError::Backend(format!("block {b} is out of range (pool has {total})")));
        }
        let mut out = Vec::with_capacity(blocks.len() * per_block * 2 * kv.k.len());
        for (k, v) in kv.k.iter().zip(&kv.v) {
            for t in [k, v] {
                for &b in blocks {
                    out.extend_from_slice(&t[b as usize * per_block..(b as usize + 1) * per_block]);
                }
            }
        }
        Ok(out)
    }

    fn write_kv(&mut self, blocks: &[BlockId], data: &[f32]) -> Result<()> {
        let layers = self.config.num_hidden_layers;
        let kv = self.kv.as_mut().ok_or_else(|| ModelError::Backend("KV pool is released".into()))?;
        let per_block = kv.block_size * self.config.kv_dim();
        let total = kv.k[0].len() / per_block;
        if let Some(b) = blocks.iter().find(|&&b| b as usize >= total) {
            return Err(ModelError::Backend(format!("block {b} is out of range (pool has {total})")));
        }
        let want = blocks.len() * per_block * 2 * layers;
        if data.len() != want {
            return Err(ModelError::Backend(format!("KV data has {} floats, {want} expected", data.len())));
        }
        let mut chunks = data.chunks_exact(per_block);
        for l in 0..layers {
            for t in [&mut kv.k[l], &mut kv.v[l]] {
                for &b in blocks {
                    let c = chunks.next().expect("length checked");
                    t[b as usize * per_block..(b as usize + 1) * per_block].copy_from_slice(c);
                }
            }
        }
        Ok(())
    }

    fn encode_image(&mut self, pixels: &crate::vision::PixelTensor) -> Result<Vec<f32>> {
        let w = self.weights.as_ref().ok_or_else(|| ModelError::Backend("weights are released".into()))?;
        if self.config.vision.is_none() {
            return Err(ModelError::Backend("the model has no vision encoder".into()));
        }
        Ok(crate::vision::encode(&self.config, w, pixels))
    }

    fn memory(&self) -> BackendMemory {
        let pools = self.kv.iter().chain(&self.kept_kv);
        BackendMemory {
            weight_bytes: self.weights.as_ref().map_or(0, |w| w.bytes() as u64),
            kv_bytes: pools.clone().map(KvPool::bytes).sum(),
            kv_pools: pools.count() as u64,
        }
    }

    fn forward(&mut self, batch: &ForwardBatch) -> Result<Vec<Vec<f32>>> {
        let w = self.weights.as_ref().ok_or_else(|| ModelError::Backend("weights are released".into()))?;
        let kv = self.kv.as_mut().ok_or_else(|| ModelError::Backend("KV pool is released".into()))?;
        let c = &self.config;
        let (h, hd, nh, nkv) = (c.hidden_size, c.head_dim, c.num_attention_heads, c.num_key_value_heads);
        let (qd, kvd, inter, bs) = (c.q_dim(), c.kv_dim(), c.intermediate_size, kv.block_size);
        for cp in &batch.copies {
            let (s, d) = (cp.src as usize * bs * kvd, cp.dst as usize * bs * kvd);
            for t in kv.k.iter_mut().chain(kv.v.iter_mut()) {
                t.copy_within(s..s + bs * kvd, d);
            }
        }
        let Embedded { mut x, positions, owner } = embed(w, c, batch)?;
        let t = positions.len();
        let scale = 1.0 / (hd as f32).sqrt();
        let group = nh / nkv;
        // Offset of every position's KV slot, per chunk, computed once for all layers.
        let chunk_slots: Vec<Vec<usize>> = batch
            .chunks
            .iter()
            .map(|ch| (0..ch.start_pos + ch.tokens.len()).map(|p| slot(&ch.block_table, p, bs) * kvd).collect())
            .collect();
        for l in 0..c.num_hidden_layers {
            let lw = w.layer(l);
            let hn = rms_norm(&x, lw.attn_norm, c.rms_norm_eps);
            let mut q = linear(&hn, lw.q, t, h, qd);
            let mut k = linear(&hn, lw.k, t, h, kvd);
            let v = linear(&hn, lw.v, t, h, kvd);
            rope(&mut q, &positions, nh, hd, &self.inv_freq);
            rope(&mut k, &positions, nkv, hd, &self.inv_freq);
            let (kc, vc) = (&mut kv.k[l], &mut kv.v[l]);
            for i in 0..t {
                let s = slot(&batch.chunks[owner[i]].block_table, positions[i], bs) * kvd;
                kc[s..s + kvd].copy_from_slice(&k[i * kvd..(i + 1) * kvd]);
                vc[s..s + kvd].copy_from_slice(&v[i * kvd..(i + 1) * kvd]);
            }
            let mut attn = vec![0.0f32; t * qd];
            let mut scores = Vec::new();
            let gd = group * hd;
            for (i, (qi, ai)) in q.chunks_exact(qd).zip(attn.chunks_exact_mut(qd)).enumerate() {
                let slots = &chunk_slots[owner[i]][..positions[i] + 1];
                // One pass over the context per KV head serves every query head of its group.
                for (g, (gq, go)) in qi.chunks_exact(gd).zip(ai.chunks_exact_mut(gd)).enumerate() {
                    let ctx = Context { k: kc, v: vc, slots, off: g * hd, hd, scale };
                    attend(gq, &ctx, &mut scores, go);
                }
            }
            let o = linear(&attn, lw.o, t, qd, h);
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
            let hn = rms_norm(&x, lw.mlp_norm, c.rms_norm_eps);
            let g = linear(&hn, lw.gate, t, h, inter);
            let u = linear(&hn, lw.up, t, h, inter);
            let act: Vec<f32> = g.iter().zip(&u).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
            let d = linear(&act, lw.down, t, inter, h);
            x.iter_mut().zip(&d).for_each(|(a, b)| *a += b);
        }
        // Logits for the last position of each chunk that wants them.
        let mut rows = Vec::new();
        let mut end = 0;
        for ch in &batch.chunks {
            end += ch.tokens.len();
            if ch.want_logits && !ch.tokens.is_empty() {
                rows.extend_from_slice(&x[(end - 1) * h..end * h]);
            }
        }
        let n_rows = rows.len() / h;
        let normed = rms_norm(&rows, w.final_norm(), c.rms_norm_eps);
        let logits = linear(&normed, w.lm_head(), n_rows, h, c.vocab_size);
        Ok(logits.chunks_exact(c.vocab_size).map(<[f32]>::to_vec).collect())
    }
}

/// A batch flattened to its tokens: `x` their embeddings (row `t` of width `hidden_size`, image
/// placeholders taking the encoder's rows), token `t` of chunk `owner[t]` at `positions[t]`.
struct Embedded {
    x: Vec<f32>,
    positions: Vec<usize>,
    owner: Vec<usize>,
}

/// The batch's tokens embedded, image placeholders replaced by the encoder's embeddings; a token
/// outside the vocabulary is the backend's error.
fn embed(w: &ModelWeights, c: &ModelConfig, batch: &ForwardBatch) -> Result<Embedded> {
    let h = c.hidden_size;
    // Flatten the batch: token t belongs to chunk owner[t] at position positions[t].
    let mut tokens = Vec::new();
    let mut positions = Vec::new();
    let mut owner = Vec::new();
    for (ci, ch) in batch.chunks.iter().enumerate() {
        for (j, &tok) in ch.tokens.iter().enumerate() {
            if tok as usize >= c.vocab_size {
                return Err(ModelError::Backend(format!("token id {tok} outside the vocabulary")));
            }
            tokens.push(tok);
            positions.push(ch.start_pos + j);
            owner.push(ci);
        }
    }
    let t = tokens.len();
    let mut x = vec![0.0f32; t * h];
    for (row, &tok) in x.chunks_exact_mut(h).zip(&tokens) {
        row.copy_from_slice(&w.embed()[tok as usize * h..(tok as usize + 1) * h]);
    }
    // Image placeholders take the encoder's embeddings.
    let mut base = 0;
    for ch in &batch.chunks {
        for (img_start, e) in &ch.embeds {
            let rows = e.len() / h;
            for j in 0..ch.tokens.len() {
                let pos = ch.start_pos + j;
                if pos >= *img_start && pos < img_start + rows {
                    let r = pos - img_start;
                    x[(base + j) * h..(base + j + 1) * h].copy_from_slice(&e[r * h..(r + 1) * h]);
                }
            }
        }
        base += ch.tokens.len();
    }
    Ok(Embedded { x, positions, owner })
}
