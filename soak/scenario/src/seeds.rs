//! Where a workload's random draws come from: one ChaCha8 stream per purpose, keyed by the run's
//! seed and what the draw is for (a request's padding, a phase's abort choices, an image's pixels),
//! so that a draw never depends on how many draws came before it elsewhere.

use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;

/// The stream for `parts` (the seed first, then what the draw is for): the same parts give the
/// same stream on every platform (the key is the engine's stable hash, not std's).
pub fn rng_for(parts: &[u64]) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(plateau_engine::stable_hash::StableHasher::new().u64s(parts).finish())
}
