//! The forward pass on the device: embeddings (image rows scattered in), the first norm, then every
//! layer on one stream in nine launches or so: the fused QKV product, rotary positions and the KV
//! store in one kernel, attention by the plan (decode, its split merge, prefill tiles), the output
//! product, the residual add with the next norm, the fused gate-up product, SwiGLU, the down
//! product, and the residual add with the next layer's norm. Then the final norm and LM head for
//! the rows that want logits, sampled on the device where the engine's plan allows (a greedy row's
//! argmax, a row's seeded draw: a token id is all that comes back), every other row read back
//! whole. Activations and metadata live for the call only.

use super::attention::{AttentionIo, AttentionMeta, AttentionPlan};
use super::backend::{CudaBackend, DeviceKv, DeviceWeights};
use super::batch::{flatten, Flat};
use super::device::Category;
use super::kernels::{cfg, elementwise, Arg};
use crate::backend::{ForwardBatch, Logits, RowSampling};
use crate::error::{ModelError, Result};

/// The pass's integer metadata packed into one upload: each section's offset in values.
#[derive(Default)]
struct Packed {
    values: Vec<i32>,
}

impl Packed {
    fn push(&mut self, section: &[i32]) -> usize {
        let at = self.values.len();
        self.values.extend_from_slice(section);
        at
    }
}

impl CudaBackend {
    /// Computes `batch`; `sampling` (one per chunk, or empty: every row back) says which rows may
    /// be sampled on the device.
    pub(super) fn forward_batch(&mut self, batch: &ForwardBatch, sampling: &[RowSampling]) -> Result<Vec<Logits>> {
        let w = self.weights.as_ref().ok_or_else(|| ModelError::Backend("weights are released".into()))?;
        let kv = self.kv.as_ref().ok_or_else(|| ModelError::Backend("KV pool is released".into()))?;
        let c = &self.config;
        let (h, hd, nh, nkv) = (c.hidden_size, c.head_dim, c.num_attention_heads, c.num_key_value_heads);
        let (qd, kvd, inter, bs) = (c.q_dim(), c.kv_dim(), c.intermediate_size, kv.block_size);
        let dt = self.dtype;
        self.copy_blocks(batch, kv, bs * kvd)?;
        let f = flatten(batch, c, bs)?;
        let t = f.tokens.len();
        if t == 0 {
            return Ok(Vec::new());
        }
        let tensor_cores = dt == super::DType::Bf16 && self.kernels.tensor_cores();
        let plan = AttentionPlan::new(&f, c, bs, tensor_cores)?;
        let mut packed = Packed::default();
        let tokens: Vec<i32> = f.tokens.iter().map(|&x| x as i32).collect();
        let at = [
            packed.push(&tokens),
            packed.push(&f.positions),
            packed.push(&f.tok_seq),
            packed.push(&f.tables),
            packed.push(&plan.decode_rows),
            packed.push(&plan.tile_first),
            packed.push(&plan.tile_len),
        ];
        let meta_buf = self.alloc.upload(Category::Workspace, &packed.values, "the pass's metadata")?;
        let [tokens, positions, tok_seq, tables, decode_rows, tile_first, tile_len] =
            at.map(|o| meta_buf.ptr() + 4 * o as u64);
        let slots = self.alloc.upload(Category::Workspace, &f.slots, "KV slots")?;
        let part = self.split_states(&plan)?;
        let meta = AttentionMeta {
            tok_seq,
            positions,
            tables,
            max_blocks: f.max_blocks,
            decode_rows,
            tile_first,
            tile_len,
            part: part.as_ref().map_or(0, |b| b.ptr()),
        };
        let qkv_len = qd + 2 * kvd;
        let x = self.act(t * h, "hidden states")?;
        let hn = self.act(t * h, "normed hidden states")?;
        let qkv = self.act(t * qkv_len, "queries, keys and values")?;
        let attn = self.act(t * qd, "attention output")?;
        let tmp = self.act(t * h, "projection output")?;
        let gate_up = self.act(t * 2 * inter, "gate and up")?;
        let act = self.act(t * inter, "SwiGLU output")?;
        let rows = (t as u32, 1);
        self.kernels.launch(
            "embed",
            dt,
            cfg(rows, h.min(1024) as u32, 0),
            &[Arg::P(w.embed.ptr()), Arg::P(tokens), Arg::P(x.ptr()), Arg::I(h as i32)],
        )?;
        self.set_image_rows(&f, x.ptr(), h)?;
        self.rmsnorm(x.ptr(), 0, w.layers[0].attn_norm.ptr(), hn.ptr(), t)?;
        for (l, lw) in w.layers.iter().enumerate() {
            self.linear(hn.ptr(), lw.qkv.ptr(), qkv.ptr(), t, h, qkv_len)?;
            let args = [
                Arg::P(qkv.ptr()),
                Arg::P(positions),
                Arg::P(w.inv_freq.ptr()),
                Arg::P(kv.k[l].ptr()),
                Arg::P(kv.v[l].ptr()),
                Arg::P(slots.ptr()),
                Arg::I(nh as i32),
                Arg::I(nkv as i32),
                Arg::I(hd as i32),
            ];
            self.kernels.launch("rope_store", dt, cfg(rows, ((nh + nkv) * hd / 2) as u32, 0), &args)?;
            let io = AttentionIo {
                qkv: qkv.ptr(),
                qkv_stride: qkv_len,
                k_cache: kv.k[l].ptr(),
                v_cache: kv.v[l].ptr(),
                out: attn.ptr(),
            };
            self.attention(&plan, &meta, &io)?;
            self.linear(attn.ptr(), lw.o.ptr(), tmp.ptr(), t, qd, h)?;
            self.add_rmsnorm(x.ptr(), tmp.ptr(), lw.mlp_norm.ptr(), hn.ptr(), t)?;
            self.linear(hn.ptr(), lw.gate_up.ptr(), gate_up.ptr(), t, h, 2 * inter)?;
            let n = (t * inter) as i64;
            let args = [Arg::P(gate_up.ptr()), Arg::P(act.ptr()), Arg::I(inter as i32), Arg::L(n)];
            self.kernels.launch("silu_mul", dt, elementwise(t * inter), &args)?;
            self.linear(act.ptr(), lw.down.ptr(), tmp.ptr(), t, inter, h)?;
            match w.layers.get(l + 1) {
                Some(next) => self.add_rmsnorm(x.ptr(), tmp.ptr(), next.attn_norm.ptr(), hn.ptr(), t)?,
                None => self.residual_add(x.ptr(), tmp.ptr(), t * h)?,
            }
        }
        let plan: Vec<RowSampling> =
            f.logit_chunks.iter().map(|&ci| sampling.get(ci).copied().unwrap_or(RowSampling::Row)).collect();
        self.logits(x.ptr(), w, &f.logit_rows, &plan)
    }

    /// Copy-on-write: each (src, dst) pair of the batch's block copies, `block_elems` values of
    /// each layer's K and V.
    fn copy_blocks(&self, batch: &ForwardBatch, kv: &DeviceKv, block_elems: usize) -> Result<()> {
        if batch.copies.is_empty() {
            return Ok(());
        }
        let pairs: Vec<i32> = batch.copies.iter().flat_map(|cp| [cp.src as i32, cp.dst as i32]).collect();
        let pairs = self.alloc.upload(Category::Workspace, &pairs, "copy-on-write block pairs")?;
        let args = [Arg::P(kv.bases.ptr()), Arg::P(pairs.ptr()), Arg::I(block_elems as i32)];
        let grid = (batch.copies.len() as u32, (2 * kv.k.len()) as u32);
        self.kernels.launch("copy_blocks", self.dtype, cfg(grid, 256, 0), &args)
    }

    /// Image placeholders' rows of the hidden states `x` set to the encoder's embeddings.
    fn set_image_rows(&self, f: &Flat, x: u64, h: usize) -> Result<()> {
        if f.embed_rows.is_empty() {
            return Ok(());
        }
        let er = self.alloc.upload(Category::Workspace, &f.embed_rows, "image rows")?;
        let ed = self.alloc.upload(Category::Workspace, &f.embed_data, "image embeddings")?;
        let grid = (f.embed_rows.len() as u32, 1);
        self.kernels.launch(
            "set_rows",
            self.dtype,
            cfg(grid, h.min(1024) as u32, 0),
            &[Arg::P(x), Arg::P(ed.ptr()), Arg::P(er.ptr()), Arg::I(h as i32)],
        )
    }

    /// The final norm and LM head for the rows of `x` that want logits, answered by `plan`: greedy
    /// rows with their argmax and draws with their token, both picked on the device; rows (and any
    /// draw the device left undecided) read back to the host as f32, only when some row needs it.
    /// Nothing is computed, after the stream finished, where no row wants any.
    fn logits(&self, x: u64, w: &DeviceWeights, logit_rows: &[i32], plan: &[RowSampling]) -> Result<Vec<Logits>> {
        let (h, vocab) = (self.config.hidden_size, self.config.vocab_size);
        let r = logit_rows.len();
        if r == 0 {
            self.synchronize()?;
            return Ok(Vec::new());
        }
        let lr = self.alloc.upload(Category::Workspace, logit_rows, "logit rows")?;
        let normed = self.act(r * h, "final normed rows")?;
        self.rmsnorm(x, lr.ptr(), w.final_norm.ptr(), normed.ptr(), r)?;
        let logits = self.act(r * vocab, "logits")?;
        self.linear(normed.ptr(), w.lm_head.ptr(), logits.ptr(), r, h, vocab)?;
        let greedy = self.argmax_on_device(logits.ptr(), plan)?;
        let drawn = self.draw_on_device(logits.ptr(), plan)?;
        let token = |i: usize| match plan[i] {
            RowSampling::Greedy => greedy.get(i).copied(),
            RowSampling::Draw(_) => drawn.get(i).copied().filter(|&t| t != UNDECIDED),
            RowSampling::Row => None,
        };
        let rows: Vec<f32> = if (0..r).all(|i| token(i).is_some()) {
            Vec::new()
        } else {
            let out = self.alloc.alloc(Category::Staging, r * vocab * 4, "logits for the host")?;
            let args = [Arg::P(logits.ptr()), Arg::P(out.ptr()), Arg::L((r * vocab) as i64)];
            self.kernels.launch("to_f32", self.dtype, elementwise(r * vocab), &args)?;
            out.read(r * vocab)?
        };
        Ok((0..r)
            .map(|i| match token(i) {
                Some(t) => Logits::Token(t),
                None => Logits::Row(rows[i * vocab..(i + 1) * vocab].to_vec()),
            })
            .collect())
    }

    /// Greedy rows' tokens (argmax_rows over every logit row), where the plan has any.
    fn argmax_on_device(&self, logits: u64, plan: &[RowSampling]) -> Result<Vec<u32>> {
        if !plan.contains(&RowSampling::Greedy) {
            return Ok(Vec::new());
        }
        let r = plan.len();
        let ids = self.alloc.alloc(Category::Staging, r * 4, "greedy token ids")?;
        let args = [Arg::P(logits), Arg::P(ids.ptr()), Arg::I(self.config.vocab_size as i32)];
        self.kernels.launch("argmax_rows", self.dtype, cfg((r as u32, 1), SAMPLE_THREADS, 0), &args)?;
        ids.read(r)
    }

    /// Drawn rows' tokens (sample_rows over every logit row), where the plan has any.
    fn draw_on_device(&self, logits: u64, plan: &[RowSampling]) -> Result<Vec<u32>> {
        if !plan.iter().any(|p| matches!(p, RowSampling::Draw(_))) {
            return Ok(Vec::new());
        }
        let r = plan.len();
        // Four doubles a row (sampling.cu); a row not drawn gets a harmless draw.
        let params: Vec<f64> = plan
            .iter()
            .flat_map(|p| match p {
                RowSampling::Draw(d) => [d.inv_temperature, d.top_k as f64, d.top_p as f64, d.u],
                _ => [1.0, 0.0, 1.0, 0.0],
            })
            .collect();
        let params = self.alloc.upload(Category::Workspace, &params, "draw parameters")?;
        let ids = self.alloc.alloc(Category::Staging, r * 4, "drawn token ids")?;
        let args = [Arg::P(logits), Arg::P(params.ptr()), Arg::P(ids.ptr()), Arg::I(self.config.vocab_size as i32)];
        self.kernels.launch("sample_rows", self.dtype, cfg((r as u32, 1), SAMPLE_THREADS, 0), &args)?;
        ids.read(r)
    }
}

/// What sample_rows answers for a row the host must sample (sampling.cu).
const UNDECIDED: u32 = u32::MAX;

/// Threads of a sampling block: a row of 32,000 logits is 32 a thread.
const SAMPLE_THREADS: u32 = 1024;
