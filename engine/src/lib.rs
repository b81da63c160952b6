//! plateau-engine: a small, complete, deterministic vLLM-style inference engine core, the system
//! under test of the plateau soak harness.
//!
//! The core is a synchronous state machine ([`Engine`]): `add_request`, `abort`, `step`, `sleep`,
//! `wake`, `stats`, `check_idle`. It owns no threads, clock, sockets or global RNG. Shells (the
//! soak driver, the simulator) drive it. Every structure that holds per-request state is created
//! through a counted [`registry::Registries`] book, so the harness sees all of them.

pub mod block_pool;
pub mod engine;
pub mod error;
pub mod inject;
pub mod kv_manager;
pub mod model;
pub mod multimodal;
pub mod pd;
pub mod registry;
pub mod request;
pub mod sampler;
pub mod scheduler;
pub mod tokenizer;

pub use engine::{AbortOutcome, Engine, EngineConfig, IdleViolation, RequestStage};
pub use error::EngineError;
pub use inject::{Injection, Injections};
pub use model::backend::Backend;
pub use model::config::{ModelConfig, VisionConfig};
pub use model::cpu::CpuBackend;
pub use model::weights::{ModelWeights, WeightSource};
pub use multimodal::image::{ImageInput, ImageLimits};
pub use pd::{Notice, PullOrder, Role, TransferParams};
pub use registry::{Metric, MetricKind};
pub use request::{FinishReason, Request, RequestId, RequestOutput, SamplingParams, SeqOutput};
