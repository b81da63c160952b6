//! Multimodal input: images on requests, and the encoder cache that shares their encodings.

pub mod codec;
pub mod encoder_cache;
pub mod image;
