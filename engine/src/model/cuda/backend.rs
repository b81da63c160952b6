//! `CudaBackend`: the backend trait on a CUDA device.
//!
//! Lifecycle: `new` opens device 0, compiles the kernels, checks that the weights fit (before
//! uploading anything) and uploads them; the engine then asks for the KV pool (`allocate_kv`).
//! Each `forward` allocates its activations and metadata, runs every layer on one stream, reads the
//! wanted logits back to the host (sampling stays on the host) and frees what it allocated. Sleep
//! releases the KV pool (level 1) and the weights (level 2) and trims the allocator's pool so the
//! driver sees the memory back; wake allocates and uploads again. The vision encoder (images) runs
//! on the host with the CPU backend's code, from a host copy of the vision tower's weights.

use std::sync::Arc;

use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaStream};

use super::device::{driver_err, Category, DeviceAllocator, DeviceBuf};
use super::kernels::{cfg, elementwise, Arg, Kernels};
use super::DType;
use crate::block_pool::BlockId;
use crate::error::{EngineError, Result};
use crate::inject::Injections;
use crate::model::backend::{Backend, BackendMemory, ForwardBatch};
use crate::model::config::ModelConfig;
use crate::model::weights::ModelWeights;
use crate::registry::{Metric, MetricKind};

struct LayerBufs {
    attn_norm: DeviceBuf,
    q: DeviceBuf,
    k: DeviceBuf,
    v: DeviceBuf,
    o: DeviceBuf,
    mlp_norm: DeviceBuf,
    gate: DeviceBuf,
    up: DeviceBuf,
    down: DeviceBuf,
}

struct DeviceWeights {
    embed: DeviceBuf,
    final_norm: DeviceBuf,
    lm_head: DeviceBuf,
    layers: Vec<LayerBufs>,
    /// The vision tower's weights stay on the host: the encoder runs there.
    host_vision: Option<ModelWeights>,
}

/// K and V of every layer, and the table of their addresses the block kernels take.
struct DeviceKv {
    block_size: usize,
    num_blocks: usize,
    k: Vec<DeviceBuf>,
    v: Vec<DeviceBuf>,
    /// [k0, v0, k1, v1, ...] as device addresses.
    bases: DeviceBuf,
}

pub struct CudaBackend {
    config: ModelConfig,
    dtype: DType,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    kernels: Kernels,
    alloc: DeviceAllocator,
    weights: Option<DeviceWeights>,
    kv: Option<DeviceKv>,
    /// KV pools kept past their release: only `sleep-keeps-kv` puts anything here.
    kept_kv: Vec<DeviceKv>,
    inv_freq: DeviceBuf,
    injections: Injections,
}

// SAFETY: the backend is used by one thread at a time (the engine is `Send`, not shared); cudarc's
// context and stream are thread-safe handles, and the cuBLAS handle is bound to our one stream.
unsafe impl Send for CudaBackend {}

/// Bytes the weights take on the device in `dtype` (what `new` checks before uploading).
pub fn weight_bytes(c: &ModelConfig, dtype: DType) -> u64 {
    crate::model::weights::tensor_specs(c)
        .iter()
        .filter(|(name, _)| !name.starts_with("visual."))
        .map(|(_, shape)| shape.iter().product::<usize>() as u64 * dtype.size() as u64)
        .sum()
}

impl CudaBackend {
    /// Opens device 0 and uploads `weights` in `dtype`. Fails (never panics) without a usable
    /// device, and says so before loading when the model does not fit.
    pub fn new(weights: ModelWeights, dtype: DType, injections: Injections) -> Result<CudaBackend> {
        weights.config.validate()?;
        super::device::probe().map_err(|e| EngineError::Backend(format!("backend cuda: {e}")))?;
        let ctx = CudaContext::new(0).map_err(driver_err)?;
        // One stream, used in order: cudarc's per-buffer event tracking is not needed.
        // SAFETY: no buffer exists yet.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.default_stream();
        let blas = CudaBlas::new(stream.clone()).map_err(|e| EngineError::Backend(format!("cuBLAS: {e}")))?;
        let kernels = Kernels::compile(&ctx, stream.clone())?;
        let alloc = DeviceAllocator::new(ctx.clone(), stream.clone());
        let config = weights.config.clone();
        let hd = config.head_dim;
        let inv_freq: Vec<f32> =
            (0..hd / 2).map(|i| 1.0 / config.rope_theta.powf((2 * i) as f32 / hd as f32)).collect();
        let inv_freq = alloc.upload(Category::Workspace, &inv_freq, "rotary frequencies")?;
        let mut b = CudaBackend {
            config,
            dtype,
            stream,
            blas,
            kernels,
            alloc,
            weights: None,
            kv: None,
            kept_kv: Vec::new(),
            inv_freq,
            injections,
        };
        b.load_weights(weights)?;
        Ok(b)
    }

    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(driver_err)
    }

    fn upload_tensor(&self, data: &[f32], category: Category, what: &str) -> Result<DeviceBuf> {
        match self.dtype {
            DType::F32 => self.alloc.upload(category, data, what),
            DType::Bf16 => {
                let bits: Vec<u16> = data.iter().map(|&x| half::bf16::from_f32(x).to_bits()).collect();
                self.alloc.upload(category, &bits, what)
            }
        }
    }

    fn act(&self, elems: usize, what: &str) -> Result<DeviceBuf> {
        self.alloc.alloc(Category::Activations, elems * self.dtype.size(), what)
    }

    /// y[t, out] = x[t, in] · w[out, in]^T (row-major), through cuBLAS with f32 accumulation.
    fn linear(&self, x: u64, w: u64, y: u64, t: usize, inp: usize, out: usize) -> Result<()> {
        let ty = match self.dtype {
            DType::F32 => cudaDataType::CUDA_R_32F,
            DType::Bf16 => cudaDataType::CUDA_R_16BF,
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        // Row-major y = x w^T is column-major y^T = w^T(op T) x^T: m = out, n = t, k = in.
        // SAFETY: x, w, y are live device buffers of t*in, out*in and t*out elements of `ty`.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *self.blas.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                out as i32,
                t as i32,
                inp as i32,
                (&alpha as *const f32).cast(),
                w as *const std::ffi::c_void,
                ty,
                inp as i32,
                x as *const std::ffi::c_void,
                ty,
                inp as i32,
                (&beta as *const f32).cast(),
                y as *mut std::ffi::c_void,
                ty,
                out as i32,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| EngineError::Backend(format!("cuBLAS gemm {t}x{inp} by {out}x{inp}: {e}")))
    }

    /// x += y over `n` elements.
    fn residual_add(&self, x: u64, y: u64, n: usize) -> Result<()> {
        self.kernels.launch("add", self.dtype, elementwise(n), &[Arg::P(x), Arg::P(y), Arg::L(n as i64)])
    }

    fn rmsnorm(&self, x: u64, rows: u64, w: u64, out: u64, n_rows: usize) -> Result<()> {
        let h = self.config.hidden_size;
        let args =
            [Arg::P(x), Arg::P(rows), Arg::P(w), Arg::P(out), Arg::I(h as i32), Arg::F(self.config.rms_norm_eps)];
        self.kernels.launch("rmsnorm", self.dtype, cfg((n_rows as u32, 1), 256, 0), &args)
    }

    fn kv_ref(&self) -> Result<&DeviceKv> {
        self.kv.as_ref().ok_or_else(|| EngineError::Backend("KV pool is released".into()))
    }

    /// Launches a block kernel (`gather_blocks`, `scatter_blocks`) over `blocks` of every cache
    /// tensor with a staging buffer of f32.
    fn blocks_kernel(&self, name: &'static str, blocks: &[BlockId], staging: u64) -> Result<()> {
        let kv = self.kv_ref()?;
        if let Some(b) = blocks.iter().find(|&&b| b as usize >= kv.num_blocks) {
            return Err(EngineError::Backend(format!("block {b} is out of range (pool has {})", kv.num_blocks)));
        }
        let ids: Vec<i32> = blocks.iter().map(|&b| b as i32).collect();
        let ids = self.alloc.upload(Category::Workspace, &ids, "block list")?;
        let block_elems = kv.block_size * self.config.kv_dim();
        let args = [
            Arg::P(kv.bases.ptr()),
            Arg::P(ids.ptr()),
            Arg::I(blocks.len() as i32),
            Arg::I(block_elems as i32),
            Arg::P(staging),
        ];
        self.kernels.launch(name, self.dtype, cfg((blocks.len() as u32, (2 * kv.k.len()) as u32), 256, 0), &args)?;
        self.synchronize()
    }
}

/// Per-forward metadata: the flattened batch as the kernels take it.
#[derive(Debug)]
struct Flat {
    tokens: Vec<u32>,
    positions: Vec<i32>,
    tok_seq: Vec<i32>,
    slots: Vec<i64>,
    tables: Vec<i32>,
    max_blocks: usize,
    max_ctx: usize,
    logit_rows: Vec<i32>,
    /// (flattened row, f32 embedding row) for image placeholders.
    embed_rows: Vec<i32>,
    embed_data: Vec<f32>,
}

fn flatten(batch: &ForwardBatch, c: &ModelConfig, bs: usize) -> Result<Flat> {
    let h = c.hidden_size;
    let max_blocks = batch.chunks.iter().map(|ch| ch.block_table.len()).max().unwrap_or(0).max(1);
    let mut f = Flat {
        tokens: Vec::new(),
        positions: Vec::new(),
        tok_seq: Vec::new(),
        slots: Vec::new(),
        tables: vec![0; batch.chunks.len() * max_blocks],
        max_blocks,
        max_ctx: 1,
        logit_rows: Vec::new(),
        embed_rows: Vec::new(),
        embed_data: Vec::new(),
    };
    for (ci, ch) in batch.chunks.iter().enumerate() {
        f.tables[ci * max_blocks..ci * max_blocks + ch.block_table.len()]
            .iter_mut()
            .zip(&ch.block_table)
            .for_each(|(d, &b)| *d = b as i32);
        for (j, &tok) in ch.tokens.iter().enumerate() {
            if tok as usize >= c.vocab_size {
                return Err(EngineError::Backend(format!("token id {tok} outside the vocabulary")));
            }
            let pos = ch.start_pos + j;
            let block = *ch.block_table.get(pos / bs).ok_or_else(|| {
                EngineError::Backend(format!(
                    "position {pos} is past the block table ({} blocks)",
                    ch.block_table.len()
                ))
            })?;
            for (img_start, e) in &ch.embeds {
                let rows = e.len() / h;
                if pos >= *img_start && pos < img_start + rows {
                    let r = pos - img_start;
                    f.embed_rows.push(f.tokens.len() as i32);
                    f.embed_data.extend_from_slice(&e[r * h..(r + 1) * h]);
                }
            }
            f.tokens.push(tok);
            f.positions.push(pos as i32);
            f.tok_seq.push(ci as i32);
            f.slots.push(block as i64 * bs as i64 + (pos % bs) as i64);
            f.max_ctx = f.max_ctx.max(pos + 1);
        }
        if ch.want_logits && !ch.tokens.is_empty() {
            f.logit_rows.push(f.tokens.len() as i32 - 1);
        }
    }
    Ok(f)
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn allocate_kv(&mut self, num_blocks: usize, block_size: usize) -> Result<()> {
        if self.kv.is_some() {
            return Err(EngineError::Backend("KV pool already allocated".into()));
        }
        let layers = self.config.num_hidden_layers;
        let per_tensor = num_blocks * block_size * self.config.kv_dim() * self.dtype.size();
        let (free, _) = self.alloc.driver_memory()?;
        let want = (2 * layers * per_tensor) as u64;
        if want > free {
            return Err(EngineError::Backend(format!(
                "the KV pool ({num_blocks} blocks of {block_size} tokens, {layers} layers) needs {want} bytes ({:.2} GiB) and the device has {free} bytes ({:.2} GiB) free",
                want as f64 / (1u64 << 30) as f64,
                free as f64 / (1u64 << 30) as f64
            )));
        }
        // A failure midway drops what was allocated: nothing half-allocated stays behind.
        let (mut k, mut v) = (Vec::new(), Vec::new());
        for l in 0..layers {
            for list in [&mut k, &mut v] {
                let mut b = self.alloc.alloc(Category::KvCache, per_tensor, &format!("the KV cache of layer {l}"))?;
                b.zero()?;
                list.push(b);
            }
        }
        let bases: Vec<u64> = k.iter().zip(&v).flat_map(|(k, v)| [k.ptr(), v.ptr()]).collect();
        let bases = self.alloc.upload(Category::KvCache, &bases, "the KV address table")?;
        self.kv = Some(DeviceKv { block_size, num_blocks, k, v, bases });
        Ok(())
    }

    fn release_kv(&mut self) {
        self.injections.release_pool(&mut self.kv, &mut self.kept_kv);
        let _ = self.alloc.trim();
    }

    fn load_weights(&mut self, weights: ModelWeights) -> Result<()> {
        if weights.config != self.config {
            return Err(EngineError::Weights(format!(
                "new weights have another shape: {:?}, engine has {:?}",
                weights.config, self.config
            )));
        }
        let need = weight_bytes(&self.config, self.dtype);
        let old = self.weights.as_ref().map_or(0, |_| self.alloc.live_bytes(Category::Weights));
        let (free, _) = self.alloc.driver_memory()?;
        if need > free + old {
            return Err(EngineError::Weights(format!(
                "the model does not fit: its weights take {need} bytes ({:.2} GiB) in {:?} and the device has {free} bytes ({:.2} GiB) free",
                need as f64 / (1u64 << 30) as f64,
                self.dtype,
                free as f64 / (1u64 << 30) as f64
            )));
        }
        // The old weights go first, so that an update needs no room for two copies.
        self.weights = None;
        let _ = self.alloc.trim();
        let up = |data: &[f32], what: &str| self.upload_tensor(data, Category::Weights, what);
        let mut layers = Vec::new();
        for l in 0..self.config.num_hidden_layers {
            let w = weights.layer(l);
            let name = |t: &str| format!("layer {l} {t}");
            layers.push(LayerBufs {
                attn_norm: up(w.attn_norm, &name("input_layernorm"))?,
                q: up(w.q, &name("q_proj"))?,
                k: up(w.k, &name("k_proj"))?,
                v: up(w.v, &name("v_proj"))?,
                o: up(w.o, &name("o_proj"))?,
                mlp_norm: up(w.mlp_norm, &name("post_attention_layernorm"))?,
                gate: up(w.gate, &name("gate_proj"))?,
                up: up(w.up, &name("up_proj"))?,
                down: up(w.down, &name("down_proj"))?,
            });
        }
        let dw = DeviceWeights {
            embed: up(weights.embed(), "embed_tokens")?,
            final_norm: up(weights.final_norm(), "norm")?,
            lm_head: up(weights.lm_head(), "lm_head")?,
            layers,
            host_vision: self.config.vision.is_some().then_some(weights),
        };
        self.weights = Some(dw);
        self.synchronize()
    }

    fn release_weights(&mut self) {
        self.weights = None;
        let _ = self.alloc.trim();
    }

    fn forward(&mut self, batch: &ForwardBatch) -> Result<Vec<Vec<f32>>> {
        let w = self.weights.as_ref().ok_or_else(|| EngineError::Backend("weights are released".into()))?;
        let kv = self.kv.as_ref().ok_or_else(|| EngineError::Backend("KV pool is released".into()))?;
        let c = &self.config;
        let (h, hd, nh, nkv) = (c.hidden_size, c.head_dim, c.num_attention_heads, c.num_key_value_heads);
        let (qd, kvd, inter, bs) = (c.q_dim(), c.kv_dim(), c.intermediate_size, kv.block_size);
        let dt = self.dtype;
        let ws = |data: &[i32], what: &str| self.alloc.upload(Category::Workspace, data, what);
        if !batch.copies.is_empty() {
            let pairs: Vec<i32> = batch.copies.iter().flat_map(|cp| [cp.src as i32, cp.dst as i32]).collect();
            let pairs = ws(&pairs, "copy-on-write block pairs")?;
            let args = [Arg::P(kv.bases.ptr()), Arg::P(pairs.ptr()), Arg::I((bs * kvd) as i32)];
            let grid = (batch.copies.len() as u32, (2 * kv.k.len()) as u32);
            self.kernels.launch("copy_blocks", dt, cfg(grid, 256, 0), &args)?;
        }
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
        if !f.embed_rows.is_empty() {
            let er = ws(&f.embed_rows, "image rows")?;
            let ed = self.alloc.upload(Category::Workspace, &f.embed_data, "image embeddings")?;
            let grid = (f.embed_rows.len() as u32, 1);
            self.kernels.launch(
                "set_rows",
                dt,
                cfg(grid, threads, 0),
                &[Arg::P(x.ptr()), Arg::P(ed.ptr()), Arg::P(er.ptr()), Arg::I(h as i32)],
            )?;
        }
        let scale = 1.0 / (hd as f32).sqrt();
        let attn_shared = ((hd + f.max_ctx) * 4) as u32;
        for (l, lw) in w.layers.iter().enumerate() {
            self.rmsnorm(x.ptr(), 0, lw.attn_norm.ptr(), hn.ptr(), t)?;
            self.linear(hn.ptr(), lw.q.ptr(), q.ptr(), t, h, qd)?;
            self.linear(hn.ptr(), lw.k.ptr(), k.ptr(), t, h, kvd)?;
            self.linear(hn.ptr(), lw.v.ptr(), v.ptr(), t, h, kvd)?;
            for (buf, heads) in [(&q, nh), (&k, nkv)] {
                let args = [
                    Arg::P(buf.ptr()),
                    Arg::P(positions.ptr()),
                    Arg::P(self.inv_freq.ptr()),
                    Arg::I(heads as i32),
                    Arg::I(hd as i32),
                ];
                self.kernels.launch("rope", dt, cfg(rows, (heads * hd / 2) as u32, 0), &args)?;
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
            self.kernels.launch("attention", dt, cfg((t as u32, nh as u32), 128, attn_shared), &args)?;
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
        let r = f.logit_rows.len();
        if r == 0 {
            self.synchronize()?;
            return Ok(Vec::new());
        }
        let lr = ws(&f.logit_rows, "logit rows")?;
        let normed = self.act(r * h, "final normed rows")?;
        self.rmsnorm(x.ptr(), lr.ptr(), w.final_norm.ptr(), normed.ptr(), r)?;
        let vocab = c.vocab_size;
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

    fn read_kv(&self, blocks: &[BlockId]) -> Result<Vec<f32>> {
        let kv = self.kv_ref()?;
        let n = blocks.len() * kv.block_size * self.config.kv_dim() * 2 * kv.k.len();
        let staging = self.alloc.alloc(Category::Staging, n * 4, "KV transfer staging")?;
        self.blocks_kernel("gather_blocks", blocks, staging.ptr())?;
        staging.read(n)
    }

    fn write_kv(&mut self, blocks: &[BlockId], data: &[f32]) -> Result<()> {
        let kv = self.kv_ref()?;
        let n = blocks.len() * kv.block_size * self.config.kv_dim() * 2 * kv.k.len();
        if data.len() != n {
            return Err(EngineError::Backend(format!("KV data has {} floats, {n} expected", data.len())));
        }
        let staging = self.alloc.upload(Category::Staging, data, "KV transfer staging")?;
        self.blocks_kernel("scatter_blocks", blocks, staging.ptr())
    }

    fn encode_image(&mut self, pixels: &crate::multimodal::image::PixelTensor) -> Result<Vec<f32>> {
        let w = self.weights.as_ref().ok_or_else(|| EngineError::Backend("weights are released".into()))?;
        let host =
            w.host_vision.as_ref().ok_or_else(|| EngineError::Backend("the model has no vision encoder".into()))?;
        Ok(crate::model::vision::encode(&self.config, host, pixels))
    }

    fn memory(&self) -> BackendMemory {
        BackendMemory {
            weight_bytes: self.alloc.live_bytes(Category::Weights),
            kv_bytes: self.alloc.live_bytes(Category::KvCache),
            kv_pools: self.kv.iter().count() as u64 + self.kept_kv.len() as u64,
        }
    }

    fn device_metrics(&self) -> Vec<Metric> {
        let mut m = Vec::new();
        for c in Category::ALL {
            m.push(Metric {
                name: format!("gpu.alloc.{}_bytes", c.name()),
                kind: MetricKind::Gauge,
                unit: "bytes",
                value: self.alloc.live_bytes(c),
            });
            // Buffers of one forward pass or one transfer must all be gone between steps.
            let kind = match c {
                Category::Activations | Category::Staging => MetricKind::PerRequest,
                _ => MetricKind::Gauge,
            };
            m.push(Metric {
                name: format!("registry.gpu.{}_buffers", c.name()),
                kind,
                unit: "count",
                value: self.alloc.live_buffers(c),
            });
        }
        if let Ok((free, total)) = self.alloc.driver_memory() {
            m.push(Metric {
                name: "gpu.driver_used_bytes".into(),
                kind: MetricKind::Gauge,
                unit: "bytes",
                value: total - free,
            });
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::backend::SeqChunk;
    use std::sync::Arc;

    fn chunk(tokens: Vec<u32>, start_pos: usize, table: Vec<BlockId>, want_logits: bool) -> SeqChunk {
        SeqChunk { tokens, start_pos, block_table: table, want_logits, embeds: Vec::new() }
    }

    #[test]
    fn a_batch_flattens_to_slots_tables_and_logit_rows() {
        let c = ModelConfig::preset("tiny").unwrap();
        let mut image = chunk(vec![1, 2, 2, 5], 0, vec![7], false);
        image.embeds.push((1, Arc::new(vec![0.5; 2 * c.hidden_size])));
        let batch = ForwardBatch {
            copies: Vec::new(),
            chunks: vec![chunk(vec![10, 11, 12], 15, vec![3, 9], true), chunk(vec![20], 4, vec![6], true), image],
        };
        let f = flatten(&batch, &c, 16).unwrap();
        assert_eq!(f.tokens, vec![10, 11, 12, 20, 1, 2, 2, 5]);
        assert_eq!(f.positions, vec![15, 16, 17, 4, 0, 1, 2, 3]);
        assert_eq!(
            f.slots,
            vec![3 * 16 + 15, 9 * 16, 9 * 16 + 1, 6 * 16 + 4, 7 * 16, 7 * 16 + 1, 7 * 16 + 2, 7 * 16 + 3]
        );
        assert_eq!(f.tok_seq, vec![0, 0, 0, 1, 2, 2, 2, 2]);
        assert_eq!((f.max_blocks, f.max_ctx), (2, 18));
        assert_eq!(f.tables, vec![3, 9, 6, 0, 7, 0]);
        assert_eq!(f.logit_rows, vec![2, 3]);
        assert_eq!(f.embed_rows, vec![5, 6]);
        assert_eq!(f.embed_data.len(), 2 * c.hidden_size);
    }

    #[test]
    fn bad_batches_are_errors_not_panics() {
        let c = ModelConfig::preset("tiny").unwrap();
        let past_table = ForwardBatch { copies: Vec::new(), chunks: vec![chunk(vec![1, 2], 15, vec![0], true)] };
        assert!(flatten(&past_table, &c, 16).unwrap_err().to_string().contains("past the block table"));
        let bad_token = ForwardBatch { copies: Vec::new(), chunks: vec![chunk(vec![100_000], 0, vec![0], true)] };
        assert!(flatten(&bad_token, &c, 16).unwrap_err().to_string().contains("outside the vocabulary"));
    }

    #[test]
    fn every_kernel_is_instantiated_for_both_types() {
        for name in ["embed", "rmsnorm", "rope", "store_kv", "attention", "silu_mul", "copy_blocks", "gather_blocks"] {
            for s in ["f32", "bf16"] {
                assert!(super::super::kernels::SOURCE.contains(&format!("void {name}_##S")), "{name}_{s}");
            }
        }
        let tl = ModelConfig::preset("tinyllama-1.1b").unwrap();
        assert_eq!(weight_bytes(&tl, DType::Bf16) * 2, weight_bytes(&tl, DType::F32));
        assert!(weight_bytes(&tl, DType::Bf16) > 2_000_000_000);
    }
}
