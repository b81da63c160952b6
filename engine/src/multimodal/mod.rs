//! Multimodal input: images on requests (decoded, checked and turned into pixel tensors), and
//! their wire formats. The encoder cache that shares their encodings across requests is
//! `encoder_cache.rs`, beside the engine's other registries.

pub mod codec;
pub mod image;
