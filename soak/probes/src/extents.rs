//! The address space jemalloc holds, as its extent hooks see it, so that anonymous memory the
//! allocator did not make (`proc.anon_outside_heap`) is measured exactly rather than as RssAnon
//! less jemalloc's `resident`. That difference was negative in every run (-2 MiB in a default
//! n-sampling run): `resident` counts whole pages of the allocator's metadata that were never
//! touched (a 2 MiB radix-tree leaf among them), and it moved with each purge of dirty pages.
//!
//! Lifecycle: [`install`] runs first thing in the `plateau` binary (and again, at no cost, when a
//! probe starts). It records every unnamed private anonymous mapping that exists at that moment as
//! the allocator's (jemalloc maps its first chunks and metadata before `main`; the loader's and
//! the runtime's few pages of the kind are taken with them, a constant), then sets, on every arena
//! jemalloc has or may create, hooks that call jemalloc's own defaults and record each range they
//! map (and forget each they destroy). [`outside_anon_bytes`] then counts, in /proc/self/pagemap,
//! the pages present or swapped in the private anonymous mappings outside those ranges: never
//! negative, exact to the page, and the same whether or not the allocator's dirty pages were just
//! purged. Deallocation stays opted out (jemalloc keeps what it maps, as `retain` does anyway), so
//! the recorded ranges only grow, and by a handful a run: jemalloc grows its mappings
//! geometrically.
//!
//! The hooks never allocate: the ranges live in a fixed table behind a lock that is never held
//! while anything allocates.

use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Mutex, Once};

use tikv_jemalloc_sys as sys;

/// Ranges recorded at most. jemalloc maps a few dozen ranges in a run (chunks that grow
/// geometrically, and base blocks); ranges that touch are merged. A table that fills up makes the
/// metric unavailable (left out of the samples), never wrong.
const MAX_RANGES: usize = 4096;

struct Table {
    len: usize,
    ranges: [(usize, usize); MAX_RANGES],
    overflowed: bool,
}

static TABLE: Mutex<Table> = Mutex::new(Table { len: 0, ranges: [(0, 0); MAX_RANGES], overflowed: false });

/// jemalloc's default hooks, which ours call.
static DEFAULT: AtomicPtr<sys::extent_hooks_t> = AtomicPtr::new(std::ptr::null_mut());

/// Our hooks (the defaults' with alloc and destroy recording, dalloc opted out), set once.
static HOOKS: AtomicPtr<sys::extent_hooks_t> = AtomicPtr::new(std::ptr::null_mut());

static INSTALL: Once = Once::new();

fn lock() -> std::sync::MutexGuard<'static, Table> {
    TABLE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Records `[start, end)`, merged with the ranges it touches.
fn record(start: usize, end: usize) {
    let mut t = lock();
    let n = t.len;
    for r in t.ranges[..n].iter_mut() {
        if start <= r.1 && r.0 <= end {
            r.0 = r.0.min(start);
            r.1 = r.1.max(end);
            return;
        }
    }
    if n == MAX_RANGES {
        t.overflowed = true;
        return;
    }
    t.ranges[n] = (start, end);
    t.len = n + 1;
}

/// Forgets `[start, end)` (a destroyed extent), splitting a range that holds it.
fn forget(start: usize, end: usize) {
    let mut t = lock();
    let mut i = 0;
    while i < t.len {
        let (a, b) = t.ranges[i];
        if end <= a || b <= start {
            i += 1;
            continue;
        }
        match (a < start, end < b) {
            (true, true) => {
                t.ranges[i] = (a, start);
                let n = t.len;
                if n == MAX_RANGES {
                    t.overflowed = true;
                    return;
                }
                t.ranges[n] = (end, b);
                t.len = n + 1;
                i += 1;
            }
            (true, false) => {
                t.ranges[i] = (a, start);
                i += 1;
            }
            (false, true) => {
                t.ranges[i] = (end, b);
                i += 1;
            }
            (false, false) => {
                let last = t.len - 1;
                t.ranges[i] = t.ranges[last];
                t.len = last;
            }
        }
    }
}

unsafe extern "C" fn alloc_hook(
    _hooks: *mut sys::extent_hooks_t,
    new_addr: *mut std::ffi::c_void,
    size: usize,
    alignment: usize,
    zero: *mut bool,
    commit: *mut bool,
    arena: std::ffi::c_uint,
) -> *mut std::ffi::c_void {
    let default = DEFAULT.load(Ordering::Acquire);
    // SAFETY: the default hooks are jemalloc's static table, read before ours were installed;
    // their alloc takes the same arguments (the hooks pointer is not used by it).
    let p = unsafe {
        match (*default).alloc {
            Some(f) => f(default, new_addr, size, alignment, zero, commit, arena),
            None => std::ptr::null_mut(),
        }
    };
    if !p.is_null() {
        record(p as usize, p as usize + size);
    }
    p
}

unsafe extern "C" fn destroy_hook(
    _hooks: *mut sys::extent_hooks_t,
    addr: *mut std::ffi::c_void,
    size: usize,
    committed: bool,
    arena: std::ffi::c_uint,
) {
    let default = DEFAULT.load(Ordering::Acquire);
    // SAFETY: as in `alloc_hook`.
    unsafe {
        if let Some(f) = (*default).destroy {
            f(default, addr, size, committed, arena);
        }
    }
    forget(addr as usize, addr as usize + size);
}

/// Private anonymous mappings of this process now, as (start, end): [heap], [stack], thread
/// stacks, unnamed and `[anon:NAME]` mappings, or (`unnamed_only`) the unnamed ones alone, the
/// kind jemalloc makes. Shared anonymous memory is shmem, counted apart.
fn private_anonymous(unnamed_only: bool) -> Vec<(usize, usize)> {
    let Ok(maps) = procfs::process::Process::myself().and_then(|p| p.maps()) else { return Vec::new() };
    use procfs::process::{MMPermissions, MMapPath};
    maps.into_iter()
        .filter(|m| !m.perms.contains(MMPermissions::SHARED))
        .filter(|m| match &m.pathname {
            MMapPath::Anonymous => true,
            MMapPath::Heap | MMapPath::Stack | MMapPath::TStack(_) => !unnamed_only,
            MMapPath::Other(o) => !unnamed_only && o.starts_with("anon:"),
            _ => false,
        })
        .map(|m| (m.address.0 as usize, m.address.1 as usize))
        .collect()
}

/// Takes over jemalloc's extent hooks on every arena (see the module's lifecycle). Runs once;
/// false when jemalloc refused (the metric is then left out of the samples).
pub fn install() -> bool {
    INSTALL.call_once(|| {
        // Read the defaults first: arena 0 always exists.
        // SAFETY: `arena.0.extent_hooks` is a documented read-write mallctl of type
        // extent_hooks_t *; reading it returns jemalloc's static default table.
        let default: *mut sys::extent_hooks_t = match unsafe { tikv_jemalloc_ctl::raw::read(b"arena.0.extent_hooks\0") }
        {
            Ok(p) => p,
            Err(_) => return,
        };
        if default.is_null() {
            return;
        }
        DEFAULT.store(default, Ordering::Release);
        // SAFETY: the default table is jemalloc's static, valid for the process's life.
        let mut ours = unsafe { *default };
        ours.alloc = Some(alloc_hook);
        ours.destroy = Some(destroy_hook);
        // Opted out, as jemalloc's `retain` (the default on 64-bit Linux) opts out: what it maps
        // stays mapped, so no recorded range is ever unmapped behind the table's back.
        ours.dalloc = None;
        let hooks: &'static mut sys::extent_hooks_t = Box::leak(Box::new(ours));
        HOOKS.store(hooks, Ordering::Release);
        // What exists now is the allocator's (before any of the program's own mappings).
        let existing = private_anonymous(true);
        for &(a, b) in &existing {
            record(a, b);
        }
        // Learn the boot base's blocks mapped so far, so that those it maps later are known by
        // the block they name (see crate::base_blocks).
        if let (Ok(pagemap), Ok(mem)) =
            (std::fs::File::open("/proc/self/pagemap"), std::fs::File::open("/proc/self/mem"))
        {
            crate::base_blocks::find(&existing, &pagemap, &mem, page_size());
        }
        // SAFETY: a documented read-only mallctl of type unsigned.
        let narenas: u32 = unsafe { tikv_jemalloc_ctl::raw::read(b"arenas.narenas\0") }.unwrap_or(1);
        for i in 0..narenas {
            let name = format!("arena.{i}.extent_hooks\0");
            let ptr: *mut sys::extent_hooks_t = hooks;
            // SAFETY: writing a valid, never-freed extent_hooks_t * to a documented mallctl; for
            // an arena not yet made, jemalloc makes it with these hooks.
            let _ = unsafe { tikv_jemalloc_ctl::raw::write(name.as_bytes(), ptr) };
        }
    });
    !HOOKS.load(Ordering::Acquire).is_null()
}

/// The hooks to create a new arena with (`arenas.create`), once installed.
pub fn hooks() -> Option<*mut sys::extent_hooks_t> {
    let h = HOOKS.load(Ordering::Acquire);
    (!h.is_null()).then_some(h)
}

/// Page-map bits (Documentation/admin-guide/mm/pagemap.rst): present, swapped, and mapped by this
/// process alone (a page shared with another, such as the zero page read before any write, is
/// not memory this process took).
const PRESENT: u64 = 1 << 63;
const SWAPPED: u64 = 1 << 62;
const EXCLUSIVE: u64 = 1 << 56;

/// The bytes of this process's private anonymous memory outside the ranges jemalloc mapped:
/// resident pages mapped by it alone, and swapped ones. None when the hooks are not installed,
/// the table overflowed, or /proc/self/pagemap cannot be read.
pub fn outside_anon_bytes() -> Option<f64> {
    if HOOKS.load(Ordering::Acquire).is_null() {
        return None;
    }
    // Room for the copy before the lock: nothing may allocate while it is held, since an
    // allocation can map a new extent and call the hook, which takes the same lock.
    let mut allocator = Vec::with_capacity(MAX_RANGES);
    {
        let t = lock();
        if t.overflowed {
            return None;
        }
        allocator.extend_from_slice(&t.ranges[..t.len]);
    }
    allocator.sort_unstable();
    let page = page_size();
    let pagemap = std::fs::File::open("/proc/self/pagemap").ok()?;
    let mut gaps: Vec<(usize, usize)> =
        private_anonymous(false).into_iter().flat_map(|m| subtract(m, &allocator)).collect();
    // The boot base's metadata blocks, mapped without the hooks, are the allocator's too.
    if let Ok(mem) = std::fs::File::open("/proc/self/mem") {
        let mut blocks = crate::base_blocks::find(&gaps, &pagemap, &mem, page);
        blocks.sort_unstable();
        for &(lo, hi) in &blocks {
            record(lo, hi);
        }
        gaps = gaps.into_iter().flat_map(|g| subtract(g, &blocks)).collect();
    }
    let mut pages = 0u64;
    let mut buf = Vec::new();
    for (lo, hi) in gaps {
        pages += count_pages(&pagemap, lo, hi, page, &mut buf)?;
    }
    Some((pages * page as u64) as f64)
}

/// The address ranges the allocator mapped (its extents and the anonymous mappings that existed
/// when the hooks went in), sorted; empty when the hooks are not installed or the table overflowed.
pub fn allocator_ranges() -> Vec<(usize, usize)> {
    if HOOKS.load(Ordering::Acquire).is_null() {
        return Vec::new();
    }
    // Room before the lock, as in `outside_anon_bytes`.
    let mut ranges = Vec::with_capacity(MAX_RANGES);
    {
        let t = lock();
        if t.overflowed {
            return Vec::new();
        }
        ranges.extend_from_slice(&t.ranges[..t.len]);
    }
    ranges.sort_unstable();
    ranges
}

/// `[a, b)` less the sorted ranges `minus`.
fn subtract((a, b): (usize, usize), minus: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut at = a;
    for &(lo, hi) in minus.iter().filter(|r| r.1 > a && r.0 < b) {
        if lo > at {
            out.push((at, lo.min(b)));
        }
        at = at.max(hi);
        if at >= b {
            break;
        }
    }
    if at < b {
        out.push((at, b));
    }
    out
}

/// Pages of `[lo, hi)` present and exclusive, or swapped, read from the page map in chunks.
fn count_pages(pagemap: &std::fs::File, lo: usize, hi: usize, page: usize, buf: &mut Vec<u8>) -> Option<u64> {
    const CHUNK_PAGES: usize = 8192;
    let mut count = 0;
    let mut first = lo / page;
    let last = hi.div_ceil(page);
    while first < last {
        let n = (last - first).min(CHUNK_PAGES);
        buf.resize(n * 8, 0);
        pagemap.read_exact_at(buf, (first * 8) as u64).ok()?;
        count += buf
            .chunks_exact(8)
            .map(|e| u64::from_le_bytes(e.try_into().expect("8 bytes")))
            .filter(|e| (e & PRESENT != 0 && e & EXCLUSIVE != 0) || e & SWAPPED != 0)
            .count() as u64;
        first += n;
    }
    Some(count)
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subtracting_ranges_leaves_the_gaps() {
        assert_eq!(subtract((0, 100), &[(10, 20), (30, 40)]), vec![(0, 10), (20, 30), (40, 100)]);
        assert_eq!(subtract((0, 100), &[(0, 100)]), vec![]);
        assert_eq!(subtract((50, 100), &[(0, 60), (90, 200)]), vec![(60, 90)]);
        assert_eq!(subtract((50, 100), &[]), vec![(50, 100)]);
    }

    #[test]
    fn memory_mapped_outside_the_allocator_is_counted_to_the_page_and_the_heap_is_not() {
        assert!(install(), "the hooks install");
        let before = outside_anon_bytes().expect("measured");
        // 64 pages of the heap, touched: the allocator's, not counted.
        let heap: Vec<u8> = vec![1; 64 * 4096];
        let with_heap = outside_anon_bytes().expect("measured");
        assert!(with_heap - before < 16.0 * 4096.0, "the heap's pages counted outside: {before} -> {with_heap}");
        // 64 pages mapped by hand and touched: counted, all of them.
        let len = 64 * page_size();
        let p = crate::base_blocks::map_anonymous(len);
        unsafe { std::ptr::write_bytes(p.cast::<u8>(), 7, len) };
        let with_map = outside_anon_bytes().expect("measured");
        let grew = with_map - with_heap;
        assert!((grew - len as f64).abs() < 8.0 * 4096.0, "mapped {len} bytes, outside grew {grew}");
        unsafe { libc::munmap(p, len) };
        drop(heap);
    }
}
