//! plateau-model: the model plateau's engine computes, behind the [`backend::Backend`] trait.
//! The engine decides what to compute (which tokens, into which KV blocks); a backend computes it
//! and owns the memory it computes in (weights, KV pool). Nothing here knows of requests.

mod attention;
pub mod backend;
pub mod config;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod dtype;
pub mod error;
pub mod layers;
pub mod metric;
pub mod stable_hash;
pub mod vision;
pub mod vocab;
pub mod weights;

pub use backend::{Backend, BlockCopy, BlockId, PoolRelease};
pub use error::{ModelError, Result};
