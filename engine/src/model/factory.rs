//! The backend factory: a backend name (`cpu`, `cuda`, `auto`) and a dtype to an engine on that
//! backend. The CUDA libraries are probed before anything can panic: a machine without them gets an
//! error naming what is missing, or, for `auto`, the CPU backend.

#[cfg(feature = "cuda")]
use super::cuda::{probe, CudaBackend};
use super::dtype::DType;

/// Resolves a backend name: `cpu`; `cuda` (a usable device, else an error naming what is
/// missing: "backend cuda: no CUDA driver found ..."); `auto` (cuda when usable, else cpu).
pub fn resolve(name: &str) -> Result<&'static str, String> {
    #[cfg(not(feature = "cuda"))]
    let probe = || -> Result<(), String> {
        Err("this build of plateau has no CUDA backend (build it with the engine's `cuda` feature, on by default)"
            .into())
    };
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
        #[cfg(feature = "cuda")]
        "cuda" => {
            let weights = config.model.load()?;
            let b = CudaBackend::new(weights, dtype, config.injections.pool_release())?;
            crate::Engine::with_backend(config, Box::new(b))
        }
        _ if dtype != DType::F32 => {
            Err(crate::EngineError::Config(format!("dtype {}: the cpu backend computes in f32 only", dtype.suffix())))
        }
        _ => crate::Engine::new(config),
    }
}
