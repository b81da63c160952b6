//! Attention of one query token over its context in the paged KV cache, for the query heads that
//! share one KV head (grouped-query attention): the inner loop of every CPU soak.
//!
//! The arithmetic is the plain loop's, in the same order for every value: a score is the dot of a
//! query head and a cached key (eight accumulators, summed in order) times the scale; a row's
//! softmax subtracts its maximum, exponentiates and divides by the sum taken in position order;
//! an output value sums weight times cached value in position order. Rust never fuses a multiply
//! and an add, nor reorders a sum, so the same code compiled for wider vector registers (AVX2,
//! where the CPU has it: eight lanes instead of four) gives the same bits, on every machine, as
//! the plain build; the tests check that bit for bit.

use crate::layers::dot;

/// The cached context one KV head's query heads attend over: the rows of positions in order
/// (`slots`, offsets into `k` and `v`), the KV head's column (`off`), the head dimension and the
/// score scale.
pub struct Context<'a> {
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub slots: &'a [usize],
    pub off: usize,
    pub hd: usize,
    pub scale: f32,
}

/// Attends the query heads in `q` (`hd` values each) over `ctx` and adds the result into `out`
/// (as long as `q`, zero on entry). `scores` is scratch space.
pub fn attend(q: &[f32], ctx: &Context, scores: &mut Vec<f32>, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        unsafe { attend_avx2(q, ctx, scores, out) };
        return;
    }
    attend_plain(q, ctx, scores, out);
}

/// [`attend`] compiled for AVX2: the same source, so the same operations in the same order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn attend_avx2(q: &[f32], ctx: &Context, scores: &mut Vec<f32>, out: &mut [f32]) {
    attend_plain(q, ctx, scores, out);
}

#[inline(always)]
fn attend_plain(q: &[f32], ctx: &Context, scores: &mut Vec<f32>, out: &mut [f32]) {
    let &Context { k, v, slots, off, hd, scale } = ctx;
    assert!(hd > 0 && q.len() == out.len() && q.len() % hd == 0, "attention: {} query values, head dim {hd}", q.len());
    let n_ctx = slots.len();
    scores.clear();
    scores.resize(q.len() / hd * n_ctx, 0.0);
    for (p, &base) in slots.iter().enumerate() {
        let kr = &k[base + off..base + off + hd];
        for (hh, qh) in q.chunks_exact(hd).enumerate() {
            scores[hh * n_ctx + p] = dot(qh, kr) * scale;
        }
    }
    softmax_rows(scores, n_ctx);
    // Each output value is its sum over positions in position order; eight of them at a time stay
    // in registers for the whole context instead of going back to memory at every position.
    for (o, weights) in out.chunks_exact_mut(hd).zip(scores.chunks_exact(n_ctx)) {
        let mut lane = 0;
        while lane + LANES <= hd {
            let mut acc: [f32; LANES] = o[lane..lane + LANES].try_into().expect("LANES values");
            for (&base, &wgt) in slots.iter().zip(weights) {
                let vr = &v[base + off + lane..base + off + lane + LANES];
                for l in 0..LANES {
                    acc[l] += wgt * vr[l];
                }
            }
            o[lane..lane + LANES].copy_from_slice(&acc);
            lane += LANES;
        }
        for (e, oe) in o.iter_mut().enumerate().skip(lane) {
            for (&base, &wgt) in slots.iter().zip(weights) {
                *oe += wgt * v[base + off + e];
            }
        }
    }
}

/// Each row of `n_ctx` scores becomes its softmax: minus the row's maximum, exponentiated,
/// divided by their sum in position order.
#[inline(always)]
fn softmax_rows(scores: &mut [f32], n_ctx: usize) {
    for row in scores.chunks_exact_mut(n_ctx) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut denom = 0.0f32;
        for sc in row.iter_mut() {
            *sc = (*sc - max).exp();
            denom += *sc;
        }
        let inv = 1.0 / denom;
        row.iter_mut().for_each(|sc| *sc *= inv);
    }
}

/// Output values summed together in registers: one AVX2 register of `f32`.
const LANES: usize = 8;

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::rand_core::{RngCore, SeedableRng};

    fn values(rng: &mut rand_chacha::ChaCha8Rng, n: usize) -> Vec<f32> {
        (0..n).map(|_| (rng.next_u32() as f32 / u32::MAX as f32 - 0.5) * 4.0).collect()
    }

    /// The loop as first written, position by position: what the fast one must equal bit for bit.
    #[allow(clippy::too_many_arguments)]
    fn reference(q: &[f32], k: &[f32], v: &[f32], slots: &[usize], off: usize, hd: usize, scale: f32, out: &mut [f32]) {
        let (group, n_ctx) = (q.len() / hd, slots.len());
        let mut scores = vec![0.0f32; group * n_ctx];
        for (p, &base) in slots.iter().enumerate() {
            for hh in 0..group {
                scores[hh * n_ctx + p] = dot(&q[hh * hd..(hh + 1) * hd], &k[base + off..base + off + hd]) * scale;
            }
        }
        softmax_rows(&mut scores, n_ctx);
        for (p, &base) in slots.iter().enumerate() {
            for hh in 0..group {
                let wgt = scores[hh * n_ctx + p];
                for e in 0..hd {
                    out[hh * hd + e] += wgt * v[base + off + e];
                }
            }
        }
    }

    #[test]
    fn the_fast_attention_gives_the_plain_loops_bits_with_and_without_avx2() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for (hd, group, n_ctx) in [(16, 2, 1), (16, 2, 37), (64, 4, 300), (12, 3, 9)] {
            let kvd = hd * 2;
            let rows = n_ctx + 5;
            let (k, v) = (values(&mut rng, rows * kvd), values(&mut rng, rows * kvd));
            let q = values(&mut rng, group * hd);
            // Slots out of order, as a block table scatters them.
            let slots: Vec<usize> = (0..n_ctx).map(|p| ((p * 7 + 3) % rows) * kvd).collect();
            let (mut a, mut b, mut r) = (vec![0.0; group * hd], vec![0.0; group * hd], vec![0.0; group * hd]);
            let mut scratch = Vec::new();
            let ctx = Context { k: &k, v: &v, slots: &slots, off: hd, hd, scale: 0.25 };
            attend(&q, &ctx, &mut scratch, &mut a);
            attend_plain(&q, &ctx, &mut scratch, &mut b);
            reference(&q, &k, &v, &slots, hd, hd, 0.25, &mut r);
            let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a), bits(&r), "hd {hd}, group {group}, {n_ctx} positions: dispatched");
            assert_eq!(bits(&b), bits(&r), "hd {hd}, group {group}, {n_ctx} positions: plain");
        }
    }
}
