//! The harness's own allocations, kept apart from the engine's.
//!
//! The heap gauges are read in the process they judge, so whatever the harness allocates there
//! (the /proc text a probe reads, whose length moves with CPU ticks; the sample's maps; a timer
//! sample taken whenever the clock says; a progress line) lands in the same slabs as the engine's
//! and decides, by its timing and size, which pages the engine's next objects fill. Two runs of one
//! seed then differ in `jemalloc.active` by a few pages though they allocate the same bytes.
//!
//! Lifecycle: the driver opens a [`HarnessScope`] around everything it does between engine calls
//! (sampling, progress, judging mid-run). Inside a scope this thread's allocations and frees go to a
//! jemalloc arena of the harness's own, created at the first scope, past the thread cache (whose
//! cached objects belong to the engine's arena). Outside, allocation is jemalloc's usual path. The
//! samples report the heap less that arena ([`HarnessShare`]), so the gauges are the engine's and
//! the run's layout of its pages depends on the seed alone. What a scope allocates must be freed
//! inside a scope too: a harness object freed on the usual path would go into the thread cache and
//! serve the engine from the harness's arena.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicU32, Ordering};

use tikv_jemalloc_sys as sys;

thread_local! {
    /// Whether this thread is inside a [`HarnessScope`] (const-initialised, no destructor: safe to
    /// read from the allocator at any point of a thread's life).
    static IN_SCOPE: Cell<bool> = const { Cell::new(false) };
}

/// The harness arena's index plus one (0: not created yet).
static ARENA: AtomicU32 = AtomicU32::new(0);

/// The harness's global allocator: jemalloc, with the harness's scopes sent to their own arena.
/// A program installs it with [`install_harness_allocator!`]; a library never does.
pub struct Allocator;

/// jemalloc's configuration in the `plateau` binary (read at its first allocation): freed pages
/// stay with the allocator instead of going back to the kernel on a timer. Pages then go back
/// only when a sample purges them (`probes::Settle::Purge`), so what the kernel sees at a purged point
/// depends on the run's allocations alone, not on the wall clock, and the engine spends no time
/// in timed purges.
///
/// No thread cache (`tcache:false`): a thread cache is garbage-collected every so many bytes the
/// thread allocates, harness allocations included, so a timer sample taken whenever the clock says
/// moved the engine's cached objects back to their slabs at another point in each run, and three
/// runs of one seed differed in `jemalloc.active` by one to seven pages at most quiescent points.
/// Without it (and with the harness in its own arena, above) they agree to the page; a
/// 40-iteration `mixed` run took 5.0-5.6 s with it off and 5.2 s with it on. The `MALLOC_CONF`
/// environment variable still overrides each option it names.
///
/// No heap profiler: a judged run is not perturbed by one (the replay that records plateau's own
/// allocation sites turns it on through the environment, `MALLOC_CONF`).
pub const MALLOC_CONF: &std::ffi::CStr = c"dirty_decay_ms:-1,muzzy_decay_ms:-1,tcache:false";

/// A C string pointer that may live in a static (jemalloc's `malloc_conf`).
#[repr(transparent)]
pub struct ConfPtr(pub *const std::ffi::c_char);

// SAFETY: it points at a string literal, immutable for the program's life.
unsafe impl Sync for ConfPtr {}

/// Installs the harness's allocator in the program that invokes it (the `plateau` binary, the
/// harness's test and bench binaries): [`Allocator`] as the global allocator, jemalloc unprefixed
/// so that C libraries' malloc is counted too, and jemalloc's options
/// ([`MALLOC_CONF`]) in the `malloc_conf` symbol it reads at its first allocation.
/// Only a program decides its allocator: a library that linked one in would impose it on every
/// program using it.
#[macro_export]
macro_rules! install_harness_allocator {
    () => {
        #[global_allocator]
        static PLATEAU_GLOBAL: $crate::arena::Allocator = $crate::arena::Allocator;

        #[export_name = "malloc_conf"]
        pub static PLATEAU_JEMALLOC_CONF: $crate::arena::ConfPtr =
            $crate::arena::ConfPtr($crate::arena::MALLOC_CONF.as_ptr());
    };
}

/// The mallocx flags of a harness allocation, or None on the usual path.
#[inline]
fn harness_flags(layout: &Layout) -> Option<i32> {
    if !IN_SCOPE.try_with(Cell::get).unwrap_or(false) {
        return None;
    }
    let arena = ARENA.load(Ordering::Relaxed);
    if arena == 0 {
        return None;
    }
    Some(
        sys::MALLOCX_ARENA(arena as usize - 1)
            | sys::MALLOCX_TCACHE_NONE
            | sys::MALLOCX_LG_ALIGN(layout.align().trailing_zeros() as usize),
    )
}

// SAFETY: every path is jemalloc's own, with the layout's size and alignment; a pointer from
// either path may be freed by either (jemalloc finds an allocation's arena from its address).
unsafe impl GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match harness_flags(&layout) {
            Some(f) => unsafe { sys::mallocx(layout.size(), f).cast() },
            None => unsafe { tikv_jemallocator::Jemalloc.alloc(layout) },
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        match harness_flags(&layout) {
            Some(f) => unsafe { sys::mallocx(layout.size(), f | sys::MALLOCX_ZERO).cast() },
            None => unsafe { tikv_jemallocator::Jemalloc.alloc_zeroed(layout) },
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        match harness_flags(&layout) {
            Some(f) => unsafe { sys::sdallocx(ptr.cast(), layout.size(), f) },
            None => unsafe { tikv_jemallocator::Jemalloc.dealloc(ptr, layout) },
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        match harness_flags(&layout) {
            Some(f) => unsafe { sys::rallocx(ptr.cast(), new_size, f).cast() },
            None => unsafe { tikv_jemallocator::Jemalloc.realloc(ptr, layout, new_size) },
        }
    }
}

/// Creates the harness arena once; None if jemalloc refused (the usual path is then used for
/// everything, as before).
fn arena() -> Option<u32> {
    match ARENA.load(Ordering::Acquire) {
        0 => {}
        a => return Some(a - 1),
    }
    // The arena maps its extents through the same recording hooks as every other arena, so that
    // its pages are the allocator's too (crate::extents).
    let created = create_arena(crate::extents::hooks())?;
    match ARENA.compare_exchange(0, created + 1, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => Some(created),
        Err(other) => Some(other - 1),
    }
}

/// `arenas.create`, with `hooks` as the new arena's extent hooks when given.
fn create_arena(hooks: Option<*mut sys::extent_hooks_t>) -> Option<u32> {
    let mut index: u32 = 0;
    let mut len = std::mem::size_of::<u32>();
    let mut hooks_ptr = hooks.unwrap_or(std::ptr::null_mut());
    let (newp, newlen) = match hooks {
        Some(_) => {
            ((&mut hooks_ptr as *mut *mut sys::extent_hooks_t).cast(), std::mem::size_of::<*mut sys::extent_hooks_t>())
        }
        None => (std::ptr::null_mut(), 0),
    };
    // SAFETY: `arenas.create` is a documented mallctl: it writes the new index (unsigned) to oldp
    // and takes an optional extent_hooks_t * as newp, which points at a never-freed table.
    let rc =
        unsafe { sys::mallctl(c"arenas.create".as_ptr(), (&mut index as *mut u32).cast(), &mut len, newp, newlen) };
    (rc == 0).then_some(index)
}

/// While alive, this thread allocates in the harness arena, and jemalloc's heap profiler (where a
/// run switched it on: [`profile_outside_scopes`]) samples none of this thread's allocations, so
/// that a run's allocation sites are the engine's. Scopes nest.
pub struct HarnessScope {
    was_in: bool,
}

/// Whether heap profiling is on for the run, so that scopes switch it off for their thread.
static PROFILING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Heap profiling is on for this run: from now on a scope's allocations are not sampled.
pub fn profile_outside_scopes() {
    PROFILING.store(true, Ordering::Release);
}

/// Switches jemalloc's sampling of this thread's allocations on or off (profiling must be on).
fn thread_profiled(on: bool) {
    // SAFETY: `thread.prof.active` is a documented read-write bool mallctl.
    let _ = unsafe { tikv_jemalloc_ctl::raw::write::<bool>(b"thread.prof.active\0", on) };
}

impl HarnessScope {
    pub fn enter() -> HarnessScope {
        let _ = arena();
        let was_in = IN_SCOPE.with(|c| c.replace(true));
        if !was_in && PROFILING.load(Ordering::Acquire) {
            thread_profiled(false);
        }
        HarnessScope { was_in }
    }
}

impl Drop for HarnessScope {
    fn drop(&mut self) {
        IN_SCOPE.with(|c| c.set(self.was_in));
        if !self.was_in && PROFILING.load(Ordering::Acquire) {
            thread_profiled(true);
        }
    }
}

/// What the harness arena holds now, in the units of the jemalloc gauges: subtracted from the
/// process's figures, it leaves the engine's.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HarnessShare {
    pub allocated: f64,
    pub active: f64,
    pub resident: f64,
    pub mapped: f64,
    pub metadata: f64,
    pub retained: f64,
}

/// The harness arena's share, read after the caller advanced jemalloc's epoch; zero when there is
/// no harness arena (a process that never opened a scope).
pub fn harness_share() -> HarnessShare {
    let Some(a) = ARENA.load(Ordering::Acquire).checked_sub(1) else { return HarnessShare::default() };
    let read = |stat: &str| -> f64 {
        let name = format!("stats.arenas.{a}.{stat}\0");
        // SAFETY: documented read-only statistics of type size_t.
        unsafe { tikv_jemalloc_ctl::raw::read::<usize>(name.as_bytes()) }.map_or(0.0, |v| v as f64)
    };
    static PAGE: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    // SAFETY: a documented read-only mallctl of type size_t.
    let page = *PAGE.get_or_init(|| {
        unsafe { tikv_jemalloc_ctl::raw::read::<usize>(b"arenas.page\0") }.map_or(4096.0, |p| p as f64)
    });
    HarnessShare {
        allocated: read("small.allocated") + read("large.allocated"),
        active: read("pactive") * page,
        resident: read("resident"),
        mapped: read("mapped"),
        metadata: read("base") + read("internal"),
        retained: read("retained"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_allocates_in_the_harness_arena_and_its_frees_return_there() {
        let _ = tikv_jemalloc_ctl::epoch::advance();
        let before = {
            let _s = HarnessScope::enter();
            let _ = tikv_jemalloc_ctl::epoch::advance();
            harness_share()
        };
        let held = {
            let _s = HarnessScope::enter();
            let v: Vec<u8> = vec![7; 1 << 20];
            let _ = tikv_jemalloc_ctl::epoch::advance();
            let during = harness_share();
            assert!(during.allocated >= before.allocated + (1 << 20) as f64, "{during:?} vs {before:?}");
            drop(v);
            let _ = tikv_jemalloc_ctl::epoch::advance();
            harness_share()
        };
        assert!(held.allocated < before.allocated + 4096.0, "the scope's free went back: {held:?} vs {before:?}");
        // Outside a scope the harness arena is not used.
        let v: Vec<u8> = vec![7; 1 << 20];
        let _ = tikv_jemalloc_ctl::epoch::advance();
        let outside = harness_share();
        assert!(outside.allocated < before.allocated + 4096.0, "{outside:?}");
        drop(v);
    }
}
