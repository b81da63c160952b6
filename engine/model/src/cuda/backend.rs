//! `CudaBackend`: the backend trait on a CUDA device.
//!
//! Lifecycle: `new` opens device 0, compiles the kernels, checks that the weights fit (before
//! uploading anything) and uploads them; the engine then asks for the KV pool (`allocate_kv`).
//! Each `forward` allocates its activations and metadata, runs every layer on one stream, answers
//! each row that wants logits (with its token where the engine's plan lets the device sample it:
//! greedy or one seeded draw; otherwise with its logits, read back for the host's sampler) and
//! frees what it allocated. Sleep
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
use crate::backend::BlockId;
use crate::backend::PoolRelease;
use crate::backend::{Backend, BackendMemory, ForwardBatch, Logits, RowSampling};
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::metric::{Metric, MetricKind};
use crate::weights::ModelWeights;

/// A layer's weights as the forward pass multiplies them: the query, key and value projections
/// stacked into one matrix (one product, rows [q | k | v]), and the gate and up projections too
/// (rows [gate | up]).
pub(super) struct LayerBufs {
    pub(super) attn_norm: DeviceBuf,
    pub(super) qkv: DeviceBuf,
    pub(super) o: DeviceBuf,
    pub(super) mlp_norm: DeviceBuf,
    pub(super) gate_up: DeviceBuf,
    pub(super) down: DeviceBuf,
}

pub(super) struct DeviceWeights {
    pub(super) embed: DeviceBuf,
    pub(super) final_norm: DeviceBuf,
    pub(super) lm_head: DeviceBuf,
    pub(super) layers: Vec<LayerBufs>,
    /// Rotary frequencies (f32, `head_dim / 2`), derived from the config. They live and go with the
    /// weights: a buffer that outlived sleep level 2 would keep its chunk of the stream-ordered pool
    /// (and everything freed beside it) from going back to the driver.
    pub(super) inv_freq: DeviceBuf,
    /// The vision tower's weights stay on the host: the encoder runs there.
    pub(super) host_vision: Option<ModelWeights>,
}

/// K and V of every layer, and the table of their addresses the block kernels take.
pub(super) struct DeviceKv {
    pub(super) block_size: usize,
    pub(super) num_blocks: usize,
    pub(super) k: Vec<DeviceBuf>,
    pub(super) v: Vec<DeviceBuf>,
    /// [k0, v0, k1, v1, ...] as device addresses.
    pub(super) bases: DeviceBuf,
}

pub struct CudaBackend {
    pub(super) config: ModelConfig,
    pub(super) dtype: DType,
    pub(super) stream: Arc<CudaStream>,
    pub(super) blas: CudaBlas,
    pub(super) kernels: Kernels,
    pub(super) alloc: DeviceAllocator,
    pub(super) weights: Option<DeviceWeights>,
    pub(super) kv: Option<DeviceKv>,
    /// KV pools kept past their release: only `sleep-keeps-kv` puts anything here.
    pub(super) kept_kv: Vec<DeviceKv>,
    pub(super) pool_release: PoolRelease,
}

// SAFETY: the backend is used by one thread at a time (the engine is `Send`, not shared); cudarc's
// context and stream are thread-safe handles, and the cuBLAS handle is bound to our one stream.
unsafe impl Send for CudaBackend {}

/// Bytes the weights take on the device in `dtype` (what `new` checks before uploading).
pub fn weight_bytes(c: &ModelConfig, dtype: DType) -> u64 {
    crate::weights::tensor_specs(c)
        .iter()
        .filter(|(name, _)| !name.starts_with("visual."))
        .map(|(_, shape)| shape.iter().product::<usize>() as u64 * dtype.size() as u64)
        .sum()
}

impl CudaBackend {
    /// Opens device 0 and uploads `weights` in `dtype`. Fails (never panics) without a usable
    /// device, and says so before loading when the model does not fit.
    pub fn new(weights: ModelWeights, dtype: DType, pool_release: PoolRelease) -> Result<CudaBackend> {
        weights.config.validate()?;
        super::device::probe().map_err(|e| ModelError::Backend(format!("backend cuda: {e}")))?;
        let ctx = CudaContext::new(0).map_err(driver_err)?;
        // One stream, used in order: cudarc's per-buffer event tracking is not needed.
        // SAFETY: no buffer exists yet.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.default_stream();
        let blas = CudaBlas::new(stream.clone()).map_err(|e| ModelError::Backend(format!("cuBLAS: {e}")))?;
        let kernels = Kernels::compile(&ctx, stream.clone())?;
        let alloc = DeviceAllocator::new(ctx.clone(), stream.clone());
        let config = weights.config.clone();
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
            pool_release,
        };
        b.load_weights(weights)?;
        Ok(b)
    }

    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(driver_err)
    }

    pub(super) fn upload_tensor(&self, data: &[f32], category: Category, what: &str) -> Result<DeviceBuf> {
        match self.dtype {
            DType::F32 => self.alloc.upload(category, data, what),
            DType::Bf16 => {
                let bits: Vec<u16> = data.iter().map(|&x| half::bf16::from_f32(x).to_bits()).collect();
                self.alloc.upload(category, &bits, what)
            }
        }
    }

    pub(super) fn act(&self, elems: usize, what: &str) -> Result<DeviceBuf> {
        self.alloc.alloc(Category::Activations, elems * self.dtype.size(), what)
    }

    /// y[t, out] = x[t, in] · w[out, in]^T (row-major), through cuBLAS with f32 accumulation.
    pub(super) fn linear(&self, x: u64, w: u64, y: u64, t: usize, inp: usize, out: usize) -> Result<()> {
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
        .map_err(|e| ModelError::Backend(format!("cuBLAS gemm {t}x{inp} by {out}x{inp}: {e}")))
    }

    /// x += y over `n` elements.
    pub(super) fn residual_add(&self, x: u64, y: u64, n: usize) -> Result<()> {
        self.kernels.launch("add", self.dtype, elementwise(n), &[Arg::P(x), Arg::P(y), Arg::L(n as i64)])
    }

    /// x += y, then out = RMSNorm(x) * w, over `n_rows` rows (one launch).
    pub(super) fn add_rmsnorm(&self, x: u64, y: u64, w: u64, out: u64, n_rows: usize) -> Result<()> {
        let h = self.config.hidden_size;
        let args = [Arg::P(x), Arg::P(y), Arg::P(w), Arg::P(out), Arg::I(h as i32), Arg::F(self.config.rms_norm_eps)];
        self.kernels.launch("add_rmsnorm", self.dtype, cfg((n_rows as u32, 1), 256, 0), &args)
    }

    pub(super) fn rmsnorm(&self, x: u64, rows: u64, w: u64, out: u64, n_rows: usize) -> Result<()> {
        let h = self.config.hidden_size;
        let args =
            [Arg::P(x), Arg::P(rows), Arg::P(w), Arg::P(out), Arg::I(h as i32), Arg::F(self.config.rms_norm_eps)];
        self.kernels.launch("rmsnorm", self.dtype, cfg((n_rows as u32, 1), 256, 0), &args)
    }

    pub(super) fn kv_ref(&self) -> Result<&DeviceKv> {
        self.kv.as_ref().ok_or_else(|| ModelError::Backend("KV pool is released".into()))
    }

    /// Launches a block kernel (`gather_blocks`, `scatter_blocks`) over `blocks` of every cache
    /// tensor with a staging buffer of f32.
    pub(super) fn blocks_kernel(&self, name: &'static str, blocks: &[BlockId], staging: u64) -> Result<()> {
        let kv = self.kv_ref()?;
        if let Some(b) = blocks.iter().find(|&&b| b as usize >= kv.num_blocks) {
            return Err(ModelError::Backend(format!("block {b} is out of range (pool has {})", kv.num_blocks)));
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

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn allocate_kv(&mut self, num_blocks: usize, block_size: usize) -> Result<()> {
        if self.kv.is_some() {
            return Err(ModelError::Backend("KV pool already allocated".into()));
        }
        let layers = self.config.num_hidden_layers;
        let per_tensor = num_blocks * block_size * self.config.kv_dim() * self.dtype.size();
        let (free, _) = self.alloc.driver_memory()?;
        let want = (2 * layers * per_tensor) as u64;
        if want > free {
            return Err(ModelError::Backend(format!(
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
        self.pool_release.release(&mut self.kv, &mut self.kept_kv);
        let _ = self.alloc.trim();
    }

    fn load_weights(&mut self, weights: ModelWeights) -> Result<()> {
        if weights.config != self.config {
            return Err(ModelError::Weights(format!(
                "new weights have another shape: {:?}, engine has {:?}",
                weights.config, self.config
            )));
        }
        let need = weight_bytes(&self.config, self.dtype);
        let old = self.weights.as_ref().map_or(0, |_| self.alloc.live_bytes(Category::Weights));
        let (free, _) = self.alloc.driver_memory()?;
        if need > free + old {
            return Err(ModelError::Weights(format!(
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
                qkv: up(&[w.q, w.k, w.v].concat(), &name("q_proj, k_proj and v_proj"))?,
                o: up(w.o, &name("o_proj"))?,
                mlp_norm: up(w.mlp_norm, &name("post_attention_layernorm"))?,
                gate_up: up(&[w.gate, w.up].concat(), &name("gate_proj and up_proj"))?,
                down: up(w.down, &name("down_proj"))?,
            });
        }
        let hd = self.config.head_dim;
        let inv_freq: Vec<f32> =
            (0..hd / 2).map(|i| 1.0 / self.config.rope_theta.powf((2 * i) as f32 / hd as f32)).collect();
        let dw = DeviceWeights {
            inv_freq: self.alloc.upload(Category::Workspace, &inv_freq, "rotary frequencies")?,
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
        let rows = self.forward_batch(batch, &[])?;
        Ok(rows.into_iter().filter_map(|r| if let Logits::Row(r) = r { Some(r) } else { None }).collect())
    }

    fn forward_sampled(&mut self, batch: &ForwardBatch, sampling: &[RowSampling]) -> Result<Vec<Logits>> {
        self.forward_batch(batch, sampling)
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
            return Err(ModelError::Backend(format!("KV data has {} floats, {n} expected", data.len())));
        }
        let staging = self.alloc.upload(Category::Staging, data, "KV transfer staging")?;
        self.blocks_kernel("scatter_blocks", blocks, staging.ptr())
    }

    fn encode_image(&mut self, pixels: &crate::vision::PixelTensor) -> Result<Vec<f32>> {
        let w = self.weights.as_ref().ok_or_else(|| ModelError::Backend("weights are released".into()))?;
        let host =
            w.host_vision.as_ref().ok_or_else(|| ModelError::Backend("the model has no vision encoder".into()))?;
        Ok(crate::vision::encode(&self.config, host, pixels))
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

    #[test]
    fn every_kernel_is_instantiated_for_both_types() {
        for name in ["embed", "add_rmsnorm", "rope_store", "attention_decode_g8", "attention_prefill", "sample_rows"] {
            let source = super::super::kernels::SOURCE;
            assert!(source.contains(&format!("void {name}_##S")), "{name}");
        }
        for ty in ["INSTANTIATE(bf16, bf16)", "INSTANTIATE_ATTENTION(bf16, bf16)", "INSTANTIATE_SAMPLING(bf16, bf16)"] {
            assert!(super::super::kernels::SOURCE.contains(ty), "{ty}");
        }
        let tl = ModelConfig::preset("tinyllama-1.1b").unwrap();
        assert_eq!(weight_bytes(&tl, DType::Bf16) * 2, weight_bytes(&tl, DType::F32));
        assert!(weight_bytes(&tl, DType::Bf16) > 2_000_000_000);
    }
}
