//! The project's CUDA kernels (`kernels.cu`, `attention.cu`, `prefill_tc.cu` and `sampling.cu`, one source), compiled with NVRTC
//! for the device's architecture when a CUDA backend starts, and launched by name and element type.

use std::collections::BTreeMap;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions};

use super::device::driver_err;
use super::DType;
use crate::error::{ModelError, Result};

pub const SOURCE: &str = concat!(
    include_str!("kernels.cu"),
    include_str!("attention.cu"),
    include_str!("prefill_tc.cu"),
    include_str!("sampling.cu")
);

/// Kernels built for bf16 alone: prefill attention on tensor cores, for heads of 64 and 128.
const BF16_NAMES: [&str; 2] = ["attention_prefill_tc_h64", "attention_prefill_tc_h128"];

const NAMES: [&str; 21] = [
    "embed",
    "set_rows",
    "rmsnorm",
    "add_rmsnorm",
    "rope_store",
    "attention_decode_g1",
    "attention_decode_g2",
    "attention_decode_g4",
    "attention_decode_g8",
    "attention_decode_g16",
    "attention_combine",
    "attention_prefill",
    "silu_mul",
    "argmax_rows",
    "sample_rows",
    "add",
    "copy_blocks",
    "gather_blocks",
    "scatter_blocks",
    "to_f32",
    "from_f32",
];

/// A kernel argument: device address, 32-bit or 64-bit integer, float.
#[derive(Debug, Clone, Copy)]
pub enum Arg {
    P(u64),
    I(i32),
    L(i64),
    F(f32),
}

pub struct Kernels {
    stream: Arc<CudaStream>,
    funcs: BTreeMap<(&'static str, DType), CudaFunction>,
    tensor_cores: bool,
}

impl Kernels {
    pub fn compile(ctx: &Arc<CudaContext>, stream: Arc<CudaStream>) -> Result<Kernels> {
        let (major, minor) = ctx.compute_capability().map_err(driver_err)?;
        let opts = CompileOptions {
            options: vec![format!("--gpu-architecture=compute_{major}{minor}")],
            name: Some("plateau-kernels.cu".into()),
            ..Default::default()
        };
        let ptx = compile_ptx_with_opts(SOURCE, opts).map_err(|e| match e {
            CompileError::CompileError { log, .. } => ModelError::Backend(format!(
                "NVRTC could not compile the kernels (engine/model/src/cuda/*.cu, in kernels.rs's order):\n{}",
                log.to_string_lossy()
            )),
            other => ModelError::Backend(format!("NVRTC failed on kernels.cu: {other:?}")),
        })?;
        let module = ctx.load_module(ptx).map_err(driver_err)?;
        let mut funcs = BTreeMap::new();
        let both = NAMES.iter().flat_map(|&n| [(n, DType::F32), (n, DType::Bf16)]);
        for (name, dtype) in both.chain(BF16_NAMES.iter().map(|&n| (n, DType::Bf16))) {
            let full = format!("{name}_{}", dtype.suffix());
            let f = module
                .load_function(&full)
                .map_err(|e| ModelError::Backend(format!("kernel {full} is not in the compiled module: {e}")))?;
            funcs.insert((name, dtype), f);
        }
        Ok(Kernels { stream, funcs, tensor_cores: major >= 8 })
    }

    /// Whether the device has the bf16 tensor-core instruction prefill_tc.cu uses (mma.sync
    /// m16n8k16 with bf16 inputs: compute capability 8.0 and later). Older devices compile that
    /// kernel to a trap and never run it.
    pub fn tensor_cores(&self) -> bool {
        self.tensor_cores
    }

    /// Launches `name` for `dtype` on the backend's stream.
    pub fn launch(&self, name: &'static str, dtype: DType, cfg: LaunchConfig, args: &[Arg]) -> Result<()> {
        let full = || format!("{name}_{}", dtype.suffix());
        let f = self.funcs.get(&(name, dtype)).ok_or_else(|| ModelError::Backend(format!("no kernel {}", full())))?;
        let mut b = self.stream.launch_builder(f);
        for a in args {
            match a {
                Arg::P(x) => b.arg(x),
                Arg::I(x) => b.arg(x),
                Arg::L(x) => b.arg(x),
                Arg::F(x) => b.arg(x),
            };
        }
        // SAFETY: every kernel's parameter list matches the argument kinds its callers pass (see
        // kernels.cu), and every address is a live buffer of the allocator of the right size.
        unsafe { b.launch(cfg) }.map_err(|e| ModelError::Backend(format!("kernel {}: {e}", full())))?;
        Ok(())
    }
}

/// A 1-D launch of `blocks` blocks of `threads` threads (rounded up to a whole warp).
pub fn cfg(blocks: (u32, u32), threads: u32, shared_bytes: u32) -> LaunchConfig {
    let threads = threads.clamp(32, 1024).div_ceil(32) * 32;
    LaunchConfig {
        grid_dim: (blocks.0.max(1), blocks.1.max(1), 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: shared_bytes,
    }
}

/// A grid-stride elementwise launch over `n` elements.
pub fn elementwise(n: usize) -> LaunchConfig {
    cfg(((n.div_ceil(256)).min(65_535) as u32, 1), 256, 0)
}
