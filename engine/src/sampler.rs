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

/// A uniform draw in [0, 1) with 53 bits: the one draw a sampled token takes.
pub fn uniform(rng: &mut ChaCha8Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// Picks the next token. Ties in greedy mode go to the lowest id.
///
/// The answer is always [`sample_ranked`]'s, which ranks the whole vocabulary. Most of a wide
/// vocabulary weighs nothing next to the top candidate, so [`sample_head`] ranks only the head
/// that can matter and hands back to the full ranking in the rare draw that reaches past it.
pub fn sample(logits: &[f32], params: &SamplingParams, rng: &mut ChaCha8Rng) -> u32 {
    assert!(!logits.is_empty());
    if params.temperature == 0.0 {
        return argmax(logits);
    }
    // The one draw a token takes, before either path, so both see the same one.
    sample_drawn(logits, params, uniform(rng))
}

/// [`sample`] at a temperature above 0 with its draw `u` already taken (a draw taken before the
/// forward pass, for a backend that samples on the device and handed the row back).
pub fn sample_drawn(logits: &[f32], params: &SamplingParams, u: f64) -> u32 {
    assert!(!logits.is_empty());
    let inv_t = 1.0 / params.temperature as f64;
    sample_head(logits, params, inv_t, u).unwrap_or_else(|| sample_ranked(logits, params, inv_t, u))
}

/// The definition: candidates sorted by logit, highest first, ties by lower id (a total order:
/// deterministic); top-k, then top-p over the weights `exp((logit - max) / T)`, then the draw `u`
/// walks the kept weights in rank order.
fn sample_ranked(logits: &[f32], params: &SamplingParams, inv_t: f64, u: f64) -> u32 {
    let mut keys = ranked(logits);
    if params.top_k > 0 {
        keys.truncate(params.top_k as usize);
    }
    let max = logits[key_id(keys[0])] as f64;
    let weights: Vec<f64> = keys.iter().map(|&k| weight(logits[key_id(k)], max, inv_t)).collect();
    match land(&weights, params.top_p, u) {
        Landing::At(i) => key_id(keys[i]) as u32,
        Landing::Past { keep, .. } => key_id(keys[keep - 1]) as u32,
    }
}

/// Where a draw lands among weights in rank order.
enum Landing {
    /// On the weight at this index.
    At(usize),
    /// Past the last of the `keep` weights top-p kept (rounding can carry a draw of almost 1
    /// there); `top_p_reached`: whether top-p, rather than the end of the list, set `keep`.
    Past { keep: usize, top_p_reached: bool },
}

/// Top-p over `weights` (in rank order), then the draw `u` walks the kept ones.
fn land(weights: &[f64], top_p: f32, u: f64) -> Landing {
    let total: f64 = weights.iter().sum();
    let mut keep = weights.len();
    let mut top_p_reached = false;
    if top_p < 1.0 {
        let mut acc = 0.0;
        for (i, w) in weights.iter().enumerate() {
            acc += w / total;
            if acc >= top_p as f64 {
                (keep, top_p_reached) = (i + 1, true);
                break;
            }
        }
    }
    let kept_total: f64 = weights[..keep].iter().sum();
    let mut r = u * kept_total;
    for (i, w) in weights[..keep].iter().enumerate() {
        if r < *w {
            return Landing::At(i);
        }
        r -= w;
    }
    Landing::Past { keep, top_p_reached }
}

/// Below this log-weight a candidate's weight is under e^-40 (4.2e-18), less than half an ulp
/// (2^-53, 1.1e-16) of any sum that holds the top candidate's weight of exactly 1: adding it, or
/// any lighter one after it, leaves a running total in rank order unchanged to the bit.
const NEGLIGIBLE_LOG_WEIGHT: f64 = -40.0;

/// [`sample_ranked`]'s answer from the head of the ranking alone (the candidates within
/// [`NEGLIGIBLE_LOG_WEIGHT`] of the top), or `None` where the answer needs the tail: a draw that
/// walks past the head before top-p is reached in it, which takes a draw within 1e-16 of 1. Every
/// sum runs in the same order over the same values as the definition's, so the weights, totals
/// and the token are the same bits.
fn sample_head(logits: &[f32], params: &SamplingParams, inv_t: f64, u: f64) -> Option<u32> {
    if !(inv_t > 0.0 && inv_t.is_finite()) {
        return None;
    }
    // No infinity or NaN anywhere (an all-ones exponent), and the top candidate as the ranking has
    // it: the highest rank, and the lowest id that holds it. The rank as a signed integer (its top
    // bit flipped), whose maximum the compiler vectorizes with the baseline x86-64 instructions.
    let signed_rank = |l: &f32| (ascending(l.to_bits()) ^ 1 << 31) as i32;
    let mut non_finite = false;
    let mut best = i32::MIN;
    for l in logits {
        non_finite |= l.to_bits() & 0x7f80_0000 == 0x7f80_0000;
        best = best.max(signed_rank(l));
    }
    if non_finite {
        return None;
    }
    let top = logits.iter().position(|l| signed_rank(l) == best).expect("the best is some candidate's");
    let max = logits[top] as f64;
    // A cheap first cut in f32, a log-weight of one below the exact one's (f32 rounding moves it
    // by far less): what it drops is negligible, what it keeps is checked exactly.
    let rough_floor = (max + (NEGLIGIBLE_LOG_WEIGHT - 1.0) / inv_t) as f32;
    // Without a branch: every candidate's key is written at the end of the kept ones, which grow
    // past it only if it is kept (whether a candidate is in the head is a coin the branch
    // predictor cannot learn).
    let mut keys = vec![0u64; logits.len()];
    let mut kept = 0;
    for (i, &l) in logits.iter().enumerate() {
        keys[kept] = key(l, i);
        kept += usize::from((l >= rough_floor) & ((l as f64 - max) * inv_t >= NEGLIGIBLE_LOG_WEIGHT));
    }
    keys.truncate(kept);
    keys.sort_unstable();
    let top_k = params.top_k as usize;
    // Whether the head is every candidate the definition keeps after top-k.
    let whole = keys.len() == logits.len() || (top_k > 0 && top_k <= keys.len());
    if top_k > 0 {
        keys.truncate(top_k);
    }
    let weights: Vec<f64> = keys.iter().map(|&k| weight(logits[key_id(k)], max, inv_t)).collect();
    debug_assert_eq!(weights[0], 1.0);
    // The tail adds nothing to any sum that holds the top's 1.0 (NEGLIGIBLE_LOG_WEIGHT), so the
    // head's totals are the definition's, and a draw that lands in the head lands there in the
    // definition too. Past it, the answer is the last kept candidate only if the head holds it.
    match land(&weights, params.top_p, u) {
        Landing::At(i) => Some(key_id(keys[i]) as u32),
        Landing::Past { keep, top_p_reached } => (whole || top_p_reached).then(|| key_id(keys[keep - 1]) as u32),
    }
}

/// A candidate's weight at inverse temperature `inv_t`, relative to the top logit `max`.
fn weight(logit: f32, max: f64, inv_t: f64) -> f64 {
    ((logit as f64 - max) * inv_t).exp()
}

fn key(logit: f32, id: usize) -> u64 {
    u64::from(descending(logit)) << 32 | id as u64
}

fn key_id(key: u64) -> usize {
    key as u32 as usize
}

/// Every candidate as one integer key (its rank by logit in the high half, its id in the low one),
/// in rank order: highest logit first, ties to the lower id. No two keys are equal, so an unstable
/// sort gives the one order, at a third of the cost of comparing floats through an index (and a
/// radix or bucket sort of a few hundred keys costs more than either).
fn ranked(logits: &[f32]) -> Vec<u64> {
    let mut keys: Vec<u64> = logits.iter().enumerate().map(|(i, &l)| key(l, i)).collect();
    keys.sort_unstable();
    keys
}

/// A key that orders logits highest first as `f32::total_cmp` orders them lowest first.
fn descending(logit: f32) -> u32 {
    !ascending(logit.to_bits())
}

/// `f32::total_cmp`'s order as unsigned integers, of a float's bits: negative values flipped
/// whole, positive ones above them.
fn ascending(bits: u32) -> u32 {
    if bits >> 31 == 1 {
        !bits
    } else {
        bits | 1 << 31
    }
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

    /// Logits as the models give them: the hash model's spread of 256 over a vocabulary of a few
    /// hundred, a real model's few units, or a handful of values with many ties.
    fn logits_strategy() -> impl proptest::strategy::Strategy<Value = Vec<f32>> {
        use proptest::prelude::*;
        (1usize..600, prop_oneof![Just(256.0f32), Just(4.0), Just(60.0), Just(0.0)], any::<u64>()).prop_map(
            |(n, spread, seed)| {
                let mut rng = seq_rng(seed, 0);
                (0..n)
                    .map(|_| {
                        let x = rng.next_u32();
                        if spread == 0.0 {
                            (x % 4) as f32
                        } else {
                            (x >> 8) as f32 / (1u32 << 24) as f32 * spread
                        }
                    })
                    .collect()
            },
        )
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
        #[test]
        fn the_head_gives_the_ranking_s_token(
            logits in logits_strategy(),
            t in proptest::prop_oneof![proptest::strategy::Just(1.0f32), 0.01f32..4.0],
            k in proptest::prop_oneof![proptest::strategy::Just(0u32), 1u32..700],
            p in proptest::prop_oneof![proptest::strategy::Just(1.0f32), 0.01f32..1.0],
            u in proptest::prop_oneof![0.0f64..1.0, proptest::strategy::Just(1.0 - f64::EPSILON / 2.0)],
        ) {
            let params = params(t, k, p);
            let inv_t = 1.0 / t as f64;
            let want = sample_ranked(&logits, &params, inv_t, u);
            if let Some(got) = sample_head(&logits, &params, inv_t, u) {
                proptest::prop_assert_eq!(got, want);
            }
        }
    }

    #[test]
    fn the_head_answers_for_a_wide_vocabulary_and_the_ranking_for_non_finite_logits() {
        // The hash model's logits: 512 candidates spread over 256. Every draw is the head's.
        let mut rng = seq_rng(7, 0);
        let logits: Vec<f32> = (0..512).map(|_| (rng.next_u32() >> 8) as f32 / 65536.0).collect();
        for (i, t) in [0.5f32, 1.0, 3.0].into_iter().enumerate() {
            for j in 0..100 {
                let u = j as f64 / 100.0;
                let params = params(t, [0, 40][i % 2], [1.0, 0.9][j % 2]);
                let head = sample_head(&logits, &params, 1.0 / t as f64, u);
                assert_eq!(head, Some(sample_ranked(&logits, &params, 1.0 / t as f64, u)), "t {t} u {u}");
            }
        }
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            assert_eq!(sample_head(&[1.0, bad], &params(1.0, 0, 1.0), 1.0, 0.5), None, "{bad}");
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
