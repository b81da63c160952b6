//! Property tests of the block pool and KV manager under random operation sequences.

use plateau_engine::kv_manager::KvManager;
use plateau_engine::registry::Registries;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    /// Start a sequence with this many prompt tokens (from a small alphabet, so prefixes repeat).
    Start {
        tokens: usize,
        variant: u8,
    },
    Append {
        seq: usize,
        tokens: usize,
    },
    Fork {
        seq: usize,
    },
    Free {
        seq: usize,
    },
    /// Allocate-then-free a throwaway sequence big enough to evict cached blocks.
    Evict {
        tokens: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1usize..40, 0u8..3).prop_map(|(tokens, variant)| Op::Start { tokens, variant }),
        (0usize..16, 1usize..6).prop_map(|(seq, tokens)| Op::Append { seq, tokens }),
        (0usize..16).prop_map(|seq| Op::Fork { seq }),
        (0usize..16).prop_map(|seq| Op::Free { seq }),
        (1usize..60).prop_map(|tokens| Op::Evict { tokens }),
    ]
}

struct Live {
    id: u64,
    tokens: Vec<u32>,
    computed: usize,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn accounting_holds_and_everything_returns(ops in prop::collection::vec(op(), 1..80)) {
        let mut book = Registries::new();
        let mut kv = KvManager::new(24, 4, true, &mut book);
        let mut live: Vec<Live> = Vec::new();
        let mut next = 0u64;
        for op in ops {
            match op {
                Op::Start { tokens, variant } => {
                    let toks: Vec<u32> = (0..tokens as u32).map(|j| j % 7 + variant as u32).collect();
                    let hits = kv.prefix_hits(&toks, &[]);
                    let start = hits.len() * 4;
                    if kv.allocate(next, &hits, start, toks.len()).is_ok() {
                        kv.publish(next, &toks, toks.len(), &[]);
                        let computed = toks.len();
                        live.push(Live { id: next, tokens: toks, computed });
                    } else {
                        prop_assert!(!kv.has_table(next), "failed allocation left a table");
                    }
                    next += 1;
                }
                Op::Append { seq, tokens } if !live.is_empty() => {
                    let k = seq % live.len();
                    let l = &mut live[k];
                    let before = l.computed;
                    if kv.allocate(l.id, &[], before, before + tokens).is_ok() {
                        l.tokens.extend((0..tokens as u32).map(|j| 100 + j));
                        l.computed += tokens;
                        kv.publish(l.id, &l.tokens, l.computed, &[]);
                    }
                }
                Op::Fork { seq } if !live.is_empty() => {
                    let (id, tokens, computed) = {
                        let l = &live[seq % live.len()];
                        (l.id, l.tokens.clone(), l.computed)
                    };
                    kv.fork(id, next);
                    live.push(Live { id: next, tokens, computed });
                    next += 1;
                }
                Op::Free { seq } if !live.is_empty() => {
                    let l = live.swap_remove(seq % live.len());
                    kv.free(l.id);
                }
                Op::Evict { tokens } if kv.allocate(u64::MAX, &[], 0, tokens).is_ok() => {
                    kv.free(u64::MAX);
                }
                _ => {}
            }
            let c = kv.counts();
            prop_assert!(c.adds_up(), "{:?}", c);
            prop_assert!(kv.check().is_ok(), "{:?}", kv.check());
        }
        for l in live.drain(..) {
            kv.free(l.id);
        }
        let c = kv.counts();
        prop_assert_eq!(c.used, 0);
        prop_assert_eq!(c.free + c.cached, c.total);
        prop_assert!(kv.check().is_ok());
    }
}
