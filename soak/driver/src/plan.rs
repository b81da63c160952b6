//! One phase's requests as every target sends them, in the same order and with the same actions:
//! the phase's requests, its abort targets (a seeded choice, each with a seeded delay), and its
//! invalid requests spread through the batch. Planned once here, so a fix to what a phase sends
//! lands for plateau's engine and for an HTTP server alike.

use plateau_engine::Request;

use plateau_scenario::workload::{rng_for, Workload};
use plateau_scenario::{Abort, Phase, Stage};

/// The sizes a phase plan depends on: the model's vocabulary (for the out-of-vocabulary invalid
/// request) and the KV pool (for pressure phases).
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub vocab_size: usize,
    pub pool_tokens: usize,
    pub max_num_seqs: usize,
}

/// What the target does with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Serve it to its end.
    Complete,
    /// Abort it when it reaches `stage`; `delay` (0-7) is the seeded spread of the abort: steps
    /// for `Stage::Any`, a client's wait (ms or stream chunks) over HTTP.
    Abort { stage: Stage, delay: u64 },
    /// An invalid request the target must refuse; `what` names why.
    Refuse { what: &'static str },
}

#[derive(Debug)]
pub struct Send {
    pub request: Request,
    pub action: Action,
}

/// The requests phase `index` sends in iteration `iter` (1-based), after `done` iterations.
/// Sleep phases send nothing.
pub fn phase(workload: &mut Workload, index: usize, phase: &Phase, iter: u64, shape: Shape) -> Vec<Send> {
    // The abort choice is seeded by the iterations done before this one.
    let done = iter - 1;
    match phase {
        Phase::Batch(b) => {
            let reqs = workload.batch(index, b, iter);
            let actions = abort_actions(workload, &reqs, &b.abort, done, index);
            let mut invalid: Vec<(Request, &'static str)> =
                (0..b.invalid as u64).map(|k| workload.invalid(k + iter, shape.vocab_size)).collect();
            let mut sends = Vec::with_capacity(reqs.len() + invalid.len());
            for (k, (request, action)) in reqs.into_iter().zip(actions).enumerate() {
                sends.push(Send { request, action });
                // Invalid requests are spread through the batch: one after every fourth request
                // from the second on, the last made first; what is left goes at the end.
                if k % 4 == 1 {
                    if let Some((request, what)) = invalid.pop() {
                        sends.push(Send { request, action: Action::Refuse { what } });
                    }
                }
            }
            sends.extend(invalid.into_iter().map(|(request, what)| Send { request, action: Action::Refuse { what } }));
            sends
        }
        Phase::Pressure(p) => {
            let reqs = workload.pressure(p, shape.pool_tokens, shape.max_num_seqs);
            let actions = abort_actions(workload, &reqs, &p.abort, done, index);
            reqs.into_iter().zip(actions).map(|(request, action)| Send { request, action }).collect()
        }
        Phase::Sleep(_) => Vec::new(),
    }
}

/// Each request's action: aborted at the phase's stage when chosen, else served to its end.
fn abort_actions(w: &Workload, reqs: &[Request], abort: &Option<Abort>, done: u64, phase: usize) -> Vec<Action> {
    let Some(a) = abort else { return vec![Action::Complete; reqs.len()] };
    let ids: Vec<u64> = reqs.iter().map(|r| r.id).collect();
    let chosen = w.abort_targets(&ids, a.fraction, done, phase);
    let mut rng = rng_for(&[w.seed, done, phase as u64, 0x7a]);
    let delays: Vec<(u64, u64)> = chosen.iter().map(|id| (*id, rand_core::RngCore::next_u64(&mut rng) % 8)).collect();
    ids.iter()
        .map(|id| match delays.iter().find(|d| d.0 == *id) {
            Some(&(_, delay)) => Action::Abort { stage: a.stage, delay },
            None => Action::Complete,
        })
        .collect()
}
