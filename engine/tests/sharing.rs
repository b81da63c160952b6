//! n>1 shares the prompt's blocks; a repeated prompt hits the prefix cache.

use crate::common;

use common::*;

fn stat(e: &plateau_engine::Engine, name: &str) -> u64 {
    e.stats().into_iter().find(|m| m.name == name).unwrap_or_else(|| panic!("no metric {name}")).value
}

#[test]
fn n_sequences_share_the_prompt_blocks() {
    let mut e = engine_with(|c| c.enable_prefix_caching = false);
    // 10-token prompt, block size 4: 3 blocks, the last one partial.
    e.add_request(req(1, prompt(1, 10), 3, 4, 7)).unwrap();
    e.step().unwrap(); // prefill and fork
    assert_eq!(stat(&e, "registry.sequences"), 3);
    // Three sequences over 3 prompt blocks: the 2 full ones shared; each wrote its first token in
    // its own copy of the partial block (copy-on-write) on the next step.
    e.step().unwrap();
    assert_eq!(stat(&e, "engine.block_copies"), 2, "two of the three siblings copy the partial block");
    assert_eq!(stat(&e, "registry.kv.blocks_used"), 2 + 3);
    drain(&mut e, 100);
    assert_eq!(e.check_idle(), Ok(()));
}

#[test]
fn repeated_prompt_hits_the_prefix_cache() {
    let mut e = engine_with(|_| {});
    e.add_request(req(1, prompt(1, 21), 1, 2, 1)).unwrap();
    let first = drain(&mut e, 100);
    let computed_first = stat(&e, "engine.prompt_tokens_computed");
    assert_eq!(first[0].cached_prompt_tokens, 0);
    e.add_request(req(2, prompt(1, 21), 1, 2, 1)).unwrap();
    let second = drain(&mut e, 100);
    assert_eq!(second[0].cached_prompt_tokens, 20, "5 full blocks of 4 tokens hit");
    assert_eq!(stat(&e, "engine.prefix_cache_hit_tokens"), 20);
    assert_eq!(stat(&e, "engine.prompt_tokens_computed") - computed_first, 1);
    assert_eq!(first[0].seqs[0].tokens, second[0].seqs[0].tokens, "a hit computes the same tokens");
    assert_eq!(e.check_idle(), Ok(()));
}
