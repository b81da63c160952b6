//! Turns a scenario's phases into the engine's requests, deterministically from the seed: prompt
//! templates with a run-wide request counter, seeded padding and shared prefixes, the invalid
//! requests mixed into a batch, the requests a pressure phase needs, and which requests to abort.

use plateau_engine::tokenizer::{encode, BOS, BYTE_OFFSET};
use plateau_engine::{Request, SamplingParams};
use rand_chacha::ChaCha8Rng;
use rand_core::RngCore;

use std::collections::BTreeMap;

use plateau_engine::ImageInput;

pub use crate::photo::photo;
pub use crate::seeds::rng_for;
use crate::{Batch, ImageFormatSpec, ImageSpec, Pressure};

/// Seeded byte tokens.
fn random_tokens(rng: &mut ChaCha8Rng, n: usize) -> Vec<u32> {
    (0..n).map(|_| BYTE_OFFSET + (rng.next_u32() % 256)).collect()
}

/// `{i}`, `{i:0N}` and `{iter}` in a prompt template.
pub fn render(template: &str, i: u64, iter: u64) -> String {
    let mut out = String::with_capacity(template.len() + 16);
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let Some(close) = rest[open..].find('}') else {
            break;
        };
        let field = &rest[open + 1..open + close];
        match field {
            "i" => out.push_str(&i.to_string()),
            "iter" => out.push_str(&iter.to_string()),
            f if f.starts_with("i:0") && f[3..].parse::<usize>().is_ok() => {
                let w: usize = f[3..].parse().expect("checked");
                out.push_str(&format!("{i:0w$}"));
            }
            other => {
                out.push('{');
                out.push_str(other);
                out.push('}');
            }
        }
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    out
}

/// The image a client would send for `spec`.
pub fn image_input(spec: &ImageSpec, seed: u64) -> ImageInput {
    use plateau_engine::multimodal::codec;
    let (w, h) = (spec.width, spec.height);
    let pixels = photo(w, h, seed);
    let encoded = match spec.format {
        ImageFormatSpec::Rgb => return ImageInput::Rgb { width: w, height: h, pixels },
        ImageFormatSpec::Png => codec::encode_png(w, h, &pixels),
        ImageFormatSpec::Jpeg => codec::encode_jpeg(w, h, &pixels),
    };
    // Sizes are validated with the scenario (at most 4096 a side): encoding to memory cannot fail.
    ImageInput::Encoded(encoded.expect("a validated image size encodes"))
}

/// Request ids and their construction for one run.
#[derive(Debug)]
pub struct Workload {
    pub seed: u64,
    pub next_id: u64,
    /// Shared (non-unique) images, made once per run: (phase, index in the phase's list).
    images: BTreeMap<(usize, usize), ImageInput>,
}

impl Workload {
    pub fn new(seed: u64) -> Self {
        Workload { seed, next_id: 0, images: BTreeMap::new() }
    }

    fn take_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    pub fn batch(&mut self, phase: usize, b: &Batch, iter: u64) -> Vec<Request> {
        let shared = random_tokens(&mut rng_for(&[self.seed, phase as u64, 0x5eed]), b.shared_prefix_tokens as usize);
        (0..b.requests)
            .map(|_| {
                let id = self.take_id();
                let mut prompt = vec![BOS];
                prompt.extend(&shared);
                prompt.extend(&encode(&render(&b.prompt, id, iter))[1..]);
                if let Some(len) = b.prompt_tokens {
                    let pad = (len as usize).saturating_sub(prompt.len());
                    prompt.extend(random_tokens(&mut rng_for(&[self.seed, id]), pad));
                }
                let pads = prompt.iter().filter(|&&t| t == plateau_engine::tokenizer::IMAGE_PAD).count();
                let images = (0..pads)
                    .map(|j| {
                        let k = (id as usize + j) % b.images.len();
                        let spec = &b.images[k];
                        if spec.unique {
                            image_input(spec, self.seed ^ id.rotate_left(17) ^ j as u64)
                        } else {
                            let seed = self.seed ^ (phase as u64) << 32 ^ k as u64;
                            self.images.entry((phase, k)).or_insert_with(|| image_input(spec, seed)).clone()
                        }
                    })
                    .collect();
                let params = SamplingParams {
                    n: b.n,
                    temperature: b.temperature,
                    top_p: b.top_p,
                    top_k: b.top_k,
                    max_tokens: b.max_tokens,
                    stop_token_ids: b.stop_token_ids.clone(),
                    ignore_eos: b.ignore_eos,
                    seed: Some(self.seed ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
                };
                Request { id, prompt, params, images }
            })
            .collect()
    }

    /// Requests whose KV demand is `overcommit` times the pool's tokens.
    pub fn pressure(&mut self, p: &Pressure, pool_tokens: usize, max_seqs: usize) -> Vec<Request> {
        let per_request = p.prompt_tokens as f64 + p.n as f64 * p.max_tokens as f64;
        let count = ((p.overcommit * pool_tokens as f64 / per_request).ceil() as usize)
            .clamp(1, (max_seqs / p.n as usize).max(1));
        (0..count)
            .map(|_| {
                let id = self.take_id();
                let mut prompt = vec![BOS];
                prompt.extend(random_tokens(&mut rng_for(&[self.seed, id]), p.prompt_tokens as usize - 1));
                let params = SamplingParams {
                    n: p.n,
                    max_tokens: p.max_tokens,
                    ignore_eos: true,
                    seed: Some(self.seed ^ id),
                    ..SamplingParams::default()
                };
                Request { id, prompt, params, images: Vec::new() }
            })
            .collect()
    }

    /// The `k`-th kind of invalid request, in rotation; each must be refused by the engine.
    pub fn invalid(&mut self, k: u64, vocab_size: usize) -> (Request, &'static str) {
        let id = self.take_id();
        let ok = SamplingParams { seed: Some(id), ..SamplingParams::default() };
        let prompt = encode("invalid request");
        let (prompt, params, what) = match k % 6 {
            0 => (vec![], ok, "empty prompt"),
            1 => (prompt, SamplingParams { top_p: 0.0, ..ok }, "top_p = 0"),
            2 => (prompt, SamplingParams { temperature: -1.0, ..ok }, "temperature < 0"),
            3 => (vec![BOS, vocab_size as u32 + 7], ok, "token outside the vocabulary"),
            4 => (prompt, SamplingParams { n: 0, ..ok }, "n = 0"),
            _ => (prompt, SamplingParams { max_tokens: 0, ..ok }, "max_tokens = 0"),
        };
        (Request { id, prompt, params, images: Vec::new() }, what)
    }

    /// Which of `ids` to abort: a seeded choice of `round(fraction * len)` of them.
    pub fn abort_targets(&self, ids: &[u64], fraction: f64, iter: u64, phase: usize) -> Vec<u64> {
        let mut rng = rng_for(&[self.seed, iter, phase as u64, 0xab07]);
        let mut pool = ids.to_vec();
        let count = ((fraction * ids.len() as f64).round() as usize).min(ids.len());
        let mut chosen = Vec::with_capacity(count);
        for _ in 0..count {
            let k = (rng.next_u64() % pool.len() as u64) as usize;
            chosen.push(pool.swap_remove(k));
        }
        chosen.sort_unstable();
        chosen
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates() {
        assert_eq!(render("Question No.{i:08} x", 42, 3), "Question No.00000042 x");
        assert_eq!(render("{i}-{iter}-{other}", 5, 9), "5-9-{other}");
    }

    #[test]
    fn batches_are_deterministic_and_padded() {
        let b = Batch { requests: 3, prompt_tokens: Some(50), shared_prefix_tokens: 8, ..Batch::default() };
        let a = Workload::new(1).batch(0, &b, 1);
        let c = Workload::new(1).batch(0, &b, 1);
        assert_eq!(a, c);
        assert!(a.iter().all(|r| r.prompt.len() >= 50));
        assert_eq!(a[0].prompt[..9], a[1].prompt[..9], "shared prefix");
        assert_ne!(a[0].prompt, a[1].prompt);
    }
}
