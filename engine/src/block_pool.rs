//! The paged KV block pool: a fixed array of blocks, a free list that is also the LRU of cached
//! blocks, reference counts, and the prefix-cache index from block hash to block.
//!
//! Lifecycle of a block:
//! - *free*: reference count 0, linked in the free list. If it carries a hash it is also *cached*:
//!   its contents are still valid and a later request with the same prefix can take it back.
//! - *in use*: reference count >= 1, unlinked from the free list. Sequences that share a prefix (n>1
//!   siblings, prefix-cache hits) hold one reference each.
//! - Freed blocks go to the tail when they carry a hash (kept longest) and to the head when they do
//!   not (reused first). Allocation pops the head; a cached block popped there is evicted: its hash
//!   leaves the index.
//!
//! The free list is threaded through the block array by index (`prev`/`next`), so no operation
//! allocates. Accounting always holds: free (uncached) + cached + in use = total.

use crate::registry::{MetricKind, Registries, TrackedMap};

pub use plateau_model::BlockId;
/// A chained content hash of one full block (parent hash, tokens, extra keys).
pub type BlockHash = u64;

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone)]
struct Block {
    ref_count: u32,
    hash: Option<BlockHash>,
    prev: u32,
    next: u32,
    linked: bool,
}

/// Counts of the pool's blocks by state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolCounts {
    pub total: usize,
    /// Free and carrying no hash.
    pub free: usize,
    /// Free but carrying a hash (evictable prefix-cache content).
    pub cached: usize,
    /// Reference count >= 1.
    pub used: usize,
}

impl PoolCounts {
    pub fn adds_up(&self) -> bool {
        self.free + self.cached + self.used == self.total
    }
}

#[derive(Debug)]
pub struct BlockPool {
    blocks: Vec<Block>,
    head: u32,
    tail: u32,
    linked_len: usize,
    cached_free: usize,
    /// Prefix-cache index: hash of a full block to the block holding it (free or in use).
    index: TrackedMap<BlockHash, BlockId>,
}

impl BlockPool {
    pub fn new(num_blocks: usize, book: &mut Registries) -> Self {
        assert!(num_blocks > 0 && num_blocks < NIL as usize);
        let mut pool = BlockPool {
            blocks: vec![Block { ref_count: 0, hash: None, prev: NIL, next: NIL, linked: false }; num_blocks],
            head: NIL,
            tail: NIL,
            linked_len: 0,
            cached_free: 0,
            index: book.map("registry.prefix_cache.entries", MetricKind::Bounded { capacity: num_blocks as u64 }),
        };
        for id in 0..num_blocks as u32 {
            pool.link_tail(id);
        }
        pool
    }

    pub fn total(&self) -> usize {
        self.blocks.len()
    }

    pub fn counts(&self) -> PoolCounts {
        let free_all = self.linked_len;
        PoolCounts {
            total: self.blocks.len(),
            free: free_all - self.cached_free,
            cached: self.cached_free,
            used: self.blocks.len() - free_all,
        }
    }

    /// Blocks that an allocation could take now (free or evictable).
    pub fn num_available(&self) -> usize {
        self.linked_len
    }

    pub fn ref_count(&self, id: BlockId) -> u32 {
        self.blocks[id as usize].ref_count
    }

    pub fn hash_of(&self, id: BlockId) -> Option<BlockHash> {
        self.blocks[id as usize].hash
    }

    fn link_tail(&mut self, id: u32) {
        let b = &mut self.blocks[id as usize];
        debug_assert!(!b.linked);
        b.prev = self.tail;
        b.next = NIL;
        b.linked = true;
        if self.tail == NIL {
            self.head = id;
        } else {
            self.blocks[self.tail as usize].next = id;
        }
        self.tail = id;
        self.linked_len += 1;
    }

    fn link_head(&mut self, id: u32) {
        let b = &mut self.blocks[id as usize];
        debug_assert!(!b.linked);
        b.prev = NIL;
        b.next = self.head;
        b.linked = true;
        if self.head == NIL {
            self.tail = id;
        } else {
            self.blocks[self.head as usize].prev = id;
        }
        self.head = id;
        self.linked_len += 1;
    }

    fn unlink(&mut self, id: u32) {
        let (prev, next) = {
            let b = &self.blocks[id as usize];
            assert!(b.linked, "block {id} unlinked twice");
            (b.prev, b.next)
        };
        if prev == NIL {
            self.head = next;
        } else {
            self.blocks[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.blocks[next as usize].prev = prev;
        }
        let b = &mut self.blocks[id as usize];
        b.linked = false;
        b.prev = NIL;
        b.next = NIL;
        self.linked_len -= 1;
        if b.hash.is_some() {
            self.cached_free -= 1;
        }
    }

    /// Takes the least recently freed block, evicting its cached content. None when exhausted.
    pub fn allocate(&mut self) -> Option<BlockId> {
        let id = self.head;
        if id == NIL {
            return None;
        }
        self.unlink(id);
        if let Some(h) = self.blocks[id as usize].hash.take() {
            if self.index.get(&h) == Some(&id) {
                self.index.remove(&h);
            }
        }
        let b = &mut self.blocks[id as usize];
        assert_eq!(b.ref_count, 0);
        b.ref_count = 1;
        Some(id)
    }

    /// Adds a reference (a sibling sharing the block, or a prefix-cache hit reviving a free block).
    pub fn incref(&mut self, id: BlockId) {
        if self.blocks[id as usize].ref_count == 0 {
            self.unlink(id);
        }
        self.blocks[id as usize].ref_count += 1;
    }

    /// Drops a reference; at zero the block returns to the free list (tail if cached, else head).
    pub fn decref(&mut self, id: BlockId) {
        let b = &mut self.blocks[id as usize];
        assert!(b.ref_count > 0, "block {id} freed while free");
        b.ref_count -= 1;
        if b.ref_count == 0 {
            if b.hash.is_some() {
                self.link_tail(id);
                self.cached_free += 1;
            } else {
                self.link_head(id);
            }
        }
    }

    /// The block holding `hash`, if the prefix cache has it.
    pub fn lookup(&self, hash: BlockHash) -> Option<BlockId> {
        self.index.get(&hash).copied()
    }

    /// Marks an in-use, now full block as holding `hash`. If another block already holds the same
    /// content, the index keeps that one and this block stays unhashed.
    pub fn publish(&mut self, id: BlockId, hash: BlockHash) {
        let b = &self.blocks[id as usize];
        assert!(b.ref_count > 0, "publishing free block {id}");
        if b.hash.is_some() || self.index.contains_key(&hash) {
            return;
        }
        self.blocks[id as usize].hash = Some(hash);
        self.index.insert(hash, id);
    }

    /// Forgets the cached content of every free block (after sleep or a weight update the cached
    /// KV is stale). Blocks in use keep theirs: their owners still read them.
    pub fn reset_prefix_cache(&mut self) {
        for id in 0..self.blocks.len() {
            let b = &mut self.blocks[id];
            if b.linked {
                if let Some(h) = b.hash.take() {
                    self.index.remove(&h);
                    self.cached_free -= 1;
                }
            }
        }
        debug_assert_eq!(self.cached_free, 0);
    }

    /// Full consistency check, for tests and `check_idle`: returns the first broken invariant.
    pub fn check(&self) -> Result<(), String> {
        let mut linked = 0usize;
        let mut cur = self.head;
        let mut prev = NIL;
        let mut steps = 0usize;
        while cur != NIL {
            steps += 1;
            if steps > self.blocks.len() {
                return Err("free list has a cycle".into());
            }
            let b = &self.blocks[cur as usize];
            if !b.linked || b.ref_count != 0 || b.prev != prev {
                return Err(format!("block {cur} in the free list is inconsistent (ref {})", b.ref_count));
            }
            linked += 1;
            prev = cur;
            cur = b.next;
        }
        if linked != self.linked_len || prev != self.tail {
            return Err(format!("free list length {linked} != recorded {}", self.linked_len));
        }
        for (i, b) in self.blocks.iter().enumerate() {
            if b.linked == (b.ref_count > 0) {
                return Err(format!("block {i} is both free and in use (ref {})", b.ref_count));
            }
            if let Some(h) = b.hash {
                if self.index.get(&h) != Some(&(i as u32)) {
                    return Err(format!("block {i} carries a hash the index does not map to it"));
                }
            }
        }
        let cached = self.blocks.iter().filter(|b| b.linked && b.hash.is_some()).count();
        if cached != self.cached_free {
            return Err(format!("cached count {cached} != recorded {}", self.cached_free));
        }
        if self.index.len() != self.blocks.iter().filter(|b| b.hash.is_some()).count() {
            return Err("prefix index holds hashes of no block".into());
        }
        if !self.counts().adds_up() {
            return Err(format!("accounting: {:?}", self.counts()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(n: usize) -> BlockPool {
        BlockPool::new(n, &mut Registries::new())
    }

    #[test]
    fn allocate_until_exhausted_then_free() {
        let mut p = pool(3);
        let ids: Vec<_> = (0..3).map(|_| p.allocate().unwrap()).collect();
        assert_eq!(p.allocate(), None);
        assert_eq!(p.counts().used, 3);
        for id in ids {
            p.decref(id);
        }
        assert_eq!(p.counts(), PoolCounts { total: 3, free: 3, cached: 0, used: 0 });
        p.check().unwrap();
    }

    #[test]
    fn cached_blocks_are_evicted_last_and_revived_by_lookup() {
        let mut p = pool(2);
        let a = p.allocate().unwrap();
        let b = p.allocate().unwrap();
        p.publish(a, 42);
        p.decref(a); // cached, tail
        p.decref(b); // uncached, head
        assert_eq!(p.counts(), PoolCounts { total: 2, free: 1, cached: 1, used: 0 });
        assert_eq!(p.lookup(42), Some(a));
        // Next allocation reuses the uncached one first.
        assert_eq!(p.allocate(), Some(b));
        // A hit revives the cached block without evicting it.
        p.incref(a);
        assert_eq!(p.ref_count(a), 1);
        assert_eq!(p.lookup(42), Some(a));
        p.decref(a);
        p.decref(b);
        // Exhaust: the cached block is evicted when needed.
        let x = p.allocate().unwrap();
        let y = p.allocate().unwrap();
        assert_eq!((x, y), (b, a));
        assert_eq!(p.lookup(42), None);
        p.check().unwrap();
    }
}
