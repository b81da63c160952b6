//! The same seed and requests give the same tokens whatever the batch and arrival order.

use crate::common;

use std::collections::BTreeMap;

use common::*;

fn run(order: &[u64], batch_tokens: usize, max_seqs: usize, seed_offset: u64) -> BTreeMap<u64, Vec<Vec<u32>>> {
    let mut e = engine_with(|c| {
        c.max_num_batched_tokens = batch_tokens;
        c.max_num_seqs = max_seqs;
    });
    let mut outs = BTreeMap::new();
    for (k, &i) in order.iter().enumerate() {
        let mut r = req(i, prompt(i, 5 + i as usize * 3), 2, 10, 100 + i + seed_offset);
        r.params.temperature = 0.9;
        r.params.top_p = 0.95;
        e.add_request(r).unwrap();
        // Stagger arrivals: some requests join a running batch.
        if k % 2 == 1 {
            for o in e.step().unwrap() {
                outs.insert(o.id, o.seqs.into_iter().map(|s| s.tokens).collect());
            }
        }
    }
    for o in drain(&mut e, 10_000) {
        outs.insert(o.id, o.seqs.into_iter().map(|s| s.tokens).collect());
    }
    assert_eq!(e.check_idle(), Ok(()));
    outs
}

#[test]
fn tokens_do_not_depend_on_batching_or_arrival_order() {
    let base = run(&[0, 1, 2, 3, 4, 5], 64, 16, 0);
    assert_eq!(base.len(), 6);
    assert_eq!(run(&[5, 3, 1, 0, 2, 4], 64, 16, 0), base);
    // One sequence pair at a time, tiny chunks.
    assert_eq!(run(&[0, 1, 2, 3, 4, 5], 3, 2, 0), base);
    assert_eq!(run(&[2, 0, 4, 1, 5, 3], 17, 4, 0), base);
}

#[test]
fn other_seeds_give_other_tokens() {
    let a = run(&[0, 1, 2], 64, 16, 0);
    let b = run(&[0, 1, 2], 64, 16, 1);
    assert_ne!(a, b);
    // The two sequences of one request differ too.
    assert!(a.values().all(|seqs| seqs[0] != seqs[1]));
}

#[test]
fn preemption_does_not_change_tokens() {
    let roomy = run(&[0, 1, 2, 3, 4, 5], 64, 16, 0);
    let mut e = engine_with(|c| {
        c.num_kv_blocks = 14;
        c.max_num_batched_tokens = 64;
        c.max_num_seqs = 16;
    });
    for i in 0..6u64 {
        let mut r = req(i, prompt(i, 5 + i as usize * 3), 2, 10, 100 + i);
        r.params.temperature = 0.9;
        r.params.top_p = 0.95;
        e.add_request(r).unwrap();
    }
    let outs: BTreeMap<u64, Vec<Vec<u32>>> =
        drain(&mut e, 10_000).into_iter().map(|o| (o.id, o.seqs.into_iter().map(|s| s.tokens).collect())).collect();
    let preemptions = e.stats().into_iter().find(|m| m.name == "engine.preemptions").unwrap().value;
    assert!(preemptions > 0, "the small pool should force preemption");
    assert_eq!(outs, roomy);
    assert_eq!(e.check_idle(), Ok(()));
}

/// Known tokens for fixed seeds (the tiny preset, weights seed 0): a change in sampling, in the
/// model's arithmetic, or in how weights are drawn from their seed changes these, and must be a
/// visible decision (update the list in the same commit, saying why).
#[test]
fn fixed_seeds_sample_known_tokens() {
    let out = run(&[0, 1, 2], 64, 16, 0);
    let got: Vec<Vec<u32>> = out.values().flatten().cloned().collect();
    assert_eq!(got, KNOWN_TOKENS);
}

const KNOWN_TOKENS: [&[u32]; 6] = [
    &[40, 238, 65, 283, 161, 31, 216, 313, 195, 270],
    &[182, 243, 46, 42, 319, 188, 26, 29, 83, 31],
    &[0, 30, 26, 188, 79, 185, 235, 88, 75, 75],
    &[116, 154, 75, 43, 233, 139, 0, 202, 9, 281],
    &[121, 279, 210, 4, 161, 1, 282, 75, 226, 22],
    &[281, 113, 15, 196, 287, 216, 207, 248, 47, 57],
];
