//! Deterministic noise for the detector's unit tests (only built for tests).

/// Jitter in [-amp, amp] that looks like noise to the step detector too. `tests::jitter` moves by one
/// of two differences from sample to sample (`i * 761 mod 1000`), so the spread of successive
/// differences is zero and every wiggle reads as a step of its own.
pub(crate) fn noise(i: u64, amp: f64) -> f64 {
    let mut z = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    ((z % 1_000_001) as f64 / 1_000_000.0 * 2.0 - 1.0) * amp
}
