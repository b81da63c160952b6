//! The model: its shape, its weights, and the backends that compute it.

mod attention;
pub mod backend;
pub mod config;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod dtype;
pub mod factory;
pub mod layers;
pub mod vision;
pub mod weights;
