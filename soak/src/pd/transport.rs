//! The in-process KV transport: moves a request's KV from the prefill engine to the decode engine
//! through a registered receive region, at most `bytes_per_step` per step (so a pull spans steps,
//! as over a real link, and can be aborted midway).
//!
//! Lifecycle of a transfer: `start` asks the prefill side for the blocks (`export_kv`, which may
//! refuse a stale request) and takes a region from the registration cache (waiting if all are in
//! use); `progress` copies into the region step by step; when all bytes are in, the decode side
//! gets them (`pull_done`) and the region goes back to the cache.

use std::collections::{BTreeMap, VecDeque};

use plateau_engine::{Engine, PullOrder, RequestId};

use super::region::RegionCache;

struct Transfer {
    order: PullOrder,
    region: usize,
    src: Vec<u8>,
    done: usize,
}

pub struct InProcessTransport {
    regions: RegionCache,
    bytes_per_step: usize,
    /// Orders waiting for a free region, oldest first.
    queued: VecDeque<(PullOrder, Vec<u8>)>,
    in_flight: BTreeMap<RequestId, Transfer>,
}

impl InProcessTransport {
    pub fn new(regions: usize, bytes_per_step: usize, leak_on_remap: bool) -> Self {
        InProcessTransport {
            regions: RegionCache::new(regions, leak_on_remap),
            bytes_per_step: bytes_per_step.max(1),
            queued: VecDeque::new(),
            in_flight: BTreeMap::new(),
        }
    }

    pub fn regions(&self) -> &RegionCache {
        &self.regions
    }

    /// Transfers queued or moving.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len() + self.queued.len()
    }

    /// Starts a pull: reads the blocks from the prefill side. A refusal fails the pull at once.
    pub fn start(&mut self, order: PullOrder, prefill: &Engine, decode: &mut Engine) {
        match prefill.export_kv(order.request, order.handle, &order.remote_blocks) {
            Ok(data) => {
                let bytes: Vec<u8> = data.iter().flat_map(|f| f.to_le_bytes()).collect();
                self.queued.push_back((order, bytes));
            }
            Err(e) => {
                decode.pull_done(order.request, Err(e));
            }
        }
    }

    /// Moves up to `bytes_per_step`; completes transfers whose bytes are all in.
    pub fn progress(&mut self, decode: &mut Engine) -> Result<(), String> {
        while let Some((order, src)) = self.queued.pop_front() {
            match self.regions.acquire(src.len())? {
                Some(region) => {
                    self.in_flight.insert(order.request, Transfer { order, region, src, done: 0 });
                }
                None => {
                    self.queued.push_front((order, src));
                    break;
                }
            }
        }
        let mut budget = self.bytes_per_step;
        let mut finished = Vec::new();
        for (rid, t) in self.in_flight.iter_mut() {
            if budget == 0 {
                break;
            }
            let n = (t.src.len() - t.done).min(budget);
            self.regions.bytes_mut(t.region)[t.done..t.done + n].copy_from_slice(&t.src[t.done..t.done + n]);
            t.done += n;
            budget -= n;
            if t.done == t.src.len() {
                finished.push(*rid);
            }
        }
        for rid in finished {
            let t = self.in_flight.remove(&rid).expect("listed above");
            let received = &self.regions.bytes_mut(t.region)[..t.src.len()];
            let data: Vec<f32> =
                received.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
            self.regions.release(t.region);
            // False when the request was aborted during the pull: the bytes are dropped.
            decode.pull_done(t.order.request, Ok(data));
        }
        Ok(())
    }
}
