//! The element type a backend computes in: the CPU backend in f32 only, the CUDA backend in f32
//! or bf16 (weights, activations and the KV cache alike).

/// Element type of weights, activations and the KV cache.
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
