//! Errors the engine returns. A rejected call changes no state.

use thiserror::Error;

use plateau_model::ModelError;

use crate::request::RequestId;

#[derive(Debug, Error, PartialEq)]
pub enum EngineError {
    #[error("request {id}: {reason}")]
    InvalidRequest { id: RequestId, reason: String },
    #[error("request id {0} is already in use")]
    DuplicateRequest(RequestId),
    #[error("the engine is asleep (level {0}): wake it before adding requests")]
    Asleep(u8),
    #[error("cannot sleep with {0} requests in flight: abort or drain them first")]
    Busy(usize),
    #[error("sleep level must be 1 or 2, got {0}")]
    BadSleepLevel(u8),
    #[error("the engine is not asleep")]
    NotAsleep,
    #[error("engine configuration: {0}")]
    Config(String),
    /// The model's or its backend's error, as it was.
    #[error(transparent)]
    Model(#[from] ModelError),
}

impl EngineError {
    /// A backend's failure (the device, or a node standing in for one).
    pub fn backend(message: impl Into<String>) -> EngineError {
        EngineError::Model(ModelError::Backend(message.into()))
    }

    /// Weights that do not fit the engine's model.
    pub fn weights(message: impl Into<String>) -> EngineError {
        EngineError::Model(ModelError::Weights(message.into()))
    }
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
