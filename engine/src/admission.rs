//! Admission: what a request must be to enter the engine, checked before anything is allocated.
//! A refused request changes nothing. An admitted one has its images processed (decoded, resized
//! into the pixel range, hashed) and each image placeholder expanded to as many positions as the
//! vision encoder produces for that image.

use std::sync::Arc;

use crate::config::EngineConfig;
use crate::error::{EngineError, Result};
use crate::model::config::ModelConfig;
use crate::multimodal::image;
use crate::pd::Role;
use crate::request::Request;
use crate::store::ImageItem;
use crate::tokenizer::IMAGE_PAD;

/// What admission checks against.
pub(crate) struct Limits<'a> {
    pub config: &'a EngineConfig,
    pub model: &'a ModelConfig,
    pub max_model_len: usize,
}

/// The engine's state as admission sees it.
pub(crate) struct State {
    pub asleep: Option<u8>,
    /// The id is in use: a request in flight, or one whose KV the prefill side still holds.
    pub id_in_use: bool,
}

/// Checks a request's parameters; touches nothing.
pub(crate) fn validate(l: &Limits, state: State, r: &Request) -> Result<()> {
    let bad = |reason: String| Err(EngineError::InvalidRequest { id: r.id, reason });
    let p = &r.params;
    if let Some(level) = state.asleep {
        return Err(EngineError::Asleep(level));
    }
    if state.id_in_use {
        return Err(EngineError::DuplicateRequest(r.id));
    }
    if r.prompt.is_empty() {
        return bad("empty prompt".into());
    }
    let vocab = l.model.vocab_size;
    if let Some(&t) = r.prompt.iter().find(|&&t| t as usize >= vocab) {
        return bad(format!("token id {t} is outside the vocabulary of {vocab}"));
    }
    if p.n == 0 {
        return bad("n must be at least 1".into());
    }
    if p.n as usize > l.config.max_num_seqs {
        return bad(format!("n = {} exceeds max_num_seqs = {}", p.n, l.config.max_num_seqs));
    }
    if p.max_tokens == 0 {
        return bad("max_tokens must be at least 1".into());
    }
    if l.config.role != Role::Monolithic && (p.n != 1 || !r.images.is_empty()) {
        return bad("disaggregated requests take n = 1 and no images".into());
    }
    if !(p.top_p > 0.0 && p.top_p <= 1.0) {
        return bad(format!("top_p {} is outside (0, 1]", p.top_p));
    }
    if !p.temperature.is_finite() || p.temperature < 0.0 {
        return bad(format!("temperature {} must be finite and >= 0", p.temperature));
    }
    if let Some(&t) = p.stop_token_ids.iter().find(|&&t| t as usize >= vocab) {
        return bad(format!("stop token id {t} is outside the vocabulary of {vocab}"));
    }
    let pads = r.prompt.iter().filter(|&&t| t == IMAGE_PAD).count();
    if pads != r.images.len() {
        return bad(format!("the prompt has {pads} image placeholders and the request {} images", r.images.len()));
    }
    if !r.images.is_empty() && l.model.vision.is_none() {
        return bad("the model has no vision encoder: images need a model such as the tiny-vl preset".into());
    }
    Ok(())
}

/// Processes a request's images and expands each placeholder to its encoder output length;
/// refuses what could never be served (too long, more KV than the pool, more images than the
/// encoder cache holds).
pub(crate) fn expand_images(l: &Limits, r: &Request) -> Result<(Vec<u32>, Vec<ImageItem>)> {
    let bad = |reason: String| EngineError::InvalidRequest { id: r.id, reason };
    let c = l.config;
    let mut prompt = Vec::with_capacity(r.prompt.len());
    let mut items = Vec::with_capacity(r.images.len());
    let mut inputs = r.images.iter().enumerate();
    for &t in &r.prompt {
        if t != IMAGE_PAD {
            prompt.push(t);
            continue;
        }
        let (k, input) = inputs.next().expect("placeholders counted");
        let v = l.model.vision.as_ref().expect("checked");
        let px = image::process(input, &c.image_limits, v.grid_factor()).map_err(|m| bad(format!("image {k}: {m}")))?;
        let len = crate::model::vision::num_tokens(v, px.width, px.height);
        if len > c.encoder_cache_tokens.min(c.max_encoder_tokens_per_step) {
            return Err(bad(format!(
                "image {k} encodes to {len} embeddings, more than the encoder cache budget ({}) or step budget ({})",
                c.encoder_cache_tokens, c.max_encoder_tokens_per_step
            )));
        }
        items.push(ImageItem { start: prompt.len(), len, hash: px.hash, pixels: Arc::new(px) });
        prompt.extend(std::iter::repeat_n(IMAGE_PAD, len));
    }
    let mut distinct: Vec<(u64, usize)> = items.iter().map(|i| (i.hash, i.len)).collect();
    distinct.sort_unstable();
    distinct.dedup();
    let total: usize = distinct.iter().map(|d| d.1).sum();
    if total > c.encoder_cache_tokens || distinct.len() > c.encoder_cache_entries {
        return Err(bad(format!(
            "{} distinct images encode to {total} embeddings, more than the encoder cache holds ({} embeddings, {} entries)",
            distinct.len(),
            c.encoder_cache_tokens,
            c.encoder_cache_entries
        )));
    }
    if prompt.len() >= l.max_model_len {
        return Err(bad(format!(
            "prompt of {} tokens leaves no room under the maximum length of {} tokens",
            prompt.len(),
            l.max_model_len
        )));
    }
    let blocks = (prompt.len() + 1).div_ceil(c.block_size);
    if blocks > c.num_kv_blocks {
        return Err(bad(format!("the prompt needs {blocks} KV blocks and the pool has {}", c.num_kv_blocks)));
    }
    Ok((prompt, items))
}

/// A request's seed: its own, or one mixed from the engine seed and its id (splitmix64).
pub(crate) fn request_seed(engine_seed: u64, r: &Request) -> u64 {
    r.params.seed.unwrap_or_else(|| {
        let mut z = engine_seed ^ r.id.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z ^ (z >> 31)
    })
}
