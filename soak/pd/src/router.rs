//! The router's part of a prefill/decode pair, shared by the in-process and cross-process pairs:
//! it remembers each request as the client sent it while the prefill side works on it, then
//! decides where the request goes once its prefill ends.

use std::collections::BTreeMap;

use plateau_engine::{next_hop, NextHop, Request, RequestOutput, TransferParams};
use rand_chacha::ChaCha8Rng;
use rand_core::RngCore;

/// What to do with a request whose prefill ended.
pub enum Route {
    /// It ended on the prefill side (aborted, failed) or is unknown: nothing to do.
    Ignore,
    /// Its first token ends it: release the held KV (request id).
    Done(u64),
    /// Its decode node "died" (a seeded fraction): the prefill side must time the KV out.
    Drop,
    /// Send it with its transfer parameters to the decode side.
    Forward(Request, TransferParams),
}

pub struct Router {
    /// Requests on the prefill side, as the client sent them.
    pub originals: BTreeMap<u64, Request>,
    failure_fraction: f64,
    rng: ChaCha8Rng,
    pub dropped: u64,
}

impl Router {
    pub fn new(failure_fraction: f64, seed: u64) -> Self {
        Router {
            originals: BTreeMap::new(),
            failure_fraction,
            rng: plateau_scenario::workload::rng_for(&[seed, 0xdead]),
            dropped: 0,
        }
    }

    /// The prefill side's copy of a request: one token.
    pub fn prefill_request(r: &Request) -> Request {
        let mut first = r.clone();
        first.params.max_tokens = 1;
        first
    }

    pub fn route(&mut self, o: RequestOutput) -> Route {
        let Some(orig) = self.originals.remove(&o.id) else { return Route::Ignore };
        let t = match next_hop(&orig.params, &o) {
            NextHop::Ended => return Route::Ignore,
            NextHop::Release => return Route::Done(o.id),
            NextHop::Decode(t) => t,
        };
        let draw = (self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        if draw < self.failure_fraction {
            self.dropped += 1;
            return Route::Drop;
        }
        Route::Forward(orig, t)
    }
}
