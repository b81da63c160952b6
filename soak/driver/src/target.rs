//! What a soak runs against. The run loop (`run_loop.rs`) is one for every target: it writes the
//! samples header, takes the baseline sample, runs every phase of every iteration, reaches
//! quiescence, samples, snapshots the mappings, shows progress, goes on until decided and judges.
//! A target is only what differs: how a phase's requests are sent (into plateau's engine, into a
//! prefill/decode pair in threads or processes, or over HTTP to someone else's server), how
//! quiescence is reached, and what is probed.
//!
//! Lifecycle of a target in a run: `specs` and `backend` once, for the header; then per iteration
//! `begin`, `run_phase` for each phase (its requests planned by `plan.rs`, the same for every
//! target), `quiesce`, and `probe` at the quiescent point (also between engine steps, for timer
//! samples, where the target has steps) followed by `sites`, the live bytes by allocation site
//! where the target records them; `mappings` at the end of warm-up and at the end; `finish`
//! once, whether the run ended, was interrupted or failed.

use std::collections::BTreeMap;

use plateau_reports::MetricSpec;

pub use super::plan::{Send, Shape};
pub use super::sink::{Probe, Sink};
use super::{AbortCounts, RunError};
use crate::triggers::TriggerCount;
use plateau_scenario::Scenario;

/// The three quiescent points of a profiled replay's window, all at the same phase of the
/// scenario's cycle (the end of an iteration): the end of warm-up, the middle, the end. Growth
/// that is the leak's shows in both halves; memory alive at one point and not another does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowEdge {
    Start,
    Mid,
    End,
}

impl WindowEdge {
    pub fn name(self) -> &'static str {
        match self {
            WindowEdge::Start => "start",
            WindowEdge::Mid => "mid",
            WindowEdge::End => "end",
        }
    }

    /// The heap profile a mark dumps: `heap-start.prof`, `heap-mid.prof`, `heap-end.prof`.
    pub fn dump_file(self) -> String {
        format!("heap-{}.prof", self.name())
    }

    /// The edge iteration `iter` is in the window `(start, end)`, if any: the middle is the
    /// iteration halfway between, rounded down.
    pub fn at(iter: u64, (start, end): (u64, u64)) -> Option<WindowEdge> {
        let mid = start + (end - start) / 2;
        if iter == start {
            Some(WindowEdge::Start)
        } else if iter == mid && mid > start && mid < end {
            Some(WindowEdge::Mid)
        } else if iter == end {
            Some(WindowEdge::End)
        } else {
            None
        }
    }
}

/// What a target leaves for the run's outputs once it is done.
#[derive(Debug, Default)]
pub struct Finish {
    /// residues.json (plateau's own engine: where leftover entries were inserted).
    pub residues: Option<serde_json::Value>,
    /// Each trigger the scenario claims and how often it fired (triggers.json), where counted.
    pub triggers: Option<Vec<TriggerCount>>,
    /// How a target process that ended before the run did ended (exit status, signal, OOM).
    pub target_exit: Option<String>,
    /// Quiescent points sampled with requests still in flight at the target.
    pub settle_timeouts: u64,
    /// An external target's dialect and control calls.
    pub control: Option<plateau_reports::ControlRecord>,
    /// A deployment's roles (`--topology`), each judged under its prefix.
    pub roles: Vec<String>,
}

pub trait Target {
    /// The samples header's metrics this target's probes write.
    fn specs(&mut self) -> BTreeMap<String, MetricSpec>;
    /// The header's `backend`: `cpu`, `cuda`, or the external server's URL and model.
    fn backend(&self) -> String;
    /// The sizes the phase plans need.
    fn shape(&self) -> Shape;
    /// Iteration `iter` (1-based) begins.
    fn begin(&mut self, _iter: u64) {}
    /// Runs one phase: sends `sends` with their actions (completed, aborted at a stage, expected
    /// refused) and returns once every one of them ended, or performs a sleep phase as far as the
    /// target can. Timer samples between engine steps go to `sink`.
    fn run_phase(
        &mut self,
        scenario: &Scenario,
        iter: u64,
        index: usize,
        sends: Vec<Send>,
        sink: &mut Sink,
    ) -> Result<(), RunError>;
    /// Waits until nothing is in flight anywhere in iteration `iter`: the quiescent point.
    fn quiesce(&mut self, iter: u64, sink: &mut Sink) -> Result<(), RunError>;
    /// Probes the target: at a quiescent point (`quiescent`) or between steps.
    fn probe(&mut self, iter: u64, quiescent: bool) -> Result<Probe, RunError>;
    /// A profiled replay (the child side) reached one of its window's quiescent points: record the
    /// heap there as this target can (plateau's engine dumps its own heap profile; a server
    /// notes the wall clock, and has a preloaded profiler dump where one is asked for). Files go
    /// into `out_dir`.
    fn mark_window(&mut self, edge: WindowEdge, iter: u64, out_dir: &std::path::Path) -> Result<(), RunError>;
    /// What this target records of its processes' allocation sites at the quiescent point of
    /// iteration `iter` (the live bytes of each site, for sites.jsonl in `out_dir`), or None where
    /// it records none (yet: a target may begin at the end of the run's `warmup`).
    fn sites(&mut self, _iter: u64, _warmup: u64, _out_dir: &std::path::Path) -> Option<plateau_sites::Recorded> {
        None
    }
    /// Once the run's samples are complete, before its verdict is drawn: what the target adds to
    /// the run's directory for the judge (plateau's own engine: its sites, by a replay). The run
    /// did `iterations` after a warm-up of `warmup`; `interrupted` when it was stopped short.
    fn before_verdict(&mut self, _out_dir: &std::path::Path, _iterations: u64, _warmup: u64, _interrupted: bool) {}
    /// The names of the sites `sites` recorded under provisional keys, given once the run is
    /// over (a profiler that reads debug information only then).
    fn site_names(&mut self) -> Vec<plateau_sites::SiteName> {
        Vec::new()
    }
    /// The target process's mappings now, for the mapping snapshot (empty when unknown).
    fn mappings(&mut self) -> Vec<plateau_probes::mappings::Mapping>;
    /// A deployment's processes' mappings now, by role (`--topology`), for each role's own
    /// mapping snapshot; none for a target of one process.
    fn role_mappings(&mut self) -> std::collections::BTreeMap<String, Vec<plateau_probes::mappings::Mapping>> {
        std::collections::BTreeMap::new()
    }
    /// The progress line's detail: memory and accounting, or the target's address.
    fn status(&self) -> String;
    /// Aborts, misses and invalid requests so far.
    fn counts(&self) -> AbortCounts;
    /// The run is over (`failed`: it stopped on this error): stop what was started, say what
    /// the run could not do, hand back what the outputs need.
    fn finish(&mut self, scenario: &Scenario, failed: Option<&RunError>) -> Finish;
}
