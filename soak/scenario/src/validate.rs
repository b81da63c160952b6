//! The scenario's values checked against each other, the model and this machine, before anything
//! is allocated. Every error names the field and its line.

use super::diagnostics::{locate, Place, ScenarioError};
use super::phases::{Abort, Batch, Phase, Pressure};
use super::{parse_duration_secs, Scenario};

/// A scenario's name at most: it is part of every run directory's name.
const MAX_NAME_BYTES: usize = 100;

/// `[pd] max_pulls_in_flight` at most: far past any decode side's sequences.
const MAX_PULLS_IN_FLIGHT: usize = 4096;

impl Scenario {
    pub(super) fn validate(&self, text: &str, file: &str) -> Result<(), ScenarioError> {
        let v = Validator { s: self, text, file };
        v.name_and_phases()?;
        v.engine()?;
        v.pd()?;
        v.soak()?;
        let max_len = v.model_len()?;
        for (i, p) in self.phases.iter().enumerate() {
            v.phase(i, p, max_len)?;
        }
        Ok(())
    }
}

/// A scenario checked against its own text (to name the line of each error) and its file's name.
struct Validator<'a> {
    s: &'a Scenario,
    text: &'a str,
    file: &'a str,
}

fn top(key: &str) -> Place<'_> {
    Place { section: None, key }
}

fn eng(key: &str) -> Place<'_> {
    Place { section: Some(("engine", 0)), key }
}

fn soak(key: &str) -> Place<'_> {
    Place { section: Some(("soak", 0)), key }
}

impl Validator<'_> {
    /// The error for the value at `place`: its field (`phase[2].n`), its line, and `message`.
    fn fail<T>(&self, place: Place, message: String) -> Result<T, ScenarioError> {
        let line = locate(self.text, place);
        let field = match place.section {
            Some(("phase", i)) => format!("phase[{i}].{}", place.key),
            Some((sec, _)) => format!("{sec}.{}", place.key),
            None => place.key.to_string(),
        };
        Err(ScenarioError { file: self.file.to_string(), line, column: 1, message: format!("{field}: {message}") })
    }

    /// A plain name (it names the run's directory) and at least one phase.
    fn name_and_phases(&self) -> Result<(), ScenarioError> {
        if self.s.name.trim().is_empty() {
            return self.fail(top("name"), "must not be empty".into());
        }
        // The name becomes a directory name (runs/<name>-<time>, shrink candidates, history):
        // one plain word, so that a run never writes outside its output folder.
        let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
        if self.s.name.len() > MAX_NAME_BYTES
            || !self.s.name.chars().all(plain)
            || !self.s.name.starts_with(|c: char| c.is_ascii_alphanumeric())
        {
            return self.fail(
            top("name"),
            format!(
                "`{}` is not a plain name: it names the run's directory, so use letters, digits, '-', '_' and '.', starting with a letter or digit, at most {MAX_NAME_BYTES} bytes",
                self.s.name.escape_debug()
            ),
        );
        }
        if self.s.phases.is_empty() {
            return self.fail(top("phase"), "a scenario needs at least one [[phase]]".into());
        }
        Ok(())
    }

    /// `[engine]`: a known backend and dtype, a model, sizes of at least 1 within their caps.
    fn engine(&self) -> Result<(), ScenarioError> {
        let e = &self.s.engine;
        if !["cpu", "cuda", "auto"].contains(&e.backend.as_str()) {
            return self.fail(eng("backend"), format!("`{}` is not one of cpu, cuda, auto", e.backend));
        }
        if !["f32", "bf16"].contains(&e.dtype.as_str()) {
            return self.fail(eng("dtype"), format!("`{}` is not one of f32, bf16", e.dtype));
        }
        if e.weights.is_none() {
            if let Err(err) = plateau_engine::ModelConfig::preset(&e.preset) {
                return self.fail(eng("preset"), err.to_string());
            }
        }
        if e.max_num_seqs > MAX_NUM_SEQS {
            return self.fail(eng("max_num_seqs"), format!("{} is above the cap of {MAX_NUM_SEQS}", e.max_num_seqs));
        }
        for (key, v) in [
            ("block_size", e.block_size),
            ("num_kv_blocks", e.num_kv_blocks),
            ("max_num_seqs", e.max_num_seqs),
            ("max_num_batched_tokens", e.max_num_batched_tokens),
        ] {
            if v == 0 {
                return self.fail(eng(key), "must be at least 1".into());
            }
        }
        if e.encoder_cache_tokens == 0 || e.encoder_cache_entries == 0 || e.max_encoder_tokens_per_step == 0 {
            return self.fail(
                eng("encoder_cache_tokens"),
                "encoder_cache_tokens, encoder_cache_entries and max_encoder_tokens_per_step must be positive".into(),
            );
        }
        if !(e.min_pixels >= 1 && e.min_pixels <= e.max_pixels && e.max_pixels <= e.hard_max_pixels) {
            return self.fail(eng("max_pixels"), "need 1 <= min_pixels <= max_pixels <= hard_max_pixels".into());
        }
        Ok(())
    }

    /// `[pd]`: fractions, sizes and timeouts in range, and phases a disaggregated pair can serve.
    fn pd(&self) -> Result<(), ScenarioError> {
        if let Some(pd) = &self.s.pd {
            let at = |key| Place { section: Some(("pd", 0)), key };
            if !(0.0..1.0).contains(&pd.decode_failure_fraction) {
                return self
                    .fail(at("decode_failure_fraction"), format!("{} is outside [0, 1)", pd.decode_failure_fraction));
            }
            if pd.regions == 0 || pd.transfer_bytes_per_step == 0 || pd.kv_transfer_timeout_ms == 0 {
                return self.fail(
                    at("regions"),
                    "regions, transfer_bytes_per_step and kv_transfer_timeout_ms must be positive".into(),
                );
            }
            // None in flight would never drain; the cap keeps a typo from sizing a table.
            if !(1..=MAX_PULLS_IN_FLIGHT).contains(&pd.max_pulls_in_flight) {
                return self.fail(
                    at("max_pulls_in_flight"),
                    format!("{} is outside 1..={MAX_PULLS_IN_FLIGHT}", pd.max_pulls_in_flight),
                );
            }
            let not_pd = |p: &Phase| match p {
                Phase::Batch(b) => b.n != 1 || !b.images.is_empty(),
                Phase::Pressure(pr) => pr.n != 1,
                Phase::Sleep(_) => false,
            };
            if pd.kv_transfer_timeout_ms > 3_600_000 {
                return self.fail(at("kv_transfer_timeout_ms"), "at most an hour (3600000)".into());
            }
            if self.s.phases.iter().any(not_pd) {
                return self.fail(at("mode"), "disaggregated scenarios take n = 1 and no images in every batch".into());
            }
        }
        Ok(())
    }

    /// `[soak]`: lengths within the cap, a duration and a tolerance that read, and a warm-up that
    /// leaves something to judge, in-process and against a server.
    fn soak(&self) -> Result<(), ScenarioError> {
        for (key, n) in [
            ("iterations", Some(self.s.soak.iterations)),
            ("target_iterations", self.s.soak.target_iterations),
            ("max_iterations", self.s.soak.max_iterations),
        ] {
            if n.is_some_and(|n| n > MAX_ITERATIONS) {
                return self
                    .fail(soak(key), format!("{} is above the cap of {MAX_ITERATIONS} iterations", n.unwrap_or(0)));
            }
        }
        if self.s.soak.iterations == 0 {
            return self.fail(soak("iterations"), "must be at least 1".into());
        }
        if let Some(d) = &self.s.soak.duration {
            if let Err(m) = parse_duration_secs(d) {
                return self.fail(soak("duration"), m);
            }
        }
        if let Some(m) = self.s.soak.max_iterations {
            if m < self.s.soak.iterations {
                return self.fail(
                    soak("max_iterations"),
                    format!("{m} is below the run's planned length ({} iterations)", self.s.soak.iterations),
                );
            }
            // A run against a server plans target_iterations: the cap must hold it too.
            if let Some(t) = self.s.soak.target_iterations.filter(|&t| m < t) {
                return self.fail(
                    soak("max_iterations"),
                    format!("{m} is below the planned length of a run against a server (target_iterations = {t})"),
                );
            }
        }
        if let Some(t) = &self.s.soak.tolerance {
            if let Err(m) = t.parse::<plateau_reports::Tolerance>() {
                return self.fail(soak("tolerance"), m);
            }
        }
        let target = self.s.soak.for_target();
        if self.s.soak.target_iterations == Some(0) {
            return self.fail(soak("target_iterations"), "must be at least 1".into());
        }
        if (self.s.soak.target_iterations.is_some() || self.s.soak.target_warmup_iterations.is_some())
            && self.s.soak.duration.is_none()
            && target.warmup_iterations >= target.iterations
        {
            return self.fail(
                soak(if self.s.soak.target_warmup_iterations.is_some() {
                    "target_warmup_iterations"
                } else {
                    "target_iterations"
                }),
                format!(
                    "a run against a server would skip {} iterations of its {}: nothing would be judged",
                    target.warmup_iterations, target.iterations
                ),
            );
        }
        if self.s.soak.duration.is_none() && self.s.soak.warmup_iterations >= self.s.soak.iterations {
            return self.fail(
                soak("warmup_iterations"),
                format!(
                    "{} is at or past the run's length ({} iterations): nothing would be judged",
                    self.s.soak.warmup_iterations, self.s.soak.iterations
                ),
            );
        }
        Ok(())
    }

    /// The longest sequence the model takes (a preset's, or the engine's max_model_len; for
    /// weights from a directory, the largest any supported model takes), with the KV pool checked
    /// against this machine's memory.
    fn model_len(&self) -> Result<usize, ScenarioError> {
        let e = &self.s.engine;
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
                    return self.fail(
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
        Ok(max_len)
    }

    /// Phase `i`: its sampling, its abort fraction, and its kind's own limits.
    fn phase(&self, i: usize, p: &Phase, max_len: usize) -> Result<(), ScenarioError> {
        let e = &self.s.engine;
        let at = |key| Place { section: Some(("phase", i)), key };
        let check_sampling = |n: u32, max_tokens: u32| {
            if n == 0 {
                return self.fail(at("n"), "must be at least 1".into());
            }
            if n as usize > e.max_num_seqs {
                return self.fail(at("n"), format!("{n} exceeds engine.max_num_seqs = {}", e.max_num_seqs));
            }
            if max_tokens == 0 {
                return self.fail(at("max_tokens"), "must be at least 1".into());
            }
            Ok(())
        };
        let check_abort = |a: &Option<Abort>| match a {
            Some(a) if !(0.0..=1.0).contains(&a.fraction) => {
                self.fail(at("fraction"), format!("{} is outside [0, 1]", a.fraction))
            }
            _ => Ok(()),
        };
        match p {
            Phase::Batch(b) => {
                check_sampling(b.n, b.max_tokens)?;
                check_abort(&b.abort)?;
                self.batch(i, b, max_len)
            }
            Phase::Pressure(pr) => {
                check_sampling(pr.n, pr.max_tokens)?;
                check_abort(&pr.abort)?;
                self.pressure(i, pr, max_len)
            }
            Phase::Sleep(s) => {
                if !(1..=2).contains(&s.level) {
                    return self.fail(at("level"), format!("{} is not 1 or 2", s.level));
                }
                Ok(())
            }
        }
    }

    /// A batch phase's limits: requests and sequences within their caps, a prompt that fits the
    /// model, sampling settings in range, and images that match the prompt's placeholders.
    fn batch(&self, i: usize, b: &Batch, max_len: usize) -> Result<(), ScenarioError> {
        let e = &self.s.engine;
        let at = |key| Place { section: Some(("phase", i)), key };
        if !(1..=MAX_REQUESTS_PER_PHASE).contains(&b.requests) {
            return self.fail(at("requests"), format!("{} is outside 1..={MAX_REQUESTS_PER_PHASE}", b.requests));
        }
        let sequences = u64::from(b.requests) * u64::from(b.n);
        if sequences > MAX_SEQUENCES_PER_PHASE {
            return self.fail(
                    at("requests"),
                    format!(
                        "{} requests of n = {} are {sequences} sequences in one phase, above the cap of {MAX_SEQUENCES_PER_PHASE}",
                        b.requests, b.n
                    ),
                );
        }
        if b.invalid > MAX_REQUESTS_PER_PHASE {
            return self.fail(at("invalid"), format!("{} is above {MAX_REQUESTS_PER_PHASE}", b.invalid));
        }
        if let Some(w) = template_widths(&b.prompt).find(|w| *w > MAX_TEMPLATE_WIDTH) {
            return self.fail(
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
            return self.fail(
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
            return self.fail(at("top_p"), format!("{} is outside (0, 1]", b.top_p));
        }
        if !(b.temperature >= 0.0 && b.temperature.is_finite()) {
            return self.fail(at("temperature"), format!("{} must be finite and >= 0", b.temperature));
        }
        let pads = b.prompt.matches(plateau_engine::tokenizer::IMAGE_PAD_TEXT).count();
        if pads > 0 && b.images.is_empty() {
            return self.fail(at("images"), format!("the prompt has {pads} <|image_pad|> placeholders and no images"));
        }
        if pads == 0 && !b.images.is_empty() {
            return self.fail(at("images"), "images given but the prompt has no <|image_pad|> placeholder".into());
        }
        if let Some(img) = b.images.iter().find(|i| i.width == 0 || i.height == 0 || i.width > 8192 || i.height > 8192)
        {
            return self.fail(at("images"), format!("{}x{}: sides must be in 1..=8192", img.width, img.height));
        }
        if pads > 0 && e.weights.is_none() {
            let vision = plateau_engine::ModelConfig::preset(&e.preset).map(|c| c.vision.is_some());
            if vision == Ok(false) {
                return self.fail(
                    eng("preset"),
                    format!("`{}` has no vision encoder and phase {i} sends images; use tiny-vl", e.preset),
                );
            }
        }
        Ok(())
    }

    /// A pressure phase's limits: a prompt that fits, an overcommit in range, one request within
    /// the KV pool.
    fn pressure(&self, i: usize, pr: &Pressure, max_len: usize) -> Result<(), ScenarioError> {
        let e = &self.s.engine;
        let at = |key| Place { section: Some(("phase", i)), key };
        if pr.prompt_tokens == 0 {
            return self.fail(at("prompt_tokens"), "must be at least 1".into());
        }
        if pr.prompt_tokens as u64 + pr.max_tokens as u64 >= max_len as u64 {
            return self.fail(
                at("prompt_tokens"),
                format!(
                    "prompt_tokens {} + max_tokens {} leave no room under the model's {max_len} tokens",
                    pr.prompt_tokens, pr.max_tokens
                ),
            );
        }
        if !(pr.overcommit > 1.0 && pr.overcommit <= 10.0) {
            return self.fail(at("overcommit"), format!("{} is outside (1, 10]", pr.overcommit));
        }
        let need = pr.prompt_tokens as usize + pr.n as usize * pr.max_tokens as usize;
        if need.div_ceil(e.block_size) > e.num_kv_blocks {
            return self.fail(at("prompt_tokens"), "one request alone needs more than the whole KV pool".into());
        }
        Ok(())
    }
}

/// Requests (valid or invalid) one phase adds per iteration at most: an iteration's requests are
/// all in memory at once.
pub const MAX_REQUESTS_PER_PHASE: u32 = 10_000;
/// Sequences (requests x n) one phase may start: all of them are held until the phase's
/// quiescent point, each with its sampler and output, and the shipped scenarios start at most a
/// few hundred; 100,000 is 10,000 requests of n = 10, past what any soak of ours needs, and
/// still a phase the tiny preset finishes in minutes rather than never.
pub const MAX_SEQUENCES_PER_PHASE: u64 = 100_000;
/// The engine's sequences at once: vLLM's own default is 256 (1,024 with chunked prefill on
/// large GPUs); 4,096 leaves room above that while every per-sequence table stays small.
pub const MAX_NUM_SEQS: usize = 4096;
/// Iterations a run may take at most, by count or by duration: at the fastest shipped
/// scenario's pace (about 50 ms an iteration, prefill-only on the tiny preset) ten million is
/// nearly six days, and its samples (about 2 KiB a line) stay well under the 64 GiB a samples
/// reader takes. A larger count is a typo or an overflow, refused before anything runs.
pub const MAX_ITERATIONS: u64 = 10_000_000;

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
