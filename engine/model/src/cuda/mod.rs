//! The CUDA backend: the same Llama-style decoder as the CPU backend (its reference), on a device,
//! through cudarc with the CUDA libraries loaded at run time (nothing of CUDA is needed to build).
//! Kernels are the project's own (`kernels.cu` and `attention.cu`, compiled with NVRTC at start,
//! checked on the host by `tests/kernels_emulated`); matrix products go through cuBLAS with f32
//! accumulation (the query, key and value projections as one product, gate and up as another);
//! weights, activations and the KV cache are f32 or bf16. A greedy row's token is picked on the
//! device; other rows' logits come back for the host's sampler.

mod attention;
pub mod backend;
mod batch;
pub mod device;
mod forward;
pub mod kernels;

pub use backend::CudaBackend;
pub use device::{probe, Category, DeviceInfo};

pub use super::dtype::DType;
