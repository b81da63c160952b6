//! plateau-engine: a small, complete, deterministic vLLM-style inference engine core, the system
//! under test of the plateau soak harness.
//!
//! The core is a synchronous state machine ([`Engine`]): `add_request`, `abort`, `step`, `sleep`,
//! `wake`, `stats`, `check_idle`. It owns no threads, clock, sockets or global RNG. Shells (the
//! soak driver, the simulator) drive it. Every structure that holds per-request state is created
//! through a counted [`registry::Registries`] book, so the harness sees all of them.

mod admission;
pub mod block_pool;
pub mod config;
pub mod encoder_cache;
pub mod engine;
pub mod error;
pub mod inject;
pub mod kv_manager;
mod metrics;
pub mod model;
mod model_runner;
pub mod multimodal;
mod output;
pub mod pd;
pub mod plant;
pub mod registry;
pub mod request;
pub mod sampler;
pub mod scheduler;
mod store;
pub mod tokenizer;

pub use plateau_model::stable_hash;

pub use config::EngineConfig;
pub use engine::Engine;
pub use error::EngineError;
pub use inject::{Injection, Injections};
pub use metrics::{IdleViolation, REQUESTS_ADDED};
pub use model::backend::Backend;
pub use model::config::{ModelConfig, VisionConfig};
pub use model::cpu::CpuBackend;
pub use model::weights::{ModelWeights, WeightSource};
pub use multimodal::image::{ImageInput, ImageLimits};
pub use pd::{next_hop, NextHop, Notice, PullOrder, Role, TransferParams};
pub use plant::Plant;
pub use registry::{Metric, MetricKind};
pub use request::{
    AbortOutcome, FinishReason, Request, RequestId, RequestOutput, RequestStage, SamplingParams, SeqOutput,
};
