//! What a run found: its trace hash, how its requests ended, the invariant violations, and the
//! detector's verdict on the registries sampled at quiescent points.

use std::cell::RefCell;
use std::collections::BTreeMap;

use plateau_detector::{judge, warmup_rule};
use plateau_engine::{FinishReason, Metric};
use plateau_reports::{Header, Kind, Row, Samples, SAMPLES_SCHEMA};
use plateau_scenario::spec_of;

use crate::spec::RunSpec;
#[cfg(madsim)]
use crate::trace::Trace;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub invariant: &'static str,
    pub node: String,
    pub t_ms: u64,
    pub detail: String,
}

/// What the client sees of each request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Finished(FinishReason),
    Aborted,
    Failed(String),
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutcomeCounts {
    pub finished: u64,
    pub aborted: u64,
    pub failed: u64,
}

#[derive(Debug, Clone)]
pub struct RunReport {
    pub seed: u64,
    pub trace_hash: u64,
    pub events: u64,
    pub sim_ms: u64,
    pub requests: OutcomeCounts,
    pub violations: Vec<Violation>,
    pub trace_lines: Vec<String>,
    /// What the detector judged: every node's registries and gauges at the quiescent points, as a
    /// samples v1 file holds them (`replay --samples` writes it for `plateau analyze`).
    pub samples: Option<Samples>,
    /// Metrics the detector could not decide (too few points after warm-up, growth whose end the
    /// run cannot tell), each with why: a run with any is not a pass.
    pub undecided: Vec<String>,
}

/// The router's counter of requests sent (the cluster's workload), in every sample.
pub const REQUESTS_METRIC: &str = "router.requests";

/// Quiescent iterations a gauge's trend skips: the soak's warm-up rule, for a run and for each
/// restarted node's incarnation.
pub fn gauge_warmup_iterations() -> u64 {
    warmup_rule(None, None, None).expect("no explicit warm-up to check")
}

/// Quiescent samples: (iteration, seconds, metrics by node-prefixed name).
pub type QuiescentSamples = Vec<(u64, f64, BTreeMap<String, Metric>)>;

impl RunReport {
    #[cfg(madsim)]
    pub fn new<'a>(
        seed: u64,
        trace: &mut Trace,
        sim_ms: u64,
        outcomes: impl Iterator<Item = &'a Outcome>,
    ) -> RunReport {
        let mut requests = OutcomeCounts::default();
        for o in outcomes {
            match o {
                Outcome::Finished(_) => requests.finished += 1,
                Outcome::Aborted => requests.aborted += 1,
                Outcome::Failed(_) => requests.failed += 1,
            }
        }
        RunReport {
            seed,
            trace_hash: trace.hash(),
            events: trace.events(),
            sim_ms,
            requests,
            violations: Vec::new(),
            trace_lines: trace.take_lines(),
            samples: None,
            undecided: Vec::new(),
        }
    }

    /// Runs the soak detector over the registries sampled at quiescent points: per-request state
    /// must be gone at every one, bounded registries within capacity. Failures become violations.
    pub fn judge_samples(&mut self, spec: &RunSpec, samples: QuiescentSamples) {
        let mut metrics = BTreeMap::new();
        for (_, _, values) in &samples {
            // Counters restart with a node's incarnation (a kill and restart is a new engine), so
            // their monotonicity is no invariant here; the exactly-once checks count requests.
            for (name, m) in
                values.iter().filter(|(n, m)| m.kind != plateau_engine::MetricKind::Counter || *n == REQUESTS_METRIC)
            {
                metrics.insert(name.clone(), spec_of(m));
            }
        }
        let names: Vec<String> = metrics.keys().cloned().collect();
        let rows = samples
            .iter()
            .map(|(iter, t, values)| {
                Row::new(*t, *iter, true, names.iter().map(|n| values.get(n).map(|m| m.value as f64)).collect())
            })
            .collect();
        // Registries are judged from the first quiescent point; gauges (heap, mappings) after the
        // soak's warm-up, by the soak's one rule and configuration. A run shorter than the warm-up
        // leaves the gauges inconclusive: no violation, and no pass either (`undecided`).
        let warmup_iterations = gauge_warmup_iterations();
        // The router's count of requests sent: gauges are judged with the soak's default
        // tolerance per request, as a soak of the same workload would be.
        if let Some(m) = metrics.get_mut(REQUESTS_METRIC) {
            m.role = Some(plateau_reports::ROLE_REQUESTS.into());
        }
        // The transport's byte gauges live under the registration cache's limit (regions.rs).
        let names_now: Vec<String> = metrics.keys().cloned().collect();
        for name in &names_now {
            let Some(node) = [".engine.transport_region_bytes", ".proc.anon_transport_bytes"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
            else {
                continue;
            };
            let limit = format!("{node}.{}", crate::regions::LIMIT_METRIC);
            if metrics.contains_key(&limit) {
                metrics.get_mut(name).expect("a name of the map").within = Some(limit);
            }
        }
        let header = Header {
            schema: SAMPLES_SCHEMA.into(),
            scenario: spec.scenario.name.clone(),
            seed: self.seed,
            backend: "sim".into(),
            metrics,
            warmup_iterations: Some(warmup_iterations),
            injections: spec.injections.iter().map(|i| i.name().to_string()).collect(),
            ..Header::default()
        };
        let s = Samples::in_memory(header, rows);
        // The soak's one judge, on what this run recorded.
        let verdict = match judge(&s) {
            Ok(v) => v,
            Err(e) => {
                self.violations.push(Violation {
                    invariant: "samples-judged",
                    node: "sim".into(),
                    t_ms: self.sim_ms,
                    detail: format!("the samples could not be judged: {e}"),
                });
                self.samples = Some(s);
                return;
            }
        };
        self.samples = Some(s);
        self.undecided = verdict
            .metrics
            .iter()
            .filter(|m| m.status == plateau_reports::Status::Inconclusive)
            .map(|m| format!("{}: {}", m.name, m.reason))
            .collect();
        for m in verdict.metrics.iter().filter(|m| m.status == plateau_reports::Status::Fail) {
            let (node, _) = m.name.split_once('.').unwrap_or(("?", ""));
            let at = samples.iter().find(|x| Some(x.0) == m.first_iter).map_or(self.sim_ms, |x| (x.1 * 1000.0) as u64);
            // By kind: exact accounting for registries, the trend rule for gauges.
            let invariant = if m.kind == Kind::Gauge.as_str() { "memory-plateau" } else { "registry-at-quiescence" };
            self.violations.push(Violation {
                invariant,
                node: node.to_string(),
                t_ms: at,
                detail: format!("{} ({}): {}", m.name, m.kind, m.reason),
            });
        }
        self.violations.sort_by_key(|v| v.t_ms);
    }

    /// Every invariant held and every metric was judged and passed.
    pub fn passed(&self) -> bool {
        self.violations.is_empty() && self.undecided.is_empty()
    }

    /// An invariant was violated or a metric failed.
    pub fn failed(&self) -> bool {
        !self.violations.is_empty()
    }

    /// The exit code of a run or a sweep of runs: 1 when one failed, else 4 when one left a
    /// metric undecided, else 0.
    pub fn exit_code<'a>(reports: impl IntoIterator<Item = &'a RunReport>) -> u8 {
        let (mut failed, mut undecided) = (false, false);
        for r in reports {
            failed |= r.failed();
            undecided |= !r.passed();
        }
        if failed {
            1
        } else if undecided {
            4
        } else {
            0
        }
    }

    /// One line: the seed, and the first violation, the undecided metrics or the figures of a
    /// clean run.
    pub fn line(&self) -> String {
        if let (None, Some(first)) = (self.violations.first(), self.undecided.first()) {
            return format!(
                "seed {}: UNDECIDED: {} metric{} not judged ({first}{}; trace {:016x}): not a pass",
                self.seed,
                self.undecided.len(),
                if self.undecided.len() == 1 { "" } else { "s" },
                if self.undecided.len() > 1 { ", ..." } else { "" },
                self.trace_hash
            );
        }
        match self.violations.first() {
            Some(v) => format!(
                "seed {}: FAIL {} on {} at t={:.3}s: {} ({} violations; trace {:016x})",
                self.seed,
                v.invariant,
                v.node,
                v.t_ms as f64 / 1000.0,
                v.detail,
                self.violations.len(),
                self.trace_hash
            ),
            None => format!(
                "seed {}: pass: {} requests ({} finished, {} aborted, {} failed) in {:.3}s simulated, {} events, trace {:016x}",
                self.seed,
                self.requests.finished + self.requests.aborted + self.requests.failed,
                self.requests.finished,
                self.requests.aborted,
                self.requests.failed,
                self.sim_ms as f64 / 1000.0,
                self.events,
                self.trace_hash
            ),
        }
    }
}

thread_local! {
    /// The node and simulated time of the last event on this thread, for panic reports.
    static CONTEXT: RefCell<(String, u64)> = const { RefCell::new((String::new(), 0)) };
}

pub fn set_context(node: &str, t_ms: u64) {
    CONTEXT.with(|c| {
        let mut c = c.borrow_mut();
        if c.0 != node {
            c.0.clear();
            c.0.push_str(node);
        }
        c.1 = t_ms;
    });
}

/// Where this thread's simulation was when it panicked: (node, simulated ms).
pub fn context() -> (String, u64) {
    CONTEXT.with(|c| c.borrow().clone())
}
