//! Where a request is in its life, and what the harness does to the engine between batches:
//! sleep (release the KV pool, and the weights at level 2), wake, and weight updates (an RL
//! trainer's new policy). Sleep and updates wait for an idle engine: nothing in flight and no KV
//! held for a transfer.

use super::Engine;
use crate::error::{EngineError, Result};
use crate::model::weights::WeightSource;
use crate::request::{RequestId, RequestStage};

impl Engine {
    /// The stage of request `id`, or None when it is not in flight.
    pub fn stage(&self, id: RequestId) -> Option<RequestStage> {
        let req = self.store.requests.get(&id)?;
        let stage = |sid: u64, s: &crate::store::Seq| {
            if self.conn.is_waiting_for_kv(sid) {
                if self.conn.is_pulling(id) {
                    RequestStage::PullingKv
                } else {
                    RequestStage::AwaitingKv
                }
            } else if self.scheduler.is_waiting(sid) {
                let held = req.images.iter().filter(|i| self.encoder.holds(i.hash, id)).count();
                match (s.preemptions > 0, held) {
                    (true, _) => RequestStage::Preempted,
                    (false, 0) => RequestStage::Waiting,
                    (false, h) if h < req.images.len() => RequestStage::Encoding,
                    _ => RequestStage::Encoded,
                }
            } else if s.tokens.len() > s.num_prompt {
                RequestStage::Decode
            } else {
                RequestStage::Prefill
            }
        };
        req.seqs
            .iter()
            .filter_map(|&sid| self.store.seqs.get(&sid).filter(|s| s.finished.is_none()).map(|s| stage(sid, s)))
            .max()
    }

    /// The tokens each live sequence of request `id` has generated so far, by sequence index: what
    /// a streaming server sends as they come (a sequence that ended is in the request's output
    /// instead). Empty when the request is not in flight.
    pub fn generated(&self, id: RequestId) -> Vec<(u32, &[u32])> {
        let Some(req) = self.store.requests.get(&id) else { return Vec::new() };
        req.seqs
            .iter()
            .filter_map(|sid| self.store.seqs.get(sid))
            .filter(|s| s.finished.is_none())
            .map(|s| (s.index, &s.tokens[s.num_prompt.min(s.tokens.len())..]))
            .collect()
    }

    /// Sleep level 1 releases the KV pool; level 2 releases the weights too. Only with nothing in
    /// flight. While asleep, `add_request` is refused and `step` computes nothing.
    pub fn sleep(&mut self, level: u8) -> Result<()> {
        if !(1..=2).contains(&level) {
            return Err(EngineError::BadSleepLevel(level));
        }
        if self.asleep.is_some() {
            return Ok(());
        }
        self.refuse_if_busy()?;
        self.kv.reset_prefix_cache();
        self.runner.sleep(level);
        self.asleep = Some(level);
        Ok(())
    }

    /// Restores what sleep released: the KV pool, and after level 2 the weights of `config.model`.
    pub fn wake(&mut self) -> Result<()> {
        let Some(level) = self.asleep else {
            return Err(EngineError::NotAsleep);
        };
        if level == 2 {
            self.runner.load_weights(&self.config.model)?;
        }
        self.runner.allocate_kv(self.config.num_kv_blocks, self.config.block_size)?;
        self.asleep = None;
        Ok(())
    }

    /// Replaces the weights (an RL trainer's update). Asleep at level 2 they load at `wake`;
    /// otherwise at once. The prefix cache is dropped: its KV came from the old weights.
    pub fn update_weights(&mut self, source: WeightSource) -> Result<()> {
        if source.config()? != self.model {
            return Err(EngineError::weights("new weights have another model shape"));
        }
        if self.asleep != Some(2) {
            self.refuse_if_busy()?;
            self.runner.load_weights(&source)?;
            self.kv.reset_prefix_cache();
        }
        self.config.model = source;
        Ok(())
    }

    /// Drops every cached prefix block (what a trainer asks after new weights: cached KV came
    /// from the old ones). Only with nothing in flight; asleep, the pool holds none to drop.
    pub fn reset_prefix_cache(&mut self) -> Result<()> {
        self.refuse_if_busy()?;
        if self.asleep.is_none() {
            self.kv.reset_prefix_cache();
        }
        Ok(())
    }

    /// Requests in flight or KV held for a transfer make sleep and weight updates wait.
    fn refuse_if_busy(&self) -> Result<()> {
        match self.num_in_flight() + self.conn.held_len() {
            0 => Ok(()),
            busy => Err(EngineError::Busy(busy)),
        }
    }

    pub fn is_asleep(&self) -> bool {
        self.asleep.is_some()
    }
}
