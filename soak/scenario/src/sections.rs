//! The scenario's sections: `[engine]` (the engine under test), `[soak]` (length, warm-up,
//! sampling, tolerance) and `[pd]` (prefill/decode disaggregation). `[sim]` belongs to plateau-sim.

use std::path::PathBuf;

use serde::Deserialize;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineSection {
    pub preset: String,
    /// A Hugging Face Llama directory; replaces the preset.
    pub weights: Option<PathBuf>,
    pub weights_seed: u64,
    pub backend: String,
    /// Weights, activations and KV cache on the cuda backend: "f32" or "bf16" (cpu: f32 only).
    pub dtype: String,
    pub block_size: usize,
    pub num_kv_blocks: usize,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub max_model_len: Option<usize>,
    pub enable_prefix_caching: bool,
    /// Images smaller than this many pixels are scaled up (by the square root of the ratio).
    pub min_pixels: u64,
    /// Images larger than this many pixels are scaled down.
    pub max_pixels: u64,
    /// Images still above this after resizing are refused.
    pub hard_max_pixels: u64,
    /// Encoder cache budget, in embeddings.
    pub encoder_cache_tokens: usize,
    /// Encoder cache entries at most.
    pub encoder_cache_entries: usize,
    /// Encoder output tokens computed per step at most.
    pub max_encoder_tokens_per_step: usize,
}

impl Default for EngineSection {
    /// The engine's own defaults: a scenario that leaves a field out gets what the engine would.
    fn default() -> Self {
        let e = plateau_engine::EngineConfig::default();
        EngineSection {
            preset: "tiny".into(),
            weights: None,
            weights_seed: 0,
            backend: "cpu".into(),
            dtype: "f32".into(),
            block_size: e.block_size,
            num_kv_blocks: e.num_kv_blocks,
            max_num_seqs: e.max_num_seqs,
            max_num_batched_tokens: e.max_num_batched_tokens,
            max_model_len: e.max_model_len,
            enable_prefix_caching: e.enable_prefix_caching,
            min_pixels: e.image_limits.min_pixels,
            max_pixels: e.image_limits.max_pixels,
            hard_max_pixels: e.image_limits.hard_max_pixels,
            encoder_cache_tokens: e.encoder_cache_tokens,
            encoder_cache_entries: e.encoder_cache_entries,
            max_encoder_tokens_per_step: e.max_encoder_tokens_per_step,
        }
    }
}

impl EngineSection {
    /// The engine configuration this section describes (the backend is the shell's business).
    pub fn to_config(&self, injections: plateau_engine::Injections, seed: u64) -> plateau_engine::EngineConfig {
        let model = match &self.weights {
            Some(dir) => plateau_engine::WeightSource::Dir(dir.clone()),
            None => plateau_engine::WeightSource::Preset { name: self.preset.clone(), seed: self.weights_seed },
        };
        plateau_engine::EngineConfig {
            model,
            block_size: self.block_size,
            num_kv_blocks: self.num_kv_blocks,
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            max_model_len: self.max_model_len,
            enable_prefix_caching: self.enable_prefix_caching,
            seed,
            injections,
            image_limits: plateau_engine::ImageLimits {
                min_pixels: self.min_pixels,
                max_pixels: self.max_pixels,
                hard_max_pixels: self.hard_max_pixels,
            },
            encoder_cache_tokens: self.encoder_cache_tokens,
            encoder_cache_entries: self.encoder_cache_entries,
            max_encoder_tokens_per_step: self.max_encoder_tokens_per_step,
            ..plateau_engine::EngineConfig::default()
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SoakSection {
    pub iterations: u64,
    /// Wall-clock length such as "90s", "10m", "2h"; replaces `iterations` when set.
    pub duration: Option<String>,
    /// Quiescent points the trend test skips.
    pub warmup_iterations: u64,
    /// Timer samples between quiescent points.
    pub sample_interval_ms: u64,
    pub seed: u64,
    /// Byte growth accepted per request or per iteration (`64B/request`); None: the detector's
    /// default (`--tolerance` overrides it).
    pub tolerance: Option<String>,
    /// The cap on a run that goes on until decided (`run --until-decided`): while a gauge is
    /// undecided the run is extended in steps up to this many iterations. None: four times
    /// `iterations` ([`DEFAULT_UNTIL_DECIDED_FACTOR`]).
    pub max_iterations: Option<u64>,
    /// The length and warm-up of a run against a server plateau does not run in-process
    /// (`--target`, `--topology`), where they differ: a real engine compiles, caches and sizes its
    /// pools for each new batch shape over its first thousands of requests, longer than plateau's
    /// own engine warms. None: `iterations` and `warmup_iterations`.
    pub target_iterations: Option<u64>,
    pub target_warmup_iterations: Option<u64>,
}

/// A run that goes on until decided stops at this many times its planned length unless the
/// scenario sets `max_iterations`: a doubling staircase first seen at 200 iterations shows its
/// next step by 400 and the one after by 800, enough to tell doubling from a fill, while a nightly
/// job stays within four times its planned time.
pub const DEFAULT_UNTIL_DECIDED_FACTOR: u64 = 4;

impl Default for SoakSection {
    fn default() -> Self {
        SoakSection {
            iterations: 200,
            duration: None,
            warmup_iterations: plateau_reports::DEFAULT_WARMUP_ITERATIONS,
            sample_interval_ms: 1000,
            seed: 0,
            tolerance: None,
            max_iterations: None,
            target_iterations: None,
            target_warmup_iterations: None,
        }
    }
}

impl SoakSection {
    /// The cap of a run that goes on until decided, for a run planned at `planned` iterations
    /// (the scenario's, or `--iterations`).
    pub fn until_decided_cap(&self, planned: u64) -> u64 {
        self.max_iterations.unwrap_or(planned.saturating_mul(DEFAULT_UNTIL_DECIDED_FACTOR))
    }

    /// The section as a run against a server plateau does not run in-process reads it: its
    /// target length and warm-up in place of the others, where it gives them.
    pub fn for_target(&self) -> SoakSection {
        SoakSection {
            iterations: self.target_iterations.unwrap_or(self.iterations),
            warmup_iterations: self.target_warmup_iterations.unwrap_or(self.warmup_iterations),
            ..self.clone()
        }
    }

    /// The tolerance, parsed (validated at load, so only a programming error can fail here).
    pub fn tolerance(&self) -> Option<plateau_reports::Tolerance> {
        self.tolerance.as_deref().and_then(|t| t.parse().ok())
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PdSection {
    pub mode: PdMode,
    /// How long the prefill side holds KV for a decode side that never pulls it.
    pub kv_transfer_timeout_ms: u64,
    /// Transport bandwidth: bytes moved per step.
    pub transfer_bytes_per_step: usize,
    /// Registration cache size, in regions.
    pub regions: usize,
    /// Fraction of forwards lost to a dead decode node (the prefill side must time out).
    pub decode_failure_fraction: f64,
    /// Decode side: KV pulls in flight at once; the rest wait for their KV (`awaiting-kv`).
    pub max_pulls_in_flight: usize,
}

impl Default for PdSection {
    fn default() -> Self {
        PdSection {
            mode: PdMode::InProcess,
            kv_transfer_timeout_ms: 100,
            transfer_bytes_per_step: 128 * 1024,
            regions: 8,
            decode_failure_fraction: 0.0,
            max_pulls_in_flight: plateau_engine::EngineConfig::default().max_pulls_in_flight,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PdMode {
    /// Both engines in this process, the in-process transport between them.
    InProcess,
    /// A process per role, a TCP transport between them.
    Processes,
}
