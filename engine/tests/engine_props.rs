//! Property test of the whole engine: random request mixes, aborts at random steps, KV pressure.

use crate::common;

use std::collections::BTreeMap;

use common::*;
use plateau_engine::{AbortOutcome, FinishReason};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Spec {
    prompt_len: usize,
    n: u32,
    max_tokens: u32,
    /// Abort at this step, if any.
    abort_at: Option<usize>,
    /// Arrives at this step.
    arrive_at: usize,
    shared_prefix: bool,
}

fn spec() -> impl Strategy<Value = Spec> {
    (1usize..40, 1u32..4, prop_oneof![Just(1u32), 1u32..12], prop::option::of(0usize..30), 0usize..10, any::<bool>())
        .prop_map(|(prompt_len, n, max_tokens, abort_at, arrive_at, shared_prefix)| Spec {
            prompt_len,
            n,
            max_tokens,
            abort_at,
            arrive_at,
            shared_prefix,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn every_request_ends_exactly_once_and_idle_is_clean(
        specs in prop::collection::vec(spec(), 1..14),
        blocks in 12usize..40,
        temperature in prop_oneof![Just(0.0f32), Just(1.0f32)],
    ) {
        let mut e = engine_with(|c| { c.num_kv_blocks = blocks; c.max_num_batched_tokens = 24; c.max_num_seqs = 8; });
        let mut ended: BTreeMap<u64, FinishReason> = BTreeMap::new();
        let mut added = Vec::new();
        for step in 0..2000usize {
            for (i, s) in specs.iter().enumerate() {
                if s.arrive_at == step {
                    let base = if s.shared_prefix { 0 } else { i as u64 + 1 };
                    let mut r = req(i as u64, prompt(base, s.prompt_len), s.n, s.max_tokens, i as u64);
                    r.params.temperature = temperature;
                    if e.add_request(r).is_ok() {
                        added.push(i as u64);
                    }
                }
                if s.abort_at == Some(step) && added.contains(&(i as u64)) {
                    let out = e.abort(i as u64);
                    prop_assert!(out == AbortOutcome::Aborted || ended.contains_key(&(i as u64)));
                }
            }
            for out in e.step().unwrap() {
                prop_assert!(ended.insert(out.id, out.finish()).is_none(), "request {} ended twice", out.id);
                prop_assert_eq!(out.seqs.len(), specs[out.id as usize].n as usize);
            }
            if step > 40 && !e.has_unfinished() {
                break;
            }
        }
        prop_assert!(!e.has_unfinished(), "engine did not drain");
        for id in &added {
            prop_assert!(ended.contains_key(id), "request {} never ended", id);
        }
        prop_assert_eq!(e.check_idle(), Ok(()));
    }
}
