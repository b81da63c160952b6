//! What a model or a backend can fail at: its weights, its configuration (a preset, a
//! `config.json`), or the device. The engine carries it as it is (`EngineError::Model`).

use thiserror::Error;

#[derive(Debug, Error, PartialEq)]
pub enum ModelError {
    #[error("weights: {0}")]
    Weights(String),
    #[error("model configuration: {0}")]
    Config(String),
    #[error("backend: {0}")]
    Backend(String),
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;
