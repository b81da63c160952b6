//! The CUDA backend: the same Llama-style decoder as the CPU backend (its reference), on a device,
//! through cudarc with the CUDA libraries loaded at run time (nothing of CUDA is needed to build).
//! Kernels are the project's own (`kernels.cu`, compiled with NVRTC at start); matrix products go
//! through cuBLAS with f32 accumulation; weights, activations and the KV cache are f32 or bf16.

pub mod backend;
pub mod device;
pub mod kernels;

pub use backend::CudaBackend;
pub use device::{probe, Category, DeviceInfo};

/// Element type of weights, activations and the KV cache on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum DType {
    #[default]
    F32,
    Bf16,
}

impl DType {
    pub fn parse(s: &str) -> Result<DType, String> {
        match s {
            "f32" => Ok(DType::F32),
            "bf16" => Ok(DType::Bf16),
            other => Err(format!("dtype `{other}` is not one of f32, bf16")),
        }
    }

    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::Bf16 => 2,
        }
    }

    pub fn suffix(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::Bf16 => "bf16",
        }
    }
}

/// Resolves a backend name: `cpu`; `cuda` (a usable device, else an error naming what is
/// missing: "backend cuda: no CUDA driver found ..."); `auto` (cuda when usable, else cpu).
pub fn resolve(name: &str) -> Result<&'static str, String> {
    match name {
        "cpu" => Ok("cpu"),
        "cuda" => probe().map(|_| "cuda").map_err(|e| format!("backend cuda: {e}")),
        "auto" => Ok(if probe().is_ok() { "cuda" } else { "cpu" }),
        other => Err(format!("backend `{other}` is not one of cpu, cuda, auto")),
    }
}

/// An engine on the backend `name` resolves to, holding the weights of `config.model` in `dtype`.
pub fn engine_on(name: &str, config: crate::EngineConfig, dtype: DType) -> Result<crate::Engine, crate::EngineError> {
    match resolve(name).map_err(crate::EngineError::Config)? {
        "cuda" => {
            let weights = config.model.load()?;
            let b = CudaBackend::new(weights, dtype, config.injections.clone())?;
            crate::Engine::with_backend(config, Box::new(b))
        }
        _ if dtype != DType::F32 => {
            Err(crate::EngineError::Config(format!("dtype {}: the cpu backend computes in f32 only", dtype.suffix())))
        }
        _ => crate::Engine::new(config),
    }
}
