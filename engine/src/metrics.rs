//! What the engine reports about itself: `stats()` (every registry, the KV pool by state, the
//! backend's memory, the counters) and `check_idle()` (the self-check a harness runs when nothing
//! is in flight: every per-request registry empty, every bounded one within its capacity, the KV
//! pool's accounting whole, every request added ended exactly once).

use crate::encoder_cache::EncoderCache;
use crate::kv_manager::KvManager;
use crate::model::backend::Backend;
use crate::registry::{Metric, MetricKind, Registries};

/// Monotonic counts, reported as `engine.*` counters.
#[derive(Debug, Default, Clone)]
pub(crate) struct Counters {
    pub steps: u64,
    pub requests_added: u64,
    pub requests_finished: u64,
    pub requests_aborted: u64,
    pub requests_failed: u64,
    pub prompt_tokens_computed: u64,
    pub prefix_cache_hit_tokens: u64,
    pub tokens_generated: u64,
    pub preemptions: u64,
    pub block_copies: u64,
    pub encoder_runs: u64,
    pub encoder_cache_hits: u64,
}

/// A report of something that is not idle when it should be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdleViolation {
    /// The metric (`registry.requests`) or the check (`check.kv_accounting`) that failed.
    pub metric: String,
    pub value: u64,
    pub detail: String,
}

/// What the metrics read.
pub(crate) struct Sources<'a> {
    pub book: &'a Registries,
    pub kv: &'a KvManager,
    pub encoder: &'a EncoderCache,
    pub backend: &'a dyn Backend,
    pub counters: &'a Counters,
}

/// The counter of requests added to this engine: the work a per-request tolerance and cost are
/// measured in. Samples writers declare it by role, so readers never search for it by name.
pub const REQUESTS_ADDED: &str = "engine.requests_added";

/// Every registry, the KV pool by state, the backend's memory and the counters.
pub(crate) fn stats(s: &Sources) -> Vec<Metric> {
    let mut m: Vec<Metric> = s.book.metrics().collect();
    let k = s.kv.counts();
    let total = k.total as u64;
    let count = |name: &str, kind, value| Metric { name: name.to_string(), kind, unit: "count", value };
    m.push(count("registry.kv.blocks_used", MetricKind::PerRequest, k.used as u64));
    m.push(count("registry.kv.blocks_cached", MetricKind::Bounded { capacity: total }, k.cached as u64));
    m.push(count("registry.kv.blocks_free", MetricKind::Bounded { capacity: total }, k.free as u64));
    let mem = s.backend.memory();
    m.push(count("registry.kv_pools", MetricKind::Bounded { capacity: 1 }, mem.kv_pools));
    let ec = s.encoder;
    let budget = MetricKind::Bounded { capacity: ec.budget_tokens() as u64 };
    m.push(count("registry.encoder_cache.embeddings", budget, ec.used_tokens() as u64));
    let bytes = |name: &str, value| Metric { name: name.to_string(), kind: MetricKind::Gauge, unit: "bytes", value };
    m.push(bytes("engine.kv_pool_bytes", mem.kv_bytes));
    m.push(bytes("engine.weight_bytes", mem.weight_bytes));
    let c = s.counters;
    for (name, v) in [
        ("engine.steps", c.steps),
        (REQUESTS_ADDED, c.requests_added),
        ("engine.requests_finished", c.requests_finished),
        ("engine.requests_aborted", c.requests_aborted),
        ("engine.requests_failed", c.requests_failed),
        ("engine.prompt_tokens_computed", c.prompt_tokens_computed),
        ("engine.prefix_cache_hit_tokens", c.prefix_cache_hit_tokens),
        ("engine.tokens_generated", c.tokens_generated),
        ("engine.preemptions", c.preemptions),
        ("engine.block_copies", c.block_copies),
        ("engine.encoder_runs", c.encoder_runs),
        ("engine.encoder_cache_hits", c.encoder_cache_hits),
    ] {
        m.push(count(name, MetricKind::Counter, v));
    }
    m.extend(s.backend.device_metrics());
    m
}

/// The idle self-check. Call it when nothing is in flight.
pub(crate) fn check_idle(s: &Sources) -> Result<(), Vec<IdleViolation>> {
    let mut v = Vec::new();
    for m in stats(s) {
        match m.kind {
            MetricKind::PerRequest if m.value > 0 => v.push(IdleViolation {
                detail: format!("{} holds {} entries with nothing in flight", m.name, m.value),
                metric: m.name,
                value: m.value,
            }),
            MetricKind::Bounded { capacity } if m.value > capacity => v.push(IdleViolation {
                detail: format!("{} holds {} entries, above its capacity {capacity}", m.name, m.value),
                metric: m.name,
                value: m.value,
            }),
            _ => {}
        }
    }
    if let Err(e) = s.kv.check() {
        v.push(IdleViolation { metric: "check.kv_accounting".into(), value: 0, detail: format!("KV accounting: {e}") });
    }
    // Every request added has ended exactly one way.
    let c = s.counters;
    let ended = c.requests_finished + c.requests_aborted + c.requests_failed;
    if c.requests_added != ended {
        v.push(IdleViolation {
            metric: "check.request_counts".into(),
            value: c.requests_added.abs_diff(ended),
            detail: format!(
                "{} requests added but {} finished + {} aborted + {} failed = {ended} ended",
                c.requests_added, c.requests_finished, c.requests_aborted, c.requests_failed
            ),
        });
    }
    if v.is_empty() {
        Ok(())
    } else {
        Err(v)
    }
}
