//! The CUDA backend: the same Llama-style decoder as the CPU backend (its reference), on a device,
//! through cudarc with the CUDA libraries loaded at run time (nothing of CUDA is needed to build).
//! Kernels are the project's own (`kernels.cu`, compiled with NVRTC at start); matrix products go
//! through cuBLAS with f32 accumulation; weights, activations and the KV cache are f32 or bf16.

pub mod backend;
mod batch;
pub mod device;
mod forward;
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
