//! The metadata blocks of jemalloc's boot base, found in memory so that they count as the
//! allocator's. jemalloc keeps its own bookkeeping (extent records, the radix tree that maps
//! addresses to extents) in "base" blocks. Every arena's base maps its blocks through the arena's
//! extent hooks, which `crate::extents` records, except the first base (`b0`, arena 0's and the
//! radix tree's): it is made at jemalloc's boot, before any hook can be set, and maps every later
//! block of its own with `mmap` directly. Under a cache that churns at its bound the radix tree and
//! the extent records grow (the allocator's address space spreads), a page at a time in those
//! blocks: measured in `prefill-only` with the `bounded-cache` plant, a 6 MiB block mapped after
//! the hooks went in gained a page every 20 iterations, and `proc.anon_outside_heap` and
//! `proc.pte` failed in 4 KiB steps as "mappings made outside the allocator" in 2 of 10 runs (the
//! others placed the block where the kernel merged it differently, or not at all).
//!
//! How a block is known (jemalloc 5's `base_block_t`, whose first two words are the block's size
//! and the block made before it): a block starts on a 2 MiB boundary ([`BLOCK_ALIGN`]; blocks are
//! that aligned and sized in multiples of it when metadata huge pages are off, the default), its
//! first word is a whole number of such units that fits in the mapping, and its second word is
//! the start of a block already known. The chain's end is the block that holds `b0` itself
//! (`b0get()`, the base's header lives in its first block). A mapping of the program's own passes
//! that test only if its first two words happen to be a block size and the exact address of one
//! of jemalloc's blocks. A block the test misses stays outside the heap: a false alarm is possible,
//! a hidden leak is not.
//!
//! Lifecycle: [`find`] runs with each measurement of memory outside the allocator, over the gaps
//! left outside the recorded ranges; each block it finds is recorded by the caller and so is never
//! a gap again. It reads only pages the page map says are present (reading an absent page would
//! map it), through /proc/self/mem, which answers an error rather than a fault for an address
//! unmapped in between.

use std::os::unix::fs::FileExt;
use std::sync::Mutex;

/// Alignment and size unit of a base block: jemalloc's `BASE_BLOCK_MIN_ALIGN`, 2 MiB.
pub const BLOCK_ALIGN: usize = 2 << 20;

/// Blocks remembered at most. A base's blocks grow geometrically (each at least the next page-size
/// class), so a process maps a few dozen in its life; past this, blocks stop being found (and
/// count outside the heap), never wrongly.
const MAX_BLOCKS: usize = 256;

extern "C" {
    /// jemalloc's boot base (a pointer inside its first block), from the static library that
    /// tikv-jemalloc-sys links; internal, with the prefix that crate builds jemalloc with.
    #[link_name = "_rjem_je_b0get"]
    fn b0get() -> *mut std::ffi::c_void;
}

/// Starts of the blocks known to be the boot base's.
static KNOWN: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// Page-map bit: the page is present.
const PRESENT: u64 = 1 << 63;

/// Whether the base's block layout is the one this module reads: jemalloc 5.
fn layout_known() -> bool {
    tikv_jemalloc_ctl::version::read().is_ok_and(|v| v.starts_with("5."))
}

/// The boot base's blocks among `gaps` (sorted, disjoint address ranges outside what the
/// allocator's hooks recorded, within private anonymous mappings), as (start, end). `pagemap` and
/// `mem` are this process's /proc/self/pagemap and /proc/self/mem; `page` its page size.
pub fn find(gaps: &[(usize, usize)], pagemap: &std::fs::File, mem: &std::fs::File, page: usize) -> Vec<(usize, usize)> {
    if !layout_known() {
        return Vec::new();
    }
    let mut known = KNOWN.lock().unwrap_or_else(|p| p.into_inner());
    if known.is_empty() {
        // SAFETY: b0get only returns jemalloc's static pointer to its boot base; jemalloc is
        // initialised (this process has allocated before any probe runs).
        let b0 = unsafe { b0get() } as usize;
        if b0 == 0 {
            return Vec::new();
        }
        known.push(b0 - b0 % BLOCK_ALIGN);
    }
    // Candidates: block boundaries inside a gap whose first page is present, with their header.
    let mut candidates: Vec<(usize, usize, usize)> = Vec::new();
    for &(lo, hi) in gaps {
        let mut at = lo.next_multiple_of(BLOCK_ALIGN);
        while at + BLOCK_ALIGN <= hi {
            if !known.contains(&at) && present(pagemap, at, page) {
                if let Some((size, next)) = header(mem, at) {
                    if size > 0 && size % BLOCK_ALIGN == 0 && size <= hi - at {
                        candidates.push((at, size, next));
                    }
                }
            }
            at += BLOCK_ALIGN;
        }
    }
    // Follow the chain: a candidate joins once the block it names is known (newer blocks name
    // older ones, so each round adds at least one or ends the search).
    let mut found = Vec::new();
    let mut grew = true;
    while grew && known.len() < MAX_BLOCKS {
        grew = false;
        for &(at, size, next) in &candidates {
            if next != 0 && known.contains(&next) && !known.contains(&at) && known.len() < MAX_BLOCKS {
                known.push(at);
                found.push((at, at + size));
                grew = true;
            }
        }
    }
    found
}

/// Whether the page at `addr` is present, from the page map.
fn present(pagemap: &std::fs::File, addr: usize, page: usize) -> bool {
    let mut entry = [0u8; 8];
    pagemap.read_exact_at(&mut entry, (addr / page * 8) as u64).is_ok() && u64::from_le_bytes(entry) & PRESENT != 0
}

/// The first two words at `addr` (a base block's size and the block before it).
fn header(mem: &std::fs::File, addr: usize) -> Option<(usize, usize)> {
    let mut words = [0u8; 16];
    mem.read_exact_at(&mut words, addr as u64).ok()?;
    let size = usize::from_ne_bytes(words[..8].try_into().ok()?);
    let next = usize::from_ne_bytes(words[8..].try_into().ok()?);
    Some((size, next))
}

/// Maps `len` bytes of private anonymous memory for a test; the caller unmaps them.
#[cfg(test)]
pub fn map_anonymous(len: usize) -> *mut libc::c_void {
    // SAFETY: a fresh anonymous private mapping at an address the kernel picks.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "mapping {len} bytes");
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Maps three 2 MiB units by hand and writes a block header at the first boundary in them.
    fn headed_mapping(size: usize, next: impl Fn(usize) -> usize) -> (*mut libc::c_void, usize, usize) {
        let len = 3 * BLOCK_ALIGN;
        let p = map_anonymous(len);
        let start = (p as usize).next_multiple_of(BLOCK_ALIGN);
        // SAFETY: start and the two words after it lie inside the mapping (it spans 3 units).
        unsafe {
            *(start as *mut usize) = size;
            *((start + 8) as *mut usize) = next(start);
        }
        (p, len, start)
    }

    #[test]
    fn a_block_is_known_by_the_block_it_names_and_nothing_else_is() {
        let pagemap = std::fs::File::open("/proc/self/pagemap").unwrap();
        let mem = std::fs::File::open("/proc/self/mem").unwrap();
        // Headed like a block, but naming a block that is not jemalloc's: not taken.
        let (p, len, start) = headed_mapping(BLOCK_ALIGN, |start| start + BLOCK_ALIGN);
        let found = find(&[(p as usize, p as usize + len)], &pagemap, &mem, 4096);
        assert!(found.is_empty(), "a hand-made header taken for a block: {found:?}");
        // A size that is not whole units, naming the boot base's first block: not taken.
        // SAFETY: b0get returns jemalloc's static pointer.
        let first = unsafe { b0get() } as usize / BLOCK_ALIGN * BLOCK_ALIGN;
        // SAFETY: inside the mapping, as written by headed_mapping.
        unsafe {
            *(start as *mut usize) = BLOCK_ALIGN + 4096;
            *((start + 8) as *mut usize) = first;
        }
        assert!(find(&[(p as usize, p as usize + len)], &pagemap, &mem, 4096).is_empty());
        // Whole units, naming the first block: the shape of the boot base's next block, taken.
        // SAFETY: as above.
        unsafe { *(start as *mut usize) = BLOCK_ALIGN };
        let found = find(&[(p as usize, p as usize + len)], &pagemap, &mem, 4096);
        assert_eq!(found, vec![(start, start + BLOCK_ALIGN)]);
        // SAFETY: unmapping what headed_mapping mapped.
        unsafe { libc::munmap(p, len) };
    }
}
