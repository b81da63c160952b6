//! The in-process KV transport: moves a request's KV from the prefill engine to the decode engine
//! in chunks of at most `bytes_per_step` per step (so a pull spans steps, as over a real link, and
//! can be aborted midway), through a registered receive region.
//!
//! Lifecycle of a transfer, on each side:
//! - sender (prefill side): `start` stages the request's KV (`export_kv`, which may refuse a stale
//!   request) with its chunk bookkeeping in `senders`; each step sends the next chunk; the
//!   terminal chunk's send frees the sender state (`cleanup_sender`). A pull the decode side gives
//!   up on is purged from the sender side by `cancel`.
//! - receiver (decode side): the transfer waits for a region from the registration cache, takes
//!   each chunk into it, and when all bytes are in hands them to the decode engine (`pull_done`)
//!   and gives the region back. `cancel` drops a pull in flight and frees its region.
//!
//! With `pd-sender-on-abort` the abort-time purge skips the sender side, as in vLLM-omni's chunk
//! transfer adapter (issue 6352): the sender state of every request aborted mid-transfer (its
//! staged KV and its per-chunk records) stays on the heap, in no registry.

use std::collections::{BTreeMap, VecDeque};

use plateau_engine::{Engine, PullOrder, RequestId};

use super::region::RegionCache;

/// The sender side's state for one transfer: the staged payload and a record of every chunk sent.
struct SenderState {
    payload: Vec<u8>,
    /// Bytes of each chunk sent so far.
    chunks_sent: Vec<usize>,
}

/// The receiver side's state for one transfer in flight.
struct Receiving {
    order: PullOrder,
    region: usize,
    len: usize,
    received: usize,
}

pub struct InProcessTransport {
    regions: RegionCache,
    bytes_per_step: usize,
    /// Sender side, by request: reclaimed after the terminal chunk, or by `cancel`.
    senders: BTreeMap<RequestId, SenderState>,
    /// Receiver side: orders waiting for a free region, oldest first.
    queued: VecDeque<PullOrder>,
    /// Receiver side: pulls taking chunks.
    in_flight: BTreeMap<RequestId, Receiving>,
    /// The injection `pd-sender-on-abort`: `cancel` leaves the sender side alone.
    sender_kept_on_abort: bool,
}

impl InProcessTransport {
    pub fn new(regions: usize, bytes_per_step: usize, leak_on_remap: bool, sender_kept_on_abort: bool) -> Self {
        InProcessTransport {
            regions: RegionCache::new(regions, leak_on_remap),
            bytes_per_step: bytes_per_step.max(1),
            senders: BTreeMap::new(),
            queued: VecDeque::new(),
            in_flight: BTreeMap::new(),
            sender_kept_on_abort,
        }
    }

    pub fn regions(&self) -> &RegionCache {
        &self.regions
    }

    /// Transfers queued or moving (the receiver side's registry).
    pub fn in_flight(&self) -> usize {
        self.in_flight.len() + self.queued.len()
    }

    /// Starts a pull: the sender side stages the blocks. A refusal fails the pull at once.
    pub fn start(&mut self, order: PullOrder, prefill: &Engine, decode: &mut Engine) {
        match prefill.export_kv(order.request, order.handle, &order.remote_blocks) {
            Ok(data) => {
                let payload: Vec<u8> = data.iter().flat_map(|f| f.to_le_bytes()).collect();
                self.senders.insert(order.request, SenderState { payload, chunks_sent: Vec::new() });
                self.queued.push_back(order);
            }
            Err(e) => {
                decode.pull_done(order.request, Err(e));
            }
        }
    }

    /// The decode side gave up on `request`'s pull (it was aborted or failed): the receiver drops
    /// it and frees its region, and the sender side is purged.
    pub fn cancel(&mut self, request: RequestId) {
        self.queued.retain(|o| o.request != request);
        if let Some(r) = self.in_flight.remove(&request) {
            self.regions.release(r.region);
        }
        if self.sender_kept_on_abort {
            // The bug: the purge returns before it reaches the sender side, whose state is only
            // ever reclaimed after the terminal chunk, which an aborted transfer never sends.
            return;
        }
        self.senders.remove(&request);
    }

    /// The sender side's cleanup, after the terminal chunk is sent.
    fn cleanup_sender(&mut self, request: RequestId) {
        self.senders.remove(&request);
    }

    /// Moves up to `bytes_per_step`; completes transfers whose bytes are all in.
    pub fn progress(&mut self, decode: &mut Engine) -> Result<(), String> {
        while let Some(order) = self.queued.pop_front() {
            let len = self.senders.get(&order.request).map_or(0, |s| s.payload.len());
            match self.regions.acquire(len)? {
                Some(region) => {
                    self.in_flight.insert(order.request, Receiving { order, region, len, received: 0 });
                }
                None => {
                    self.queued.push_front(order);
                    break;
                }
            }
        }
        let mut budget = self.bytes_per_step;
        let mut finished = Vec::new();
        for (rid, r) in self.in_flight.iter_mut() {
            if budget == 0 {
                break;
            }
            let Some(sender) = self.senders.get_mut(rid) else { continue };
            let n = (r.len - r.received).min(budget);
            let chunk = &sender.payload[r.received..r.received + n];
            self.regions.bytes_mut(r.region)[r.received..r.received + n].copy_from_slice(chunk);
            sender.chunks_sent.push(n);
            r.received += n;
            budget -= n;
            if r.received == r.len {
                finished.push(*rid);
            }
        }
        for rid in finished {
            self.cleanup_sender(rid);
            let r = self.in_flight.remove(&rid).expect("listed above");
            let received = &self.regions.bytes_mut(r.region)[..r.len];
            let data: Vec<f32> =
                received.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
            self.regions.release(r.region);
            // False when the request ended meanwhile: the bytes are dropped.
            decode.pull_done(r.order.request, Ok(data));
        }
        Ok(())
    }
}
