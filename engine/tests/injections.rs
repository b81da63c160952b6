//! Each injection makes the idle self-check (or a heap measurement) fail; the same run without it
//! passes.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use common::*;
use plateau_engine::{Engine, Injection};

/// The system allocator, counted per thread: the tests of this binary run on parallel threads,
/// and a measurement must see only its own thread's allocations.
struct Counting;

thread_local! {
    /// Bytes this thread allocated minus bytes it freed.
    static LIVE_BYTES: Cell<i64> = const { Cell::new(0) };
}

fn count(delta: i64) {
    // A thread being torn down has no counter left; its allocations are not measured.
    let _ = LIVE_BYTES.try_with(|c| c.set(c.get() + delta));
}

fn live_bytes() -> i64 {
    LIVE_BYTES.with(Cell::get)
}

// SAFETY: every call forwards to the system allocator unchanged; only the count is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count(l.size() as i64);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        count(-(l.size() as i64));
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// A small workload with n=2 requests, aborts after the fork, and a sleep/wake cycle.
fn workload(e: &mut Engine) {
    for round in 0..3u64 {
        for i in 0..6u64 {
            let id = round * 100 + i;
            e.add_request(req(id, prompt(id, 9), 2, 6, id)).unwrap();
        }
        e.step().unwrap();
        e.step().unwrap(); // prefilled and forked, decoding
        e.abort(round * 100 + 1);
        e.abort(round * 100 + 4);
        drain(e, 1000);
        e.sleep(1).unwrap();
        e.wake().unwrap();
    }
}

fn violated(i: Option<Injection>) -> Vec<String> {
    let mut e = match i {
        Some(i) => injected(i),
        None => engine_with(|_| {}),
    };
    workload(&mut e);
    e.check_idle().err().unwrap_or_default().into_iter().map(|v| v.metric).collect()
}

#[test]
fn clean_engine_is_idle() {
    assert!(violated(None).is_empty());
}

#[test]
fn registry_retains_finished_is_seen_in_the_request_registry() {
    let v = violated(Some(Injection::RegistryRetainsFinished));
    assert!(v.contains(&"registry.requests".to_string()), "{v:?}");
}

#[test]
fn n_abort_orphans_leaves_sequences() {
    let v = violated(Some(Injection::NAbortOrphans));
    assert!(v.contains(&"registry.sequences".to_string()), "{v:?}");
}

#[test]
fn abort_keeps_blocks_leaves_blocks_in_use() {
    let v = violated(Some(Injection::AbortKeepsBlocks));
    assert!(v.contains(&"registry.kv.blocks_used".to_string()), "{v:?}");
    assert!(v.contains(&"registry.block_tables".to_string()), "{v:?}");
}

#[test]
fn sleep_keeps_kv_leaves_a_second_pool() {
    let v = violated(Some(Injection::SleepKeepsKv));
    assert_eq!(v, vec!["registry.kv_pools".to_string()]);
    let mut e = injected(Injection::SleepKeepsKv);
    let pool = e.stats().into_iter().find(|m| m.name == "engine.kv_pool_bytes").unwrap().value;
    workload(&mut e);
    let after = e.stats().into_iter().find(|m| m.name == "engine.kv_pool_bytes").unwrap().value;
    assert_eq!(after, 4 * pool, "three sleep cycles keep three old pools");
}

#[test]
fn untracked_heap_passes_idle_but_grows_the_heap_by_each_output() {
    // No registry sees it: the self-check passes, and only a heap measurement can tell.
    assert!(violated(Some(Injection::UntrackedHeap)).is_empty());
    // Live bytes after a drained batch, again after a second identical one: the engine keeps
    // each finished request's output tokens (10 requests x 2 sequences x 8 tokens x 4 bytes, in
    // one Vec per request).
    let growth = |i: Option<Injection>| {
        let mut e = match i {
            Some(i) => injected(i),
            None => engine_with(|_| {}),
        };
        let batch = |e: &mut Engine, base: u64| {
            for k in 0..10 {
                e.add_request(req(base + k, prompt(k, 12), 2, 8, k)).unwrap();
            }
            drain(e, 1000);
        };
        batch(&mut e, 0);
        let before = live_bytes();
        batch(&mut e, 100);
        live_bytes() - before
    };
    let clean = growth(None);
    let leaked = growth(Some(Injection::UntrackedHeap));
    let per_request = (leaked - clean) / 10;
    assert!((64..=256).contains(&per_request), "{per_request} bytes per request kept (clean run: {clean} bytes)");
}
