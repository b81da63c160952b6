//! A fast deterministic model backend for the simulator: pseudo-logits from a hash of the token
//! history, so that a simulated node spends microseconds per step instead of a forward pass.
//!
//! It is still a faithful backend for what the simulation checks: every KV slot holds the hash of
//! the history up to its position (the previous slot's hash mixed with the token, or with the image
//! embedding at placeholder positions), so a logit depends on everything in the sequence's blocks.
//! A block copied to the wrong place, a transfer that loses or mixes bytes, or a slot read before
//! it was written changes the tokens, exactly as it would with a real model. Transferred KV is a
//! slot hash split into three exact 24-bit integers per slot; `write_kv` refuses anything else.
//!
//! It releases its KV pool through `PoolRelease::release`, like every backend, so
//! `sleep-keeps-kv` keeps the pool here as it does on the CPU and the GPU.

use plateau_engine::block_pool::BlockId;
use plateau_engine::model::backend::PoolRelease;
use plateau_engine::model::backend::{Backend, BackendMemory, ForwardBatch};
use plateau_engine::model::error::ModelError;
use plateau_engine::model::vision;
use plateau_engine::multimodal::image::PixelTensor;
use plateau_engine::{ModelConfig, ModelWeights, WeightSource};

type Result<T> = std::result::Result<T, ModelError>;

/// Floats per slot in transferred KV: 64 bits as three integers below 2^24.
const FLOATS_PER_SLOT: usize = 3;
const EMPTY_SLOT: u64 = 0x5E_ED0F_E4A7_7A11;

const MIX_B: u64 = 0x9E37_79B9_7F4A_7C15;

pub fn mix(a: u64, b: u64) -> u64 {
    mix_scaled(a, b.wrapping_mul(MIX_B))
}

/// [`mix`] of `a` and `b`, given `b * MIX_B` (wrapping): the logits' vocabulary term, made once.
fn mix_scaled(a: u64, b_scaled: u64) -> u64 {
    let mut z = a ^ b_scaled;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

struct HashPool {
    block_size: usize,
    slots: Vec<u64>,
}

impl HashPool {
    fn bytes(&self) -> u64 {
        self.slots.len() as u64 * 8
    }
}

pub struct HashBackend {
    config: ModelConfig,
    /// Bytes a real model of this shape would hold: what the memory figures report.
    weight_bytes: Option<u64>,
    kv: Option<HashPool>,
    kept_kv: Vec<HashPool>,
    pool_release: PoolRelease,
    /// Each token id times `MIX_B`, for the logits of every step.
    vocab_scaled: Vec<u64>,
}

impl HashBackend {
    pub fn new(config: ModelConfig, pool_release: PoolRelease) -> Self {
        let weight_bytes = Some(weight_bytes(&config));
        let vocab_scaled = (0..config.vocab_size as u64).map(|v| v.wrapping_mul(MIX_B)).collect();
        HashBackend { config, weight_bytes, kv: None, kept_kv: Vec::new(), pool_release, vocab_scaled }
    }
}

fn weight_bytes(c: &ModelConfig) -> u64 {
    plateau_engine::model::weights::tensor_specs(c)
        .iter()
        .map(|(_, shape)| shape.iter().product::<usize>() as u64 * 4)
        .sum()
}

fn slot(table: &[BlockId], pos: usize, block_size: usize) -> Result<usize> {
    let b = table.get(pos / block_size).ok_or_else(|| {
        ModelError::Backend(format!("position {pos} is past the block table ({} blocks)", table.len()))
    })?;
    Ok(*b as usize * block_size + pos % block_size)
}

fn row_hash(row: &[f32]) -> u64 {
    row.iter().fold(0xE3B0_C442_98FC_1C14, |h, v| mix(h, u64::from(v.to_bits())))
}

impl Backend for HashBackend {
    fn name(&self) -> &'static str {
        "hash"
    }

    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn allocate_kv(&mut self, num_blocks: usize, block_size: usize) -> Result<()> {
        if self.kv.is_some() {
            return Err(ModelError::Backend("KV pool already allocated".into()));
        }
        self.kv = Some(HashPool { block_size, slots: vec![EMPTY_SLOT; num_blocks * block_size] });
        Ok(())
    }

    fn release_kv(&mut self) {
        self.pool_release.release(&mut self.kv, &mut self.kept_kv);
    }

    fn load_weights(&mut self, weights: ModelWeights) -> Result<()> {
        if weights.config != self.config {
            return Err(ModelError::Weights("new weights have another shape".into()));
        }
        self.weight_bytes = Some(weight_bytes(&self.config));
        Ok(())
    }

    /// The hash model computes with no weights: a new source's shape is checked and its size
    /// counted, and none of it is drawn (drawing the tiny preset's weights at every wake was half
    /// of a sweep's time).
    fn load_weights_from(&mut self, source: &WeightSource) -> Result<()> {
        if source.config()? != self.config {
            return Err(ModelError::Weights("new weights have another shape".into()));
        }
        self.weight_bytes = Some(weight_bytes(&self.config));
        Ok(())
    }

    fn release_weights(&mut self) {
        self.weight_bytes = None;
    }

    fn forward(&mut self, batch: &ForwardBatch) -> Result<Vec<Vec<f32>>> {
        if self.weight_bytes.is_none() {
            return Err(ModelError::Backend("weights are released".into()));
        }
        let kv = self.kv.as_mut().ok_or_else(|| ModelError::Backend("KV pool is released".into()))?;
        let bs = kv.block_size;
        for c in &batch.copies {
            let (s, d) = (c.src as usize * bs, c.dst as usize * bs);
            kv.slots.copy_within(s..s + bs, d);
        }
        let hidden = self.config.hidden_size;
        let mut logits = Vec::new();
        for chunk in &batch.chunks {
            let mut h = 0;
            for (i, &tok) in chunk.tokens.iter().enumerate() {
                let pos = chunk.start_pos + i;
                let prev = if pos == 0 { EMPTY_SLOT } else { kv.slots[slot(&chunk.block_table, pos - 1, bs)?] };
                let embed = chunk.embeds.iter().find_map(|(start, rows)| {
                    let r = pos.checked_sub(*start)?;
                    rows.get(r * hidden..(r + 1) * hidden).map(row_hash)
                });
                h = mix(mix(prev, u64::from(tok)), embed.unwrap_or(pos as u64));
                kv.slots[slot(&chunk.block_table, pos, bs)?] = h;
            }
            if chunk.want_logits {
                logits.push(self.vocab_scaled.iter().map(|&v| ((mix_scaled(h, v) >> 40) as f32) / 65536.0).collect());
            }
        }
        Ok(logits)
    }

    fn read_kv(&self, blocks: &[BlockId]) -> Result<Vec<f32>> {
        let kv = self.kv.as_ref().ok_or_else(|| ModelError::Backend("KV pool is released".into()))?;
        let mut out = Vec::with_capacity(blocks.len() * kv.block_size * FLOATS_PER_SLOT);
        for &b in blocks {
            let start = b as usize * kv.block_size;
            let slots = kv.slots.get(start..start + kv.block_size).ok_or_else(|| {
                ModelError::Backend(format!("block {b} is outside the pool of {} slots", kv.slots.len()))
            })?;
            for &h in slots {
                out.extend([h & 0xFF_FFFF, (h >> 24) & 0xFF_FFFF, h >> 48].map(|x| x as f32));
            }
        }
        Ok(out)
    }

    fn write_kv(&mut self, blocks: &[BlockId], data: &[f32]) -> Result<()> {
        let kv = self.kv.as_mut().ok_or_else(|| ModelError::Backend("KV pool is released".into()))?;
        let per_block = kv.block_size * FLOATS_PER_SLOT;
        if data.len() != blocks.len() * per_block {
            return Err(ModelError::Backend(format!(
                "KV data of {} floats for {} blocks of {per_block}",
                data.len(),
                blocks.len()
            )));
        }
        for (&b, chunk) in blocks.iter().zip(data.chunks_exact(per_block)) {
            let start = b as usize * kv.block_size;
            if start + kv.block_size > kv.slots.len() {
                return Err(ModelError::Backend(format!("block {b} is outside the pool")));
            }
            for (i, f) in chunk.chunks_exact(FLOATS_PER_SLOT).enumerate() {
                let part = |x: f32| -> Result<u64> {
                    if x.fract() != 0.0 || !(0.0..16_777_216.0).contains(&x) {
                        return Err(ModelError::Backend(format!("KV data is not this backend's: {x}")));
                    }
                    Ok(x as u64)
                };
                kv.slots[start + i] = part(f[0])? | part(f[1])? << 24 | part(f[2])? << 48;
            }
        }
        Ok(())
    }

    fn encode_image(&mut self, pixels: &PixelTensor) -> Result<Vec<f32>> {
        let v =
            self.config.vision.as_ref().ok_or_else(|| ModelError::Backend("the model has no vision encoder".into()))?;
        let n = vision::num_tokens(v, pixels.width, pixels.height);
        let hidden = self.config.hidden_size;
        Ok((0..n * hidden).map(|i| ((mix(pixels.hash, i as u64) >> 40) as f32) / 16_777_216.0).collect())
    }

    fn memory(&self) -> BackendMemory {
        let pools = self.kv.iter().chain(&self.kept_kv);
        BackendMemory {
            weight_bytes: self.weight_bytes.unwrap_or(0),
            kv_bytes: pools.clone().map(HashPool::bytes).sum(),
            kv_pools: pools.count() as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plateau_engine::model::backend::SeqChunk;
    use plateau_engine::{Injection, Injections};

    fn backend() -> HashBackend {
        let mut b = HashBackend::new(ModelConfig::preset("tiny").unwrap(), PoolRelease::Drop);
        b.allocate_kv(8, 4).unwrap();
        b
    }

    fn chunk(tokens: Vec<u32>, start_pos: usize, table: Vec<BlockId>) -> SeqChunk {
        SeqChunk { tokens, start_pos, block_table: table, want_logits: true, embeds: Vec::new() }
    }

    #[test]
    fn logits_depend_on_the_whole_history_and_survive_a_transfer() {
        let mut a = backend();
        let whole =
            a.forward(&ForwardBatch { copies: vec![], chunks: vec![chunk(vec![1, 2, 3, 4, 5], 0, vec![0, 1])] });
        let mut b = backend();
        b.forward(&ForwardBatch { copies: vec![], chunks: vec![chunk(vec![1, 2, 3, 4], 0, vec![2])] }).unwrap();
        let data = b.read_kv(&[2]).unwrap();
        a.write_kv(&[5], &data).unwrap();
        let resumed = a.forward(&ForwardBatch { copies: vec![], chunks: vec![chunk(vec![5], 4, vec![5, 6])] });
        assert_eq!(whole.unwrap(), resumed.unwrap());
        let other = backend()
            .forward(&ForwardBatch { copies: vec![], chunks: vec![chunk(vec![9, 2, 3, 4, 5], 0, vec![0, 1])] });
        assert_ne!(
            other.unwrap(),
            a.forward(&ForwardBatch { copies: vec![], chunks: vec![chunk(vec![5], 4, vec![5, 6])] }).unwrap()
        );
    }

    #[test]
    fn foreign_kv_data_is_refused() {
        let mut a = backend();
        assert!(a.write_kv(&[0], &[0.5; 12]).is_err());
        assert!(a.write_kv(&[0], &[1.0; 11]).is_err());
        assert!(a.write_kv(&[99], &[1.0; 12]).is_err());
    }

    #[test]
    fn sleep_keeps_kv_keeps_the_pool() {
        let mut b = HashBackend::new(
            ModelConfig::preset("tiny").unwrap(),
            Injections::none().with(Injection::SleepKeepsKv).pool_release(),
        );
        b.allocate_kv(8, 4).unwrap();
        b.release_kv();
        b.allocate_kv(8, 4).unwrap();
        assert_eq!(b.memory().kv_pools, 2);
    }
}
