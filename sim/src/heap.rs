//! Per-node heap accounting in the simulation: the global allocator tags every allocation with the
//! node whose code made it (a 16-byte header) and keeps, per simulation thread, the live bytes of
//! each node's allocations, wherever they are freed. A node's figure at a quiescent point is the
//! heap its engine and shell hold: what jemalloc's `allocated` is to the soak, split by node.
//!
//! Tag 0 is everything else (router, clients, checker, trace), never counted. The counters are
//! thread-local because every seed runs on its own thread; an allocation freed on another thread
//! (a report handed back) moves that thread's counters, which nobody reads.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

pub const MAX_TAGS: usize = 64;
const HEADER: usize = 16;

thread_local! {
    static TAG: Cell<u8> = const { Cell::new(0) };
    static LIVE: [Cell<i64>; MAX_TAGS] = const { [const { Cell::new(0) }; MAX_TAGS] };
}

pub struct TaggingAllocator;

fn offset(layout: Layout) -> usize {
    layout.align().max(HEADER)
}

fn account(tag: u8, delta: i64) {
    if tag != 0 {
        let _ = LIVE.try_with(|l| {
            let c = &l[tag as usize % MAX_TAGS];
            c.set(c.get().wrapping_add(delta));
        });
    }
}

// SAFETY: every block handed out is `offset` bytes into a System block of size + offset with the
// same alignment, and the header before it holds the tag and size written here; dealloc undoes
// exactly that with the same layout.
unsafe impl GlobalAlloc for TaggingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let off = offset(layout);
        let Ok(outer) = Layout::from_size_align(layout.size() + off, layout.align().max(HEADER)) else {
            return std::ptr::null_mut();
        };
        let base = System.alloc(outer);
        if base.is_null() {
            return base;
        }
        let tag = TAG.try_with(Cell::get).unwrap_or(0);
        let user = base.add(off);
        user.sub(HEADER).write(tag);
        account(tag, layout.size() as i64);
        user
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let off = offset(layout);
        let tag = ptr.sub(HEADER).read();
        account(tag, -(layout.size() as i64));
        let outer = Layout::from_size_align_unchecked(layout.size() + off, layout.align().max(HEADER));
        System.dealloc(ptr.sub(off), outer);
    }
}

/// Makes allocations of this thread count for node `tag` until the guard drops.
pub fn enter(tag: usize) -> TagGuard {
    let previous = TAG.with(|t| t.replace((tag % MAX_TAGS) as u8));
    TagGuard { previous }
}

/// Runs `f` with nothing counted (the checker's own allocations inside node code).
pub fn untagged<T>(f: impl FnOnce() -> T) -> T {
    let _g = enter(0);
    f()
}

pub struct TagGuard {
    previous: u8,
}

impl Drop for TagGuard {
    fn drop(&mut self) {
        TAG.with(|t| t.set(self.previous));
    }
}

/// Live heap bytes of node `tag`'s allocations on this thread.
pub fn live_bytes(tag: usize) -> u64 {
    LIVE.with(|l| l[tag % MAX_TAGS].get().max(0) as u64)
}

/// Forgets node `tag`'s figure (a restarted node starts from nothing; its old blocks are gone).
pub fn reset(tag: usize) {
    LIVE.with(|l| l[tag % MAX_TAGS].set(0));
}
