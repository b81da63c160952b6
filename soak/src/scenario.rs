//! Scenario scripts (TOML): the engine setup, the soak length, and the phases each iteration runs.
//! scenarios/README.md documents every field. Loading is strict: an unknown or misspelled field, a
//! wrong type or an impossible value is an error naming file:line, the field and the closest known
//! name.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The scenarios shipped with plateau, embedded so that `plateau run NAME` and `plateau selftest`
/// work from any directory.
pub const SHIPPED: [(&str, &str); 7] = [
    ("pd-transfer", include_str!("../../scenarios/pd-transfer.toml")),
    ("multimodal-repeat", include_str!("../../scenarios/multimodal-repeat.toml")),
    ("n-sampling", include_str!("../../scenarios/n-sampling.toml")),
    ("aborts", include_str!("../../scenarios/aborts.toml")),
    ("rl-rollout", include_str!("../../scenarios/rl-rollout.toml")),
    ("prefill-only", include_str!("../../scenarios/prefill-only.toml")),
    ("mixed", include_str!("../../scenarios/mixed.toml")),
];

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    pub description: String,
    #[serde(default)]
    pub engine: EngineSection,
    #[serde(default)]
    pub soak: SoakSection,
    /// Prefill/decode disaggregation: when present, requests go through a prefill/decode pair.
    pub pd: Option<PdSection>,
    /// Cluster shape and faults for the simulator (plateau-sim); the soak ignores it.
    #[serde(default)]
    pub sim: SimSection,
    #[serde(rename = "phase")]
    pub phases: Vec<Phase>,
}

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

/// The simulated cluster: how many nodes of each role, how long a run is, which fault profile
/// applies and the timing the cost model uses. Only plateau-sim reads it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimSection {
    pub prefill_nodes: usize,
    pub decode_nodes: usize,
    pub monolithic_nodes: usize,
    /// Scenario iterations per simulated run (each ends at a quiescent point).
    pub iterations: u64,
    /// Fault profile: none, light, default, heavy (plateau-sim list-faults).
    pub faults: String,
    /// The router gives up on a request after this long and reports it failed.
    pub request_timeout_ms: u64,
    /// Requests of one iteration arrive spread over this window.
    pub arrival_window_ms: u64,
    /// KV transfer bandwidth between nodes, in MB/s (10,000 is a 100 Gb/s link at 80%).
    pub kv_bandwidth_mb_per_s: u64,
}

impl Default for SimSection {
    fn default() -> Self {
        SimSection {
            prefill_nodes: 1,
            decode_nodes: 1,
            monolithic_nodes: 1,
            iterations: 8,
            faults: "default".into(),
            request_timeout_ms: 2_000,
            arrival_window_ms: 50,
            kv_bandwidth_mb_per_s: 10_000,
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
}

impl Default for SoakSection {
    fn default() -> Self {
        SoakSection {
            iterations: 200,
            duration: None,
            warmup_iterations: crate::detector::DEFAULT_WARMUP_ITERATIONS,
            sample_interval_ms: 1000,
            seed: 0,
            tolerance: None,
        }
    }
}

impl SoakSection {
    /// The tolerance, parsed (validated at load, so only a programming error can fail here).
    pub fn tolerance(&self) -> Option<crate::detector::Tolerance> {
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
}

impl Default for PdSection {
    fn default() -> Self {
        PdSection {
            mode: PdMode::InProcess,
            kv_transfer_timeout_ms: 100,
            transfer_bytes_per_step: 128 * 1024,
            regions: 8,
            decode_failure_fraction: 0.0,
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

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Phase {
    Batch(Batch),
    Pressure(Pressure),
    Sleep(Sleep),
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Batch {
    pub requests: u32,
    /// Text; `{i}` or `{i:08}` is the run-wide request counter, `{iter}` the iteration.
    pub prompt: String,
    /// Pad the prompt with seeded bytes up to this many tokens.
    pub prompt_tokens: Option<u32>,
    /// Tokens shared by every request of the phase (the same in every iteration), before the text.
    pub shared_prefix_tokens: u32,
    pub n: u32,
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: u32,
    pub max_tokens: u32,
    pub ignore_eos: bool,
    pub stop_token_ids: Vec<u32>,
    pub abort: Option<Abort>,
    /// Invalid requests mixed into the batch; each must be refused.
    pub invalid: u32,
    /// Images for the prompt's `<|image_pad|>` placeholders: request i's j-th placeholder takes
    /// `images[(i + j) % len]`.
    pub images: Vec<ImageSpec>,
}

/// A seeded, photo-like image.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageSpec {
    pub width: u32,
    pub height: u32,
    /// How the client sends it: `jpeg`, `png` or `rgb` (raw pixels, as a decoded PIL image).
    #[serde(default = "ImageSpec::default_format")]
    pub format: ImageFormatSpec,
    /// A different image for every request (by default the same pixels each time, as in the
    /// reported reproduction, so the encoder cache hits).
    #[serde(default)]
    pub unique: bool,
}

impl ImageSpec {
    fn default_format() -> ImageFormatSpec {
        ImageFormatSpec::Rgb
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ImageFormatSpec {
    Jpeg,
    Png,
    Rgb,
}

impl Default for Batch {
    fn default() -> Self {
        Batch {
            requests: 20,
            prompt: "Question No.{i:08} Conclude this text in 10 words.".into(),
            prompt_tokens: None,
            shared_prefix_tokens: 0,
            n: 1,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            max_tokens: 16,
            ignore_eos: false,
            stop_token_ids: Vec::new(),
            abort: None,
            invalid: 0,
            images: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Abort {
    /// Fraction of the phase's requests aborted, in [0, 1].
    pub fraction: f64,
    pub stage: Stage,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Stage {
    /// Before it is first scheduled.
    Waiting,
    /// Its images partly or wholly encoded, its prompt not yet started.
    Encode,
    /// Decode side of a P/D pair: before its KV pull starts.
    AwaitingKv,
    /// Decode side of a P/D pair: while its KV is being pulled.
    PullingKv,
    /// After part of its prompt is computed, before its first token.
    Prefill,
    /// After it has produced tokens.
    Decode,
    /// While preempted back to the waiting queue.
    Preempted,
    /// At a seeded random step.
    Any,
}

/// Requests whose KV demand exceeds the pool `overcommit` times over, forcing preemption.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Pressure {
    pub prompt_tokens: u32,
    pub max_tokens: u32,
    pub n: u32,
    pub overcommit: f64,
    pub abort: Option<Abort>,
}

impl Default for Pressure {
    fn default() -> Self {
        Pressure { prompt_tokens: 96, max_tokens: 32, n: 1, overcommit: 1.5, abort: None }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Sleep {
    /// 1 releases the KV cache, 2 the weights too.
    pub level: u8,
    /// Replace the weights while asleep (new seed each iteration), as an RL trainer does.
    pub update_weights: bool,
}

impl Default for Sleep {
    fn default() -> Self {
        Sleep { level: 1, update_weights: false }
    }
}

/// A scenario error: where (file:line:column), which field, what, and a suggestion.
#[derive(Debug, thiserror::Error)]
#[error("{file}:{line}:{column}: {message}")]
pub struct ScenarioError {
    pub file: String,
    pub line: usize,
    pub column: usize,
    pub message: String,
}

/// Where a value sits in the file: (section, index of a repeated section), key.
#[derive(Debug, Clone, Copy)]
struct Place<'a> {
    section: Option<(&'a str, usize)>,
    key: &'a str,
}

pub fn parse_duration_secs(s: &str) -> Result<f64, String> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(s.len()));
    let v: f64 = num.parse().map_err(|_| format!("`{s}` is not a duration such as 90s, 10m or 2h"))?;
    let mult = match unit {
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => return Err(format!("`{s}`: unit must be s, m or h")),
    };
    if !(v > 0.0 && v * mult <= 366.0 * 86_400.0) {
        return Err(format!("`{s}` must be positive and at most a year"));
    }
    Ok(v * mult)
}

impl Scenario {
    /// Loads a scenario from a path, or a shipped one by name.
    pub fn load(arg: &str) -> Result<(Scenario, String), ScenarioError> {
        let path = Path::new(arg);
        if !path.exists() {
            if let Some((_, text)) = SHIPPED.iter().find(|(n, _)| *n == arg) {
                return Ok((Scenario::parse(text, &format!("<shipped {arg}>"))?, format!("<shipped {arg}>")));
            }
        }
        let text = std::fs::read_to_string(path).map_err(|e| ScenarioError {
            file: arg.to_string(),
            line: 0,
            column: 0,
            message: format!("cannot read the scenario: {e}"),
        })?;
        Ok((Scenario::parse(&text, arg)?, arg.to_string()))
    }

    pub fn parse(text: &str, file: &str) -> Result<Scenario, ScenarioError> {
        let s: Scenario = toml::from_str(text)
            .map_err(|e| {
                let (line, column) = e.span().map(|sp| line_col(text, sp.start)).unwrap_or((0, 0));
                phase_error(text, line).unwrap_or_else(|| (line, column, explain(e.message())))
            })
            .map_err(|(line, column, message)| ScenarioError { file: file.to_string(), line, column, message })?;
        s.validate(text, file)?;
        Ok(s)
    }

    fn validate(&self, text: &str, file: &str) -> Result<(), ScenarioError> {
        let fail = |place: Place, message: String| {
            let line = locate(text, place);
            let field = match place.section {
                Some((sec, i)) if sec == "phase" => format!("phase[{i}].{}", place.key),
                Some((sec, _)) => format!("{sec}.{}", place.key),
                None => place.key.to_string(),
            };
            Err(ScenarioError { file: file.to_string(), line, column: 1, message: format!("{field}: {message}") })
        };
        let top = |key| Place { section: None, key };
        let eng = |key| Place { section: Some(("engine", 0)), key };
        let soak = |key| Place { section: Some(("soak", 0)), key };
        if self.name.trim().is_empty() {
            return fail(top("name"), "must not be empty".into());
        }
        if self.phases.is_empty() {
            return fail(top("phase"), "a scenario needs at least one [[phase]]".into());
        }
        let e = &self.engine;
        if !["cpu", "cuda", "auto"].contains(&e.backend.as_str()) {
            return fail(eng("backend"), format!("`{}` is not one of cpu, cuda, auto", e.backend));
        }
        if !["f32", "bf16"].contains(&e.dtype.as_str()) {
            return fail(eng("dtype"), format!("`{}` is not one of f32, bf16", e.dtype));
        }
        if e.weights.is_none() {
            if let Err(err) = plateau_engine::ModelConfig::preset(&e.preset) {
                return fail(eng("preset"), err.to_string());
            }
        }
        for (key, v) in [
            ("block_size", e.block_size),
            ("num_kv_blocks", e.num_kv_blocks),
            ("max_num_seqs", e.max_num_seqs),
            ("max_num_batched_tokens", e.max_num_batched_tokens),
        ] {
            if v == 0 {
                return fail(eng(key), "must be at least 1".into());
            }
        }
        if e.encoder_cache_tokens == 0 || e.encoder_cache_entries == 0 || e.max_encoder_tokens_per_step == 0 {
            return fail(
                eng("encoder_cache_tokens"),
                "encoder_cache_tokens, encoder_cache_entries and max_encoder_tokens_per_step must be positive".into(),
            );
        }
        if !(e.min_pixels >= 1 && e.min_pixels <= e.max_pixels && e.max_pixels <= e.hard_max_pixels) {
            return fail(eng("max_pixels"), "need 1 <= min_pixels <= max_pixels <= hard_max_pixels".into());
        }
        let sim = &self.sim;
        let at = |key| Place { section: Some(("sim", 0)), key };
        if (sim.prefill_nodes == 0) != (sim.decode_nodes == 0) {
            return fail(at("prefill_nodes"), "prefill_nodes and decode_nodes are both 0 or both at least 1".into());
        }
        let nodes = sim.prefill_nodes + sim.decode_nodes + sim.monolithic_nodes;
        if nodes == 0 || nodes > 32 {
            return fail(at("monolithic_nodes"), format!("{nodes} engine nodes: need 1 to 32"));
        }
        if !(1..=10_000).contains(&sim.iterations) {
            return fail(at("iterations"), format!("{} is outside 1..=10000", sim.iterations));
        }
        for (key, v, max) in [
            ("request_timeout_ms", sim.request_timeout_ms, 3_600_000),
            ("arrival_window_ms", sim.arrival_window_ms, 3_600_000),
            ("kv_bandwidth_mb_per_s", sim.kv_bandwidth_mb_per_s, 10_000_000),
        ] {
            if v == 0 || v > max {
                return fail(at(key), format!("{v} is outside 1..={max}"));
            }
        }
        if let Some(pd) = &self.pd {
            let at = |key| Place { section: Some(("pd", 0)), key };
            if !(0.0..1.0).contains(&pd.decode_failure_fraction) {
                return fail(
                    at("decode_failure_fraction"),
                    format!("{} is outside [0, 1)", pd.decode_failure_fraction),
                );
            }
            if pd.regions == 0 || pd.transfer_bytes_per_step == 0 || pd.kv_transfer_timeout_ms == 0 {
                return fail(
                    at("regions"),
                    "regions, transfer_bytes_per_step and kv_transfer_timeout_ms must be positive".into(),
                );
            }
            let not_pd = |p: &Phase| match p {
                Phase::Batch(b) => b.n != 1 || !b.images.is_empty(),
                Phase::Pressure(pr) => pr.n != 1,
                Phase::Sleep(_) => false,
            };
            if pd.kv_transfer_timeout_ms > 3_600_000 {
                return fail(at("kv_transfer_timeout_ms"), "at most an hour (3600000)".into());
            }
            if self.phases.iter().any(not_pd) {
                return fail(at("mode"), "disaggregated scenarios take n = 1 and no images in every batch".into());
            }
        }
        if self.soak.iterations == 0 {
            return fail(soak("iterations"), "must be at least 1".into());
        }
        if let Some(d) = &self.soak.duration {
            if let Err(m) = parse_duration_secs(d) {
                return fail(soak("duration"), m);
            }
        }
        if let Some(t) = &self.soak.tolerance {
            if let Err(m) = t.parse::<crate::detector::Tolerance>() {
                return fail(soak("tolerance"), m);
            }
        }
        if self.soak.duration.is_none() && self.soak.warmup_iterations >= self.soak.iterations {
            return fail(
                soak("warmup_iterations"),
                format!(
                    "{} is at or past the run's length ({} iterations): nothing would be judged",
                    self.soak.warmup_iterations, self.soak.iterations
                ),
            );
        }
        // Sizes are bounded before anything is allocated: the longest sequence the model takes
        // (a preset's, or the engine's max_model_len; for weights from a directory, the largest
        // any supported model takes), and the KV pool against this machine's memory.
        let preset = e.weights.is_none().then(|| plateau_engine::ModelConfig::preset(&e.preset).ok()).flatten();
        let max_len =
            e.max_model_len.or(preset.as_ref().map(|c| c.max_position_embeddings)).unwrap_or(MAX_SEQUENCE_TOKENS);
        if let Some(c) = &preset {
            let kv_bytes = e.num_kv_blocks as u128 * e.block_size as u128 * c.kv_bytes_per_token() as u128;
            if let Some(avail) = available_memory_bytes() {
                if kv_bytes > avail as u128 {
                    return fail(
                        eng("num_kv_blocks"),
                        format!(
                            "a KV pool of {:.1} GiB ({} blocks of {} tokens) does not fit in this machine's available memory ({:.1} GiB)",
                            kv_bytes as f64 / GIB,
                            e.num_kv_blocks,
                            e.block_size,
                            avail as f64 / GIB
                        ),
                    );
                }
            }
        }
        for (i, p) in self.phases.iter().enumerate() {
            let at = |key| Place { section: Some(("phase", i)), key };
            let check_sampling = |n: u32, max_tokens: u32| {
                if n == 0 {
                    return fail(at("n"), "must be at least 1".into());
                }
                if n as usize > e.max_num_seqs {
                    return fail(at("n"), format!("{n} exceeds engine.max_num_seqs = {}", e.max_num_seqs));
                }
                if max_tokens == 0 {
                    return fail(at("max_tokens"), "must be at least 1".into());
                }
                Ok(())
            };
            let check_abort = |a: &Option<Abort>| match a {
                Some(a) if !(0.0..=1.0).contains(&a.fraction) => {
                    fail(at("fraction"), format!("{} is outside [0, 1]", a.fraction))
                }
                _ => Ok(()),
            };
            match p {
                Phase::Batch(b) => {
                    check_sampling(b.n, b.max_tokens)?;
                    check_abort(&b.abort)?;
                    if !(1..=MAX_REQUESTS_PER_PHASE).contains(&b.requests) {
                        return fail(at("requests"), format!("{} is outside 1..={MAX_REQUESTS_PER_PHASE}", b.requests));
                    }
                    if b.invalid > MAX_REQUESTS_PER_PHASE {
                        return fail(at("invalid"), format!("{} is above {MAX_REQUESTS_PER_PHASE}", b.invalid));
                    }
                    if let Some(w) = template_widths(&b.prompt).find(|w| *w > MAX_TEMPLATE_WIDTH) {
                        return fail(
                            at("prompt"),
                            format!("a field width of {w} is above {MAX_TEMPLATE_WIDTH} (a request counter has at most 20 digits)"),
                        );
                    }
                    let fixed = b.shared_prefix_tokens as u64 + b.prompt_tokens.unwrap_or(0) as u64;
                    if fixed + b.max_tokens as u64 >= max_len as u64 {
                        let key = if b.shared_prefix_tokens as u64 >= b.prompt_tokens.unwrap_or(0) as u64 {
                            "shared_prefix_tokens"
                        } else {
                            "prompt_tokens"
                        };
                        return fail(
                            at(key),
                            format!(
                                "shared_prefix_tokens {} + prompt_tokens {} + max_tokens {} leave no room under the model's {max_len} tokens",
                                b.shared_prefix_tokens,
                                b.prompt_tokens.unwrap_or(0),
                                b.max_tokens
                            ),
                        );
                    }
                    if !(b.top_p > 0.0 && b.top_p <= 1.0) {
                        return fail(at("top_p"), format!("{} is outside (0, 1]", b.top_p));
                    }
                    if !(b.temperature >= 0.0 && b.temperature.is_finite()) {
                        return fail(at("temperature"), format!("{} must be finite and >= 0", b.temperature));
                    }
                    let pads = b.prompt.matches(plateau_engine::tokenizer::IMAGE_PAD_TEXT).count();
                    if pads > 0 && b.images.is_empty() {
                        return fail(
                            at("images"),
                            format!("the prompt has {pads} <|image_pad|> placeholders and no images"),
                        );
                    }
                    if pads == 0 && !b.images.is_empty() {
                        return fail(
                            at("images"),
                            "images given but the prompt has no <|image_pad|> placeholder".into(),
                        );
                    }
                    if let Some(img) =
                        b.images.iter().find(|i| i.width == 0 || i.height == 0 || i.width > 8192 || i.height > 8192)
                    {
                        return fail(at("images"), format!("{}x{}: sides must be in 1..=8192", img.width, img.height));
                    }
                    if pads > 0 && e.weights.is_none() {
                        let vision = plateau_engine::ModelConfig::preset(&e.preset).map(|c| c.vision.is_some());
                        if vision == Ok(false) {
                            return fail(
                                eng("preset"),
                                format!("`{}` has no vision encoder and phase {i} sends images; use tiny-vl", e.preset),
                            );
                        }
                    }
                }
                Phase::Pressure(pr) => {
                    check_sampling(pr.n, pr.max_tokens)?;
                    check_abort(&pr.abort)?;
                    if pr.prompt_tokens == 0 {
                        return fail(at("prompt_tokens"), "must be at least 1".into());
                    }
                    if pr.prompt_tokens as u64 + pr.max_tokens as u64 >= max_len as u64 {
                        return fail(
                            at("prompt_tokens"),
                            format!(
                                "prompt_tokens {} + max_tokens {} leave no room under the model's {max_len} tokens",
                                pr.prompt_tokens, pr.max_tokens
                            ),
                        );
                    }
                    if !(pr.overcommit > 1.0 && pr.overcommit <= 10.0) {
                        return fail(at("overcommit"), format!("{} is outside (1, 10]", pr.overcommit));
                    }
                    let need = pr.prompt_tokens as usize + pr.n as usize * pr.max_tokens as usize;
                    if need.div_ceil(e.block_size) > e.num_kv_blocks {
                        return fail(at("prompt_tokens"), "one request alone needs more than the whole KV pool".into());
                    }
                }
                Phase::Sleep(s) => {
                    if !(1..=2).contains(&s.level) {
                        return fail(at("level"), format!("{} is not 1 or 2", s.level));
                    }
                }
            }
        }
        Ok(())
    }
}

/// Requests (valid or invalid) one phase adds per iteration at most: an iteration's requests are
/// all in memory at once.
pub const MAX_REQUESTS_PER_PHASE: u32 = 10_000;

/// Width of a zero-padded request counter (`{i:08}`) at most: a u64 has 20 digits.
pub const MAX_TEMPLATE_WIDTH: usize = 20;

/// The longest sequence allowed when the model's own limit is not known before loading it
/// (weights from a directory): the largest context window any supported model declares.
pub const MAX_SEQUENCE_TOKENS: usize = 1 << 20;

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// The widths of every `{i:0N}` field of a prompt template.
fn template_widths(template: &str) -> impl Iterator<Item = usize> + '_ {
    template
        .split('{')
        .skip(1)
        .filter_map(|f| f.split('}').next()?.strip_prefix("i:0")?.parse::<usize>().ok().or(Some(usize::MAX)))
}

/// MemAvailable from /proc/meminfo, in bytes (None where there is no such file).
fn available_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kb| kb * 1024)
}

/// A phase is read through its `kind` tag, which hides where in the phase an error is. When
/// `line` falls in a `[[phase]]`, that phase's body alone is read again as its own kind, with
/// the `kind` line blanked so line numbers stay, to find the exact line, column and field.
fn phase_error(text: &str, line: usize) -> Option<(usize, usize, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let start = (0..line.min(lines.len())).rev().find(|&i| lines[i].trim().starts_with('['))?;
    if lines[start].trim() != "[[phase]]" {
        return None;
    }
    let end = (start + 1..lines.len()).find(|&i| lines[i].trim().starts_with('[')).unwrap_or(lines.len());
    let mut kind = None;
    let mut body = String::new();
    for (i, l) in lines.iter().enumerate() {
        let in_phase = i > start && i < end;
        let is_kind = in_phase && l.split('=').next().is_some_and(|k| k.trim() == "kind");
        if is_kind {
            kind = l.split_once('=').map(|(_, v)| v.trim().trim_matches('"').to_string());
        }
        body.push_str(if in_phase && !is_kind { l } else { "" });
        body.push('\n');
    }
    let err = match kind.as_deref()? {
        "batch" => toml::from_str::<Batch>(&body).err(),
        "pressure" => toml::from_str::<Pressure>(&body).err(),
        "sleep" => toml::from_str::<Sleep>(&body).err(),
        _ => None,
    }?;
    let (l, c) = err.span().map(|sp| line_col(&body, sp.start)).unwrap_or((start + 1, 1));
    let key = lines.get(l - 1).and_then(|t| t.split('=').next()).map(str::trim).unwrap_or("");
    let index = lines[..start].iter().filter(|t| t.trim() == "[[phase]]").count();
    let msg = explain(err.message());
    let field = if key.is_empty() || msg.contains('`') { String::new() } else { format!("phase[{index}].{key}: ") };
    Some((l, c, format!("{field}{msg}")))
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    (line, column)
}

/// The line of `place.key` in its section (1-based), or of the section header, or 0.
fn locate(text: &str, place: Place) -> usize {
    let mut in_section = place.section.is_none();
    let mut seen = 0usize;
    let mut header_line = 0;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.starts_with('[') {
            let name = line.trim_matches(|c| c == '[' || c == ']').trim();
            in_section = match place.section {
                Some((sec, idx)) if name == sec => {
                    let hit = seen == idx;
                    seen += 1;
                    if hit {
                        header_line = i + 1;
                    }
                    hit
                }
                _ => false,
            };
            continue;
        }
        if in_section {
            if let Some(k) = line.split('=').next() {
                if k.trim() == place.key {
                    return i + 1;
                }
            }
        }
    }
    header_line
}

/// Rewrites serde's message, adding the closest known name to an unknown one.
fn explain(msg: &str) -> String {
    let msg = msg.trim();
    let names: Vec<&str> = msg.split('`').skip(1).step_by(2).collect();
    if (msg.starts_with("unknown field") || msg.starts_with("unknown variant")) && names.len() >= 2 {
        let (unknown, known) = (names[0], &names[1..]);
        let what = if msg.starts_with("unknown field") { "field" } else { "value" };
        if let Some(best) = closest(unknown, known) {
            return format!("unknown {what} `{unknown}`; did you mean `{best}`? (known: {})", known.join(", "));
        }
        return format!("unknown {what} `{unknown}` (known: {})", known.join(", "));
    }
    msg.to_string()
}

/// The known name nearest to `word` by edit distance, if it is near enough to be a typo.
pub fn closest<'a>(word: &str, known: &[&'a str]) -> Option<&'a str> {
    known
        .iter()
        .map(|k| (levenshtein(word, k), *k))
        .filter(|(d, k)| *d <= (k.len().max(word.len()) / 3).max(2))
        .min()
        .map(|(_, k)| k)
}

fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for j in 0..b.len() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != b[j])).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_scenarios_parse() {
        for (name, text) in SHIPPED {
            let s = Scenario::parse(text, name).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(s.name, name);
        }
    }

    #[test]
    fn typo_names_line_field_and_closest() {
        let text = "name = \"x\"\ndescription = \"d\"\n[engine]\nnum_kv_blockz = 3\n[[phase]]\nkind = \"batch\"\n";
        let e = Scenario::parse(text, "f.toml").unwrap_err().to_string();
        assert!(e.starts_with("f.toml:4:"), "{e}");
        assert!(e.contains("`num_kv_blockz`") && e.contains("did you mean `num_kv_blocks`"), "{e}");
        let text = "name = \"x\"\ndescription = \"d\"\n[[phase]]\nkind = \"bacth\"\n";
        let e = Scenario::parse(text, "f.toml").unwrap_err().to_string();
        assert!(e.contains("did you mean `batch`"), "{e}");
    }

    #[test]
    fn wrong_type_and_impossible_values() {
        let text = "name = \"x\"\ndescription = \"d\"\n[[phase]]\nkind = \"batch\"\nn = \"two\"\n";
        let e = Scenario::parse(text, "f.toml").unwrap_err().to_string();
        assert!(e.starts_with("f.toml:5:"), "{e}");
        let text = "name = \"x\"\ndescription = \"d\"\n[[phase]]\nkind = \"sleep\"\n[[phase]]\nkind = \"batch\"\ntop_p = 1.5\n";
        let e = Scenario::parse(text, "f.toml").unwrap_err().to_string();
        assert_eq!(e, "f.toml:7:1: phase[1].top_p: 1.5 is outside (0, 1]");
        let text = "name = \"x\"\ndescription = \"d\"\n[soak]\niterations = 0\n[[phase]]\nkind = \"batch\"\n";
        let e = Scenario::parse(text, "f.toml").unwrap_err().to_string();
        assert_eq!(e, "f.toml:4:1: soak.iterations: must be at least 1");
    }

    #[test]
    fn disaggregated_scenarios_refuse_n_above_one_in_every_phase() {
        let text = "name = \"x\"\ndescription = \"d\"\n[pd]\n[[phase]]\nkind = \"pressure\"\nn = 2\n";
        let e = Scenario::parse(text, "f.toml").unwrap_err().to_string();
        assert!(e.contains("n = 1"), "{e}");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration_secs("10m"), Ok(600.0));
        assert_eq!(parse_duration_secs("1.5h"), Ok(5400.0));
        assert!(parse_duration_secs("10 parsecs").is_err());
        assert!(parse_duration_secs("0s").is_err());
        assert!(parse_duration_secs("100000000000000000000h").is_err());
    }
}
