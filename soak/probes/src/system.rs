//! What the driver runs a scenario against: one engine, or a prefill/decode pair with its router
//! and transport. Both answer the same calls, so phases, aborts and sampling are written once.

use std::collections::BTreeMap;

use plateau_engine::{
    AbortOutcome, Engine, EngineConfig, EngineError, IdleViolation, Metric, ModelConfig, Request, RequestOutput,
    RequestStage, WeightSource,
};
use plateau_reports::MetricSpec;
use serde::{Deserialize, Serialize};

/// Registry entries left at one insertion site (residues.json, one per line of the array).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Residue {
    pub registry: String,
    pub file: String,
    pub line: u32,
    pub count: u64,
    pub oldest_iter: u64,
}

impl From<plateau_engine::registry::Residue> for Residue {
    fn from(r: plateau_engine::registry::Residue) -> Self {
        Residue {
            registry: r.registry,
            file: r.file.to_string(),
            line: r.line,
            count: r.count,
            oldest_iter: r.oldest_epoch,
        }
    }
}

impl Residue {
    /// The same residue, its registry name prefixed with a role (`decode.`).
    pub fn with_role(mut self, role: &str) -> Self {
        self.registry = format!("{role}.{}", self.registry);
        self
    }
}

pub trait System {
    fn add_request(&mut self, r: Request) -> Result<(), EngineError>;
    /// One step of everything; `now_ms` is the shell's clock. Returns the client's requests that
    /// ended in it (for a pair, what the decode side hands back).
    fn step(&mut self, now_ms: u64) -> Result<Vec<RequestOutput>, EngineError>;
    fn stage(&self, id: u64) -> Option<RequestStage>;
    /// The tokens each live sequence of request `id` has generated so far, by sequence index:
    /// what a streaming server sends as they come. A system that cannot see them before a
    /// request ends (nodes in other processes) returns none, and its requests stream at the end.
    fn generated(&self, id: u64) -> Vec<(u32, Vec<u32>)>;
    fn abort(&mut self, id: u64) -> AbortOutcome;
    /// Requests in flight from the client's point of view.
    fn has_unfinished(&self) -> bool;
    /// Work that outlives the client's requests by design and must end by itself (KV held for a
    /// transfer until its timeout). Zero when settled.
    fn unsettled(&self) -> usize;
    /// The longest such work may take, in ms.
    fn settle_ms(&self) -> u64;
    fn stats(&self) -> Vec<Metric>;
    fn check_idle(&self) -> Result<(), Vec<IdleViolation>>;
    /// The iteration the shell is in: registry entries inserted from now on carry it.
    fn set_epoch(&mut self, epoch: u64);
    /// Every registry entry still there, by inserting source line (registry names role-prefixed
    /// where the system has roles).
    fn residues(&self) -> Vec<Residue>;
    fn sleep(&mut self, level: u8) -> Result<(), EngineError>;
    fn wake(&mut self) -> Result<(), EngineError>;
    /// Drops every cached prefix block (a trainer's reset after new weights).
    fn reset_prefix_cache(&mut self) -> Result<(), EngineError>;
    fn update_weights(&mut self, source: WeightSource) -> Result<(), EngineError>;
    fn model_config(&self) -> &ModelConfig;
    fn config(&self) -> &EngineConfig;
    fn backend_name(&self) -> &'static str;
    /// The mappings of the process where leaks outside the heap would show, when that is not
    /// this one (a decode node). None: this process.
    fn mappings(&self) -> Option<Vec<crate::mappings::Mapping>> {
        None
    }
    /// Specs of the process probes of other processes this system runs in, role-prefixed
    /// (`decode.proc.rss_anon`); empty when everything runs in this process.
    fn process_specs(&self) -> BTreeMap<String, MetricSpec> {
        BTreeMap::new()
    }
    /// Samples those processes' probes into `values`, as measured (negative values kept), each
    /// settled as `settle` says.
    fn sample_processes(&self, _settle: crate::probes::Settle, _values: &mut BTreeMap<String, f64>) {}
}

impl System for Engine {
    fn add_request(&mut self, r: Request) -> Result<(), EngineError> {
        Engine::add_request(self, r)
    }
    fn step(&mut self, now_ms: u64) -> Result<Vec<RequestOutput>, EngineError> {
        self.advance_time(now_ms);
        Engine::step(self)
    }
    fn stage(&self, id: u64) -> Option<RequestStage> {
        Engine::stage(self, id)
    }
    fn generated(&self, id: u64) -> Vec<(u32, Vec<u32>)> {
        Engine::generated(self, id).into_iter().map(|(i, t)| (i, t.to_vec())).collect()
    }
    fn abort(&mut self, id: u64) -> AbortOutcome {
        Engine::abort(self, id)
    }
    fn has_unfinished(&self) -> bool {
        Engine::has_unfinished(self)
    }
    fn unsettled(&self) -> usize {
        0
    }
    fn settle_ms(&self) -> u64 {
        0
    }
    fn stats(&self) -> Vec<Metric> {
        Engine::stats(self)
    }
    fn check_idle(&self) -> Result<(), Vec<IdleViolation>> {
        Engine::check_idle(self)
    }
    fn set_epoch(&mut self, epoch: u64) {
        Engine::set_epoch(self, epoch)
    }
    fn residues(&self) -> Vec<Residue> {
        Engine::residues(self).into_iter().map(Residue::from).collect()
    }
    fn sleep(&mut self, level: u8) -> Result<(), EngineError> {
        Engine::sleep(self, level)
    }
    fn wake(&mut self) -> Result<(), EngineError> {
        Engine::wake(self)
    }
    fn reset_prefix_cache(&mut self) -> Result<(), EngineError> {
        Engine::reset_prefix_cache(self)
    }
    fn update_weights(&mut self, source: WeightSource) -> Result<(), EngineError> {
        Engine::update_weights(self, source)
    }
    fn model_config(&self) -> &ModelConfig {
        Engine::model_config(self)
    }
    fn config(&self) -> &EngineConfig {
        Engine::config(self)
    }
    fn backend_name(&self) -> &'static str {
        Engine::backend_name(self)
    }
}
