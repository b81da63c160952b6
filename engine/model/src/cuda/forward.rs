//! The forward pass on the device: embeddings (image rows scattered in), then every layer
//! (RMSNorm, QKV, RoPE, KV store by slot, paged attention, output projection, SwiGLU MLP, residuals)
//! on one stream, the final norm and LM head for the rows that want logits, and those logits read
//! back to the host. Activations and metadata live for the call only.

use super::backend::{CudaBackend, DeviceKv, DeviceWeights};
use super::batch::{flatten, Flat};
use super::device::Category;
use super::kernels::{cfg, elementwise, Arg};
use crate::backend::ForwardBatch;
use crate::error::{ModelError, Result};

impl CudaBackend {
    pub(super) fn forward_batch(&mut self, batch: &ForwardBatch) -> Result<Vec<Vec<f32>>> {
        let w = self.weights.as_ref().ok_or_else(|| ModelError::Backend("weights are released".into()))?;
        let kv = self.kv.as_ref().ok_or_else(|| ModelError::Backend("KV pool is released".into()))?;
        let c = &self.config;
        let (h, hd, nh, nkv) = (c.hidden_size, c.head_dim, c.num_attention_heads, c.num_key_value_heads);
        let (qd, kvd, inter, bs) = (c.q_dim(), c.kv_dim(), c.intermediate_size, kv.block_size);
        let dt = self.dtype;
        let ws = |data: &[i32], what: &str| self.alloc.upload(Category::Workspace, data, what);
        self.copy_blocks(batch, kv, bs * kvd)?;
        let f = flatten(batch, c, bs)?;
        let t = f.tokens.len();
        if t == 0 {
            return Ok(Vec::new());
        }
        let tokens = self.alloc.upload(Category::Workspace, &f.tokens, "token ids")?;
        let positions = ws(&f.positions, "positions")?;
        let tok_seq = ws(&f.tok_seq, "token owners")?;
        let tables = ws(&f.tables, "block tables")?;
        let slots = self.alloc.upload(Category::Workspace, &f.slots, "KV slots")?;
        let x = self.act(t * h, "hidden states")?;
        let hn = self.act(t * h, "normed hidden states")?;
        let q = self.act(t * qd, "queries")?;
        let k = self.act(t * kvd, "keys")?;
        let v = self.act(t * kvd, "values")?;
        let attn = self.act(t * qd, "attention output")?;
        let tmp = self.act(t * h, "projection output")?;
        let gate = self.act(t * inter, "gate")?;
        let upb = self.act(t * inter, "up")?;
        let threads = h.min(1024) as u32;
        let rows = (t as u32, 1);
        self.kernels.launch(
            "embed",
            dt,
            cfg(rows, threads, 0),
            &[Arg::P(w.embed.ptr()), Arg::P(tokens.ptr()), Arg::P(x.ptr()), Arg::I(h as i32)],
        )?;
        self.set_image_rows(&f, x.ptr(), h, threads)?;
        let scale = 1.0 / (hd as f32).sqrt();
        let attn_shared = attention_shared_bytes(hd, f.max_ctx, ATTENTION_THREADS)?;
        for (l, lw) in w.layers.iter().enumerate() {
            self.rmsnorm(x.ptr(), 0, lw.attn_norm.ptr(), hn.ptr(), t)?;
            self.linear(hn.ptr(), lw.q.ptr(), q.ptr(), t, h, qd)?;
            self.linear(hn.ptr(), lw.k.ptr(), k.ptr(), t, h, kvd)?;
            self.linear(hn.ptr(), lw.v.ptr(), v.ptr(), t, h, kvd)?;
            for (buf, heads) in [(&q, nh), (&k, nkv)] {
                self.rope(buf.ptr(), positions.ptr(), w.inv_freq.ptr(), heads, hd, t)?;
            }
            let args = [
                Arg::P(k.ptr()),
                Arg::P(v.ptr()),
                Arg::P(kv.k[l].ptr()),
                Arg::P(kv.v[l].ptr()),
                Arg::P(slots.ptr()),
                Arg::I(kvd as i32),
            ];
            self.kernels.launch("store_kv", dt, cfg(rows, kvd as u32, 0), &args)?;
            let args = [
                Arg::P(q.ptr()),
                Arg::P(kv.k[l].ptr()),
                Arg::P(kv.v[l].ptr()),
                Arg::P(attn.ptr()),
                Arg::P(tok_seq.ptr()),
                Arg::P(positions.ptr()),
                Arg::P(tables.ptr()),
                Arg::I(f.max_blocks as i32),
                Arg::I(bs as i32),
                Arg::I(nh as i32),
                Arg::I(nkv as i32),
                Arg::I(hd as i32),
                Arg::F(scale),
            ];
            self.kernels.launch(
                "attention",
                dt,
                cfg((t as u32, nh as u32), ATTENTION_THREADS as u32, attn_shared),
                &args,
            )?;
            self.linear(attn.ptr(), lw.o.ptr(), tmp.ptr(), t, qd, h)?;
            self.residual_add(x.ptr(), tmp.ptr(), t * h)?;
            self.rmsnorm(x.ptr(), 0, lw.mlp_norm.ptr(), hn.ptr(), t)?;
            self.linear(hn.ptr(), lw.gate.ptr(), gate.ptr(), t, h, inter)?;
            self.linear(hn.ptr(), lw.up.ptr(), upb.ptr(), t, h, inter)?;
            let n = (t * inter) as i64;
            self.kernels.launch(
                "silu_mul",
                dt,
                elementwise(t * inter),
                &[Arg::P(gate.ptr()), Arg::P(upb.ptr()), Arg::P(gate.ptr()), Arg::L(n)],
            )?;
            self.linear(gate.ptr(), lw.down.ptr(), tmp.ptr(), t, inter, h)?;
            self.residual_add(x.ptr(), tmp.ptr(), t * h)?;
        }
        self.logits(x.ptr(), w, &f.logit_rows, h, c.vocab_size)
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
    fn set_image_rows(&self, f: &Flat, x: u64, h: usize, threads: u32) -> Result<()> {
        if f.embed_rows.is_empty() {
            return Ok(());
        }
        let er = self.alloc.upload(Category::Workspace, &f.embed_rows, "image rows")?;
        let ed = self.alloc.upload(Category::Workspace, &f.embed_data, "image embeddings")?;
        let grid = (f.embed_rows.len() as u32, 1);
        self.kernels.launch(
            "set_rows",
            self.dtype,
            cfg(grid, threads, 0),
            &[Arg::P(x), Arg::P(ed.ptr()), Arg::P(er.ptr()), Arg::I(h as i32)],
        )
    }

    /// Rotary positions applied in place to `t` rows of `heads` heads of `hd` dimensions.
    fn rope(&self, buf: u64, positions: u64, inv_freq: u64, heads: usize, hd: usize, t: usize) -> Result<()> {
        let args = [Arg::P(buf), Arg::P(positions), Arg::P(inv_freq), Arg::I(heads as i32), Arg::I(hd as i32)];
        self.kernels.launch("rope", self.dtype, cfg((t as u32, 1), (heads * hd / 2) as u32, 0), &args)
    }

    /// The final norm and LM head for the rows of `x` that want logits, read back to the host as
    /// f32, a vector of `vocab` per row (none, after the stream finished, where no row wants any).
    fn logits(&self, x: u64, w: &DeviceWeights, logit_rows: &[i32], h: usize, vocab: usize) -> Result<Vec<Vec<f32>>> {
        let dt = self.dtype;
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
        let out = self.alloc.alloc(Category::Staging, r * vocab * 4, "logits for the host")?;
        self.kernels.launch(
            "to_f32",
            dt,
            elementwise(r * vocab),
            &[Arg::P(logits.ptr()), Arg::P(out.ptr()), Arg::L((r * vocab) as i64)],
        )?;
        let host: Vec<f32> = out.read(r * vocab)?;
        Ok(host.chunks_exact(vocab).map(<[f32]>::to_vec).collect())
    }
}

/// Threads of an attention block: for a head of 64 dimensions, four groups that each sum a quarter
/// of the positions (kernels.cu's `attention`). A multiple of the warp.
const ATTENTION_THREADS: usize = 256;

/// Shared memory a block may use without opting in to more (every CUDA device since 2.0).
const SHARED_BYTES_LIMIT: usize = 48 * 1024;

/// The attention kernel's dynamic shared memory for contexts up to `max_ctx` positions: the query
/// (`hd` floats), a score and a cache slot per position, and `hd` partial sums per position group.
fn attention_shared_bytes(hd: usize, max_ctx: usize, threads: usize) -> Result<u32> {
    let groups = (threads / hd).max(1);
    let bytes = 4 * (hd + 2 * max_ctx + groups * hd);
    if bytes > SHARED_BYTES_LIMIT {
        return Err(ModelError::Backend(format!(
            "attention over {max_ctx} positions needs {bytes} bytes of shared memory per block, more than the {SHARED_BYTES_LIMIT} a block gets"
        )));
    }
    Ok(bytes as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attention_shared_memory_covers_its_layout_and_refuses_past_the_limit() {
        // TinyLlama: 64-dimension heads, 2,048 positions, 4 groups of 64 threads.
        assert_eq!(attention_shared_bytes(64, 2048, 256).unwrap(), 4 * (64 + 4096 + 256));
        // Fewer threads than dimensions: one group.
        assert_eq!(attention_shared_bytes(128, 10, 32).unwrap(), 4 * (128 + 20 + 128));
        let err = attention_shared_bytes(64, 8192, 256).unwrap_err().to_string();
        assert!(err.contains("8192 positions"), "{err}");
    }
}
