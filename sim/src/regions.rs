//! A decode node's registered receive regions for KV pulls, modelled with the kernel's view of
//! them: the same registration cache as the soak's transport (`soak/pd/src/region.rs`), with
//! mappings as byte counts instead of real mmaps.
//!
//! Lifecycle: a pull takes a region before it is sent (the most recently released one, remapped to
//! the transfer's size when it differs, or a new mapping while under capacity; with every region in
//! use the pull waits) and gives it back when its KV arrives, fails or times out.
//!
//! `mapped_bytes` is the simulated kernel's view: every anonymous mapping alive. Registered bytes
//! are what the cache accounts for. They are equal unless a mapping escapes the cache: the
//! `pd-mmap-hook` injection re-creates the incident's memory hook, which keeps the old mapping
//! alive on every remap, so the kernel's view grows while the cache's stays flat.
//!
//! The cache's bytes are bounded: at most `capacity` regions, none larger than a whole KV pool
//! (`max_region_bytes`). Between those bounds they move with the sizes of recent transfers, a
//! level that wanders (the region reused is the one released last), so the samples declare the
//! limit as their bound (`limit_bytes`): the wander is judged as a fill under a fixed ceiling.

const PAGE: u64 = 4096;

/// The gauge that holds [`Regions::limit_bytes`]: the samples declare it the bound (`within`) of
/// the cache's registered bytes and of the kernel's view of its mappings.
pub const LIMIT_METRIC: &str = "engine.transport_region_limit_bytes";

#[derive(Debug)]
pub struct Regions {
    capacity: usize,
    /// No transfer is larger than this (a whole KV pool, page-rounded).
    max_region_bytes: u64,
    /// Size in bytes of each registered region.
    sizes: Vec<u64>,
    /// Indexes of free regions, most recently released last.
    free: Vec<usize>,
    mapped_bytes: u64,
    leak_on_remap: bool,
}

impl Regions {
    pub fn new(capacity: usize, max_region_bytes: u64, leak_on_remap: bool) -> Self {
        assert!(capacity > 0, "a registration cache holds at least one region");
        let max_region_bytes = max_region_bytes.max(1).div_ceil(PAGE) * PAGE;
        Regions { capacity, max_region_bytes, sizes: Vec::new(), free: Vec::new(), mapped_bytes: 0, leak_on_remap }
    }

    /// A region of at least `bytes`, or None while every region is in use.
    pub fn acquire(&mut self, bytes: u64) -> Option<usize> {
        let len = bytes.max(1).div_ceil(PAGE) * PAGE;
        assert!(len <= self.max_region_bytes, "a transfer of {bytes} bytes is larger than a whole KV pool");
        if let Some(idx) = self.free.pop() {
            let old = self.sizes[idx];
            if old != len {
                // mremap: the old mapping goes away, unless a hook keeps it.
                if !self.leak_on_remap {
                    self.mapped_bytes -= old;
                }
                self.mapped_bytes += len;
                self.sizes[idx] = len;
            }
            return Some(idx);
        }
        if self.sizes.len() == self.capacity {
            return None;
        }
        self.sizes.push(len);
        self.mapped_bytes += len;
        Some(self.sizes.len() - 1)
    }

    pub fn release(&mut self, idx: usize) {
        assert!(idx < self.sizes.len() && !self.free.contains(&idx), "region {idx} released twice");
        self.free.push(idx);
    }

    pub fn registered(&self) -> usize {
        self.sizes.len()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn in_use(&self) -> usize {
        self.sizes.len() - self.free.len()
    }

    /// The most the cache's regions can hold: every region at the largest transfer.
    pub fn limit_bytes(&self) -> u64 {
        self.capacity as u64 * self.max_region_bytes
    }

    pub fn registered_bytes(&self) -> u64 {
        self.sizes.iter().sum()
    }

    pub fn mapped_bytes(&self) -> u64 {
        self.mapped_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_is_bounded_and_its_mappings_are_accounted() {
        let mut r = Regions::new(2, 65_536, false);
        let a = r.acquire(10_000).unwrap();
        let b = r.acquire(5_000).unwrap();
        assert_eq!(r.acquire(1), None);
        r.release(a);
        let c = r.acquire(50_000).unwrap();
        assert_eq!(c, a);
        r.release(b);
        r.release(c);
        assert_eq!(r.in_use(), 0);
        assert_eq!(r.mapped_bytes(), r.registered_bytes());
        assert!(r.registered_bytes() <= r.limit_bytes());
    }

    #[test]
    fn the_hook_keeps_every_remapped_mapping() {
        let mut r = Regions::new(1, 81_920, true);
        for bytes in [8_000, 80_000, 8_000, 80_000] {
            let i = r.acquire(bytes).unwrap();
            r.release(i);
        }
        assert_eq!(r.registered_bytes(), 81_920);
        assert_eq!(r.mapped_bytes(), 8_192 + 81_920 + 8_192 + 81_920);
    }
}
