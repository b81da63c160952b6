//! Registered memory regions for KV transfer: anonymous mappings (mmap, resized with mremap)
//! outside the allocator, named `[anon:plateau-kv-transfer]` in /proc/<pid>/maps where the kernel
//! allows it, kept in a registration cache of bounded size, the way communication libraries
//! (UCX under NIXL) register the buffers they send from and receive into.
//!
//! Lifecycle: `acquire` hands out the most recently released region, resizing it to the transfer
//! with mremap (grow or shrink), or maps a new one while under capacity (the cache never holds more
//! than `capacity` regions: a transfer that finds all of them in use waits); `release` returns a
//! region to the cache.
//!
//! The `pd-mmap-hook` injection re-creates the incident: a memory hook on remapping keeps the old
//! mapping alive, so every resize leaves an anonymous mapping behind that no allocator and no
//! registry of ours sees; only the kernel's view of the process does.

use std::ptr;

/// The name the kernel shows for our mappings.
pub const MAPPING_NAME: &str = "plateau-kv-transfer";

const PAGE: usize = 4096;

/// A mapping of ours, recorded in [`crate::mappings`] with the line that mapped it while it is
/// mapped, so that a snapshot of the process's memory map can say which lines made what grew.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a mapping is plain memory owned by one RegionCache; nothing aliases it across threads.
unsafe impl Send for Mapping {}

impl Mapping {
    #[track_caller]
    fn map(len: usize) -> Result<Mapping, String> {
        // SAFETY: anonymous private mapping of a page-rounded, non-zero length.
        let p = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!("mmap of {len} bytes failed: {}", std::io::Error::last_os_error()));
        }
        let m = Mapping { ptr: p.cast(), len };
        m.name();
        plateau_probes::mappings::record(p as u64, len as u64, std::panic::Location::caller());
        Ok(m)
    }

    /// Names the mapping (Linux 5.17+ with CONFIG_ANON_VMA_NAME); silently unnamed elsewhere.
    fn name(&self) {
        const PR_SET_VMA: libc::c_int = 0x5356_4d41;
        const PR_SET_VMA_ANON_NAME: libc::c_ulong = 0;
        let name = std::ffi::CString::new(MAPPING_NAME).expect("no NUL");
        // SAFETY: prctl reads the name and the range; a kernel without support returns EINVAL.
        unsafe {
            libc::prctl(
                PR_SET_VMA,
                PR_SET_VMA_ANON_NAME,
                self.ptr as libc::c_ulong,
                self.len as libc::c_ulong,
                name.as_ptr(),
            );
        }
    }

    #[track_caller]
    fn remap(&mut self, len: usize) -> Result<(), String> {
        // SAFETY: resizing our own mapping; MREMAP_MAYMOVE lets the kernel move it.
        let p = unsafe { libc::mremap(self.ptr.cast(), self.len, len, libc::MREMAP_MAYMOVE) };
        if p == libc::MAP_FAILED {
            return Err(format!("mremap to {len} bytes failed: {}", std::io::Error::last_os_error()));
        }
        plateau_probes::mappings::forget(self.ptr as u64);
        self.ptr = p.cast();
        self.len = len;
        self.name();
        plateau_probes::mappings::record(p as u64, len as u64, std::panic::Location::caller());
        Ok(())
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is `len` readable and writable bytes, owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping exactly once.
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
        }
        plateau_probes::mappings::forget(self.ptr as u64);
    }
}

struct Region {
    map: Mapping,
    in_use: bool,
    last_used: u64,
}

pub struct RegionCache {
    regions: Vec<Region>,
    /// Regions held at most (in use and free together).
    capacity: usize,
    tick: u64,
    /// `pd-mmap-hook`: old mappings the hook kept alive on every remap. Not counted anywhere.
    hooked: Vec<Mapping>,
    leak_on_remap: bool,
}

fn round_up(len: usize) -> usize {
    len.max(1).div_ceil(PAGE) * PAGE
}

impl RegionCache {
    pub fn new(capacity: usize, leak_on_remap: bool) -> Self {
        assert!(capacity > 0);
        RegionCache { regions: Vec::new(), capacity, tick: 0, hooked: Vec::new(), leak_on_remap }
    }

    /// Regions in the cache (in use or free).
    pub fn len(&self) -> usize {
        self.regions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.regions.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn in_use(&self) -> usize {
        self.regions.iter().filter(|r| r.in_use).count()
    }

    /// Bytes mapped by the cache's regions (what our own registry accounts for).
    pub fn bytes(&self) -> usize {
        self.regions.iter().map(|r| r.map.len).sum()
    }

    /// A region of at least `len` bytes, or None when every region is in use and the cache full.
    pub fn acquire(&mut self, len: usize) -> Result<Option<usize>, String> {
        let want = round_up(len);
        self.tick += 1;
        let mru_free =
            (0..self.regions.len()).filter(|&i| !self.regions[i].in_use).max_by_key(|&i| self.regions[i].last_used);
        let idx = match mru_free {
            Some(i) => {
                let cur = self.regions[i].map.len;
                // Resize to fit: grow when too small, trim when more than twice too big.
                if cur < want || cur > 2 * want {
                    self.resize(i, want)?;
                }
                i
            }
            None if self.regions.len() < self.capacity => {
                self.regions.push(Region { map: Mapping::map(want)?, in_use: false, last_used: 0 });
                self.regions.len() - 1
            }
            None => return Ok(None),
        };
        let r = &mut self.regions[idx];
        r.in_use = true;
        r.last_used = self.tick;
        Ok(Some(idx))
    }

    fn resize(&mut self, i: usize, want: usize) -> Result<(), String> {
        if self.leak_on_remap {
            // The hook's bug: the remapped-away range stays mapped, still "registered".
            let mut new = Mapping::map(want)?;
            let keep = want.min(self.regions[i].map.len);
            new.bytes_mut()[..keep].copy_from_slice(&self.regions[i].map.bytes_mut()[..keep]);
            let old = std::mem::replace(&mut self.regions[i].map, new);
            self.hooked.push(old);
            Ok(())
        } else {
            self.regions[i].map.remap(want)
        }
    }

    pub fn bytes_mut(&mut self, idx: usize) -> &mut [u8] {
        self.regions[idx].map.bytes_mut()
    }

    /// Returns a region to the cache.
    pub fn release(&mut self, idx: usize) {
        self.regions[idx].in_use = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_are_reused_resized_and_bounded() {
        let mut c = RegionCache::new(2, false);
        let a = c.acquire(10_000).unwrap().unwrap();
        c.bytes_mut(a)[..4].copy_from_slice(b"kv!!");
        let b = c.acquire(5_000).unwrap().unwrap();
        assert_ne!(a, b);
        assert_eq!(c.acquire(1).unwrap(), None, "full: every region in use");
        c.release(a);
        let again = c.acquire(40_000).unwrap().unwrap();
        assert_eq!(again, a);
        assert_eq!(&c.bytes_mut(again)[..4], b"kv!!", "mremap keeps the contents");
        assert!(c.bytes_mut(again).len() >= 40_000);
        assert_eq!(c.len(), 2);
        assert!(c.hooked.is_empty());
    }

    #[test]
    fn the_hook_leaks_a_mapping_per_remap() {
        let mut c = RegionCache::new(1, true);
        let a = c.acquire(4096).unwrap().unwrap();
        c.release(a);
        c.acquire(64 * 4096).unwrap();
        assert_eq!(c.hooked.len(), 1);
        assert_eq!(c.len(), 1, "our own registry still counts one region");
    }
}
