//! The cost model: how much simulated time compute and transfers take. Inside madsim CPU work is
//! free, so a node sleeps for what its step would have cost on the modelled hardware, and a KV
//! transfer for its bytes over the link's bandwidth (madsim's latency ignores payload size).

/// Costs of the modelled node. The defaults describe a small model on one accelerator: a fixed
/// launch overhead per step, a cost per prompt token computed and per sequence decoded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    pub step_base_us: u64,
    pub prefill_token_us: u64,
    pub decode_token_us: u64,
    /// Link bandwidth for KV transfers, bytes per simulated millisecond.
    pub kv_bytes_per_ms: u64,
}

impl CostModel {
    pub fn new(kv_bandwidth_mb_per_s: u64) -> Self {
        CostModel {
            step_base_us: 800,
            prefill_token_us: 4,
            decode_token_us: 30,
            kv_bytes_per_ms: kv_bandwidth_mb_per_s * 1000,
        }
    }

    /// Simulated time of one engine step, in whole ms (madsim's smallest sleep), at least 1.
    pub fn step_ms(&self, prefill_tokens: u64, decode_tokens: u64) -> u64 {
        let us = self.step_base_us + prefill_tokens * self.prefill_token_us + decode_tokens * self.decode_token_us;
        us.div_ceil(1000).max(1)
    }

    /// Simulated time to move `bytes` of KV, slowed down `slowdown` times (a slow-transfer fault).
    pub fn transfer_ms(&self, bytes: u64, slowdown: u64) -> u64 {
        (bytes.saturating_mul(slowdown.max(1))).div_ceil(self.kv_bytes_per_ms.max(1)).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costs_grow_with_work_and_never_round_to_zero() {
        let c = CostModel::new(10_000);
        assert_eq!(c.step_ms(0, 0), 1);
        assert!(c.step_ms(2048, 0) > c.step_ms(16, 0));
        assert!(c.step_ms(0, 64) > c.step_ms(0, 1));
        assert_eq!(c.transfer_ms(1, 1), 1);
        assert_eq!(c.transfer_ms(100_000_000, 1), 10);
        assert_eq!(c.transfer_ms(100_000_000, 10), 100);
    }
}
