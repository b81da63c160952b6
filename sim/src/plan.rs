//! What the simulated clients do: the requests of each iteration with their arrival times, the
//! client that sends each one, and when a client aborts; built from a soak scenario (the same
//! generator as the soak) or given directly (property tests generate them).
//!
//! An iteration's requests arrive spread over the arrival window; the iteration ends when every
//! one has its outcome and the cluster has settled (a quiescent point). Sleep phases run at that
//! point, on every node that is up, after the iteration's requests.

use plateau_engine::{ModelConfig, Request};
use plateau_scenario::workload::{rng_for, Workload};
use plateau_scenario::{Phase, Scenario, Stage};
use rand_core::RngCore;

/// Clients sending requests; a disconnect fault takes one away with everything it has in flight.
pub const CLIENTS: u32 = 4;

#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    /// Arrival, ms after the iteration starts.
    pub at_ms: u64,
    pub client: u32,
    pub request: Request,
    /// The client aborts this long after sending it.
    pub abort_after_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct IterationPlan {
    pub requests: Vec<Planned>,
    /// Sleep level and whether new weights are loaded meanwhile, at the iteration's end.
    pub sleeps: Vec<(u8, bool)>,
}

/// When, after sending, a client aborts a request meant to end at `stage` (the router cannot see a
/// remote request's stage, so the stage becomes a delay in the range that stage usually spans).
fn abort_delay_ms(stage: Stage, draw: u64) -> u64 {
    let (lo, span) = match stage {
        Stage::Waiting => (0, 2),
        Stage::Encode | Stage::Prefill => (1, 8),
        Stage::AwaitingKv | Stage::PullingKv => (4, 16),
        Stage::Decode | Stage::Preempted => (10, 40),
        Stage::Any => (0, 60),
    };
    lo + draw % span
}

/// The plan of `iterations` iterations of scenario `s`, seeded, its requests of an iteration
/// arriving over `window_ms`.
pub fn from_scenario(s: &Scenario, window_ms: u64, seed: u64, iterations: u64) -> Result<Vec<IterationPlan>, String> {
    let model = ModelConfig::preset(&s.engine.preset).map_err(|e| e.to_string())?;
    let mut w = Workload::new(seed);
    let window = window_ms.max(1);
    let mut plans = Vec::new();
    for iter in 0..iterations {
        let mut rng = rng_for(&[seed, iter, 0x51u64]);
        let mut plan = IterationPlan::default();
        let mut invalid_k = 0;
        for (phase, p) in s.phases.iter().enumerate() {
            let (requests, abort) = match p {
                Phase::Batch(b) => {
                    let mut rs = w.batch(phase, b, iter);
                    for _ in 0..b.invalid {
                        rs.push(w.invalid(invalid_k, model.vocab_size).0);
                        invalid_k += 1;
                    }
                    (rs, b.abort.clone())
                }
                Phase::Pressure(pr) => {
                    let pool = s.engine.num_kv_blocks * s.engine.block_size;
                    (w.pressure(pr, pool, s.engine.max_num_seqs), pr.abort.clone())
                }
                Phase::Sleep(sl) => {
                    plan.sleeps.push((sl.level, sl.update_weights));
                    continue;
                }
            };
            let ids: Vec<u64> = requests.iter().map(|r| r.id).collect();
            let aborted = abort.as_ref().map(|a| w.abort_targets(&ids, a.fraction, iter, phase)).unwrap_or_default();
            for request in requests {
                let abort_after_ms = match &abort {
                    Some(a) if aborted.binary_search(&request.id).is_ok() => {
                        Some(abort_delay_ms(a.stage, rng.next_u64()))
                    }
                    _ => None,
                };
                plan.requests.push(Planned {
                    at_ms: rng.next_u64() % window,
                    client: (request.id % u64::from(CLIENTS)) as u32,
                    request,
                    abort_after_ms,
                });
            }
        }
        plan.requests.sort_by_key(|p| (p.at_ms, p.request.id));
        plans.push(plan);
    }
    Ok(plans)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_cluster_scenario_plans_every_kind_of_request() {
        let s = crate::spec::default_scenario();
        let plans = from_scenario(&s, 50, 3, 4).unwrap();
        assert_eq!(plans, from_scenario(&s, 50, 3, 4).unwrap());
        assert_eq!(plans.len(), 4);
        let all: Vec<&Planned> = plans.iter().flat_map(|p| &p.requests).collect();
        assert!(all.iter().any(|p| p.request.params.n > 1));
        assert!(all.iter().any(|p| !p.request.images.is_empty()));
        assert!(all.iter().any(|p| p.abort_after_ms.is_some()));
        assert!(plans.iter().all(|p| !p.sleeps.is_empty()));
        let mut ids: Vec<u64> = all.iter().map(|p| p.request.id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), all.len(), "ids are unique");
    }
}
