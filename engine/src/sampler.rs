//! Sampling from logits: greedy at temperature 0, otherwise temperature, top-k and top-p, with every
//! draw taken from the sequence's own RNG, seeded from (request seed, sequence index), so a
//! sequence's tokens never depend on what else shares its batch.

use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

use crate::request::SamplingParams;

/// The RNG of sequence `index` of a request seeded with `seed`.
pub fn seq_rng(seed: u64, index: usize) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(index as u64);
    rng
}

/// A uniform draw in [0, 1) with 53 bits.
fn uniform(rng: &mut ChaCha8Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// Picks the next token. Ties in greedy mode go to the lowest id.
pub fn sample(logits: &[f32], params: &SamplingParams, rng: &mut ChaCha8Rng) -> u32 {
    assert!(!logits.is_empty());
    if params.temperature == 0.0 {
        return argmax(logits);
    }
    let inv_t = 1.0 / params.temperature as f64;
    // Candidates sorted by logit, highest first, ties by lower id (a total order: deterministic).
    let mut keys = ranked(logits);
    if params.top_k > 0 {
        keys.truncate(params.top_k as usize);
    }
    let id = |key: u64| key as u32;
    let max = logits[id(keys[0]) as usize] as f64;
    let weights: Vec<f64> = keys.iter().map(|&k| ((logits[id(k) as usize] as f64 - max) * inv_t).exp()).collect();
    let total: f64 = weights.iter().sum();
    let mut keep = weights.len();
    if params.top_p < 1.0 {
        let mut acc = 0.0;
        for (i, w) in weights.iter().enumerate() {
            acc += w / total;
            if acc >= params.top_p as f64 {
                keep = i + 1;
                break;
            }
        }
    }
    let kept_total: f64 = weights[..keep].iter().sum();
    let mut r = uniform(rng) * kept_total;
    for (i, w) in weights[..keep].iter().enumerate() {
        if r < *w {
            return id(keys[i]);
        }
        r -= w;
    }
    id(keys[keep - 1])
}

/// Every candidate as one integer key (its rank by logit in the high half, its id in the low one),
/// in rank order: highest logit first, ties to the lower id. No two keys are equal, so an unstable
/// sort gives the one order, at a third of the cost of comparing floats through an index (and a
/// radix or bucket sort of a few hundred keys costs more than either).
fn ranked(logits: &[f32]) -> Vec<u64> {
    let mut keys: Vec<u64> =
        logits.iter().enumerate().map(|(i, &l)| u64::from(descending(l)) << 32 | i as u64).collect();
    keys.sort_unstable();
    keys
}

/// A key that orders logits highest first as `f32::total_cmp` orders them lowest first.
fn descending(logit: f32) -> u32 {
    let bits = logit.to_bits();
    // total_cmp's order as unsigned integers: negative values flipped whole, positive ones above.
    let ascending = if bits >> 31 == 1 { !bits } else { bits | 1 << 31 };
    !ascending
}

pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(t: f32, k: u32, p: f32) -> SamplingParams {
        SamplingParams { temperature: t, top_k: k, top_p: p, ..SamplingParams::default() }
    }

    #[test]
    fn greedy_and_top_k_one_pick_the_max() {
        let logits = [0.1, 3.0, 2.0, 3.0];
        let mut rng = seq_rng(1, 0);
        assert_eq!(sample(&logits, &params(0.0, 0, 1.0), &mut rng), 1);
        assert_eq!(sample(&logits, &params(1.0, 1, 1.0), &mut rng), 1);
    }

    #[test]
    fn top_p_excludes_the_tail() {
        let logits = [10.0, 9.0, -10.0, -10.0];
        let mut rng = seq_rng(3, 0);
        for _ in 0..200 {
            assert!(sample(&logits, &params(1.0, 0, 0.9), &mut rng) < 2);
        }
    }

    #[test]
    fn candidates_are_ordered_as_total_cmp_orders_them() {
        let vals = [f32::NEG_INFINITY, -3.5, -0.0, 0.0, 1e-30, 2.0, 2.0, f32::INFINITY];
        for a in vals {
            for b in vals {
                assert_eq!(descending(a).cmp(&descending(b)), b.total_cmp(&a), "{a} {b}");
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn candidates_come_in_the_order_of_their_sorted_keys(
            logits in proptest::collection::vec(proptest::prop_oneof![-1e3f32..1e3, proptest::num::f32::ANY], 1..400)
        ) {
            let mut sorted: Vec<u64> =
                logits.iter().enumerate().map(|(i, &l)| u64::from(descending(l)) << 32 | i as u64).collect();
            sorted.sort_unstable();
            proptest::prop_assert_eq!(ranked(&logits), sorted);
        }
    }

    #[test]
    fn ties_keep_id_order_and_equal_logits_rank_together() {
        // Two candidates share the top logit: top-k 1 keeps the lower id, deterministically.
        let logits = [2.0f32, 5.0, 2.0, 5.0];
        let mut rng = seq_rng(9, 0);
        for _ in 0..50 {
            assert_eq!(sample(&logits, &params(1.0, 1, 1.0), &mut rng), 1);
        }
    }

    #[test]
    fn streams_differ_by_index_and_repeat_by_seed() {
        let logits = vec![0.0f32; 64];
        let draw = |seed, i| {
            let mut r = seq_rng(seed, i);
            (0..8).map(|_| sample(&logits, &params(1.0, 0, 1.0), &mut r)).collect::<Vec<_>>()
        };
        assert_eq!(draw(5, 0), draw(5, 0));
        assert_ne!(draw(5, 0), draw(5, 1));
        assert_ne!(draw(5, 0), draw(6, 0));
    }
}
