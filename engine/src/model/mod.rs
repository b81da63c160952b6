//! The model: its shape, its weights, and the backends that compute it (the `plateau-model`
//! crate, re-exported here under the paths the engine's users know), and the factory that builds
//! the backend an engine's configuration names.

#[cfg(feature = "cuda")]
pub use plateau_model::cuda;
pub use plateau_model::{backend, config, cpu, dtype, error, layers, metric, vision, vocab, weights};

pub mod factory;
