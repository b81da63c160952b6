//! The KV cache manager: per-sequence block tables over the [`BlockPool`], prefix caching by
//! chained block hashes, sharing between n>1 siblings and copy-on-write of a shared last block.
//!
//! Lifecycle of a sequence's table:
//! 1. `allocate` creates it on first scheduling, starting from the prefix-cache hits found by
//!    `prefix_hits` (one reference added to each), then grows it block by block as tokens are
//!    scheduled. If the sequence is about to write into a partially filled block that a sibling
//!    also holds, that block is copied first (the copy is returned for the backend to perform).
//! 2. `publish` hashes each block once it is full and computed, so later requests can hit it.
//! 3. `fork` gives a child sequence the same blocks (one more reference each).
//! 4. `free` drops every reference, last block first so that a prefix outlives its suffix in the
//!    LRU, and removes the table. A table that outlives its sequence is a leak.

use crate::block_pool::{BlockHash, BlockId, BlockPool, PoolCounts};
use crate::registry::{MetricKind, Registries, TrackedMap};

pub type SeqId = u64;

/// A key that distinguishes the content of positions `start..end` beyond their token ids: the
/// content hash of an image whose embeddings occupy those placeholder positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtraKey {
    pub start: usize,
    pub end: usize,
    pub hash: u64,
}

#[derive(Debug, Default)]
struct Table {
    blocks: Vec<BlockId>,
    /// Chained hashes of the leading full blocks already computed (`hashes.len() <= blocks.len()`).
    hashes: Vec<BlockHash>,
}

pub use plateau_model::BlockCopy;

#[derive(Debug, PartialEq, Eq)]
pub struct NoFreeBlocks {
    pub needed: usize,
    pub available: usize,
}

#[derive(Debug)]
pub struct KvManager {
    pool: BlockPool,
    block_size: usize,
    prefix_caching: bool,
    tables: TrackedMap<SeqId, Table>,
}

/// Hash of one full block chained to its parent's hash.
pub fn block_hash(parent: Option<BlockHash>, tokens: &[u32], start_pos: usize, extra: &[ExtraKey]) -> BlockHash {
    let mut h = crate::stable_hash::StableHasher::new();
    h.opt_u64(parent).u32s(tokens);
    let end_pos = start_pos + tokens.len();
    for k in extra.iter().filter(|k| k.start < end_pos && k.end > start_pos) {
        h.len(k.start).len(k.end).u64(k.hash);
    }
    h.finish()
}

impl KvManager {
    pub fn new(num_blocks: usize, block_size: usize, prefix_caching: bool, book: &mut Registries) -> Self {
        assert!(block_size > 0);
        KvManager {
            pool: BlockPool::new(num_blocks, book),
            block_size,
            prefix_caching,
            tables: book.map("registry.block_tables", MetricKind::PerRequest),
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn counts(&self) -> PoolCounts {
        self.pool.counts()
    }

    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    pub fn has_table(&self, seq: SeqId) -> bool {
        self.tables.contains_key(&seq)
    }

    pub fn block_table(&self, seq: SeqId) -> &[BlockId] {
        self.tables.get(&seq).map(|t| t.blocks.as_slice()).unwrap_or(&[])
    }

    pub fn blocks_for(&self, num_tokens: usize) -> usize {
        num_tokens.div_ceil(self.block_size)
    }

    /// Leading full blocks of `tokens` already in the prefix cache. At least one token is always
    /// left to compute, so the last prompt position produces logits.
    pub fn prefix_hits(&self, tokens: &[u32], extra: &[ExtraKey]) -> Vec<BlockId> {
        if !self.prefix_caching || tokens.is_empty() {
            return Vec::new();
        }
        let max_blocks = (tokens.len() - 1) / self.block_size;
        let mut hits = Vec::new();
        let mut parent = None;
        for (i, chunk) in tokens.chunks_exact(self.block_size).take(max_blocks).enumerate() {
            let h = block_hash(parent, chunk, i * self.block_size, extra);
            match self.pool.lookup(h) {
                Some(id) => hits.push(id),
                None => break,
            }
            parent = Some(h);
        }
        hits
    }

    /// Makes room for `seq` to hold `total_tokens` tokens, `num_computed` of them already in its
    /// blocks. On the first call `hits` are the prefix-cache blocks it starts from. Nothing changes
    /// when the pool cannot supply every block needed.
    #[track_caller]
    pub fn allocate(
        &mut self,
        seq: SeqId,
        hits: &[BlockId],
        num_computed: usize,
        total_tokens: usize,
    ) -> Result<Vec<BlockCopy>, NoFreeBlocks> {
        let bs = self.block_size;
        let existing = self.tables.get(&seq);
        let (have, cow) = match existing {
            Some(t) => {
                let writes_partial = num_computed % bs != 0 && num_computed < total_tokens;
                let last = t.blocks.get(num_computed / bs).copied();
                let cow = writes_partial && last.is_some_and(|b| self.pool.ref_count(b) > 1);
                (t.blocks.len(), cow)
            }
            None => {
                assert!(hits.len() * bs <= total_tokens);
                (hits.len(), false)
            }
        };
        let revived =
            if existing.is_none() { hits.iter().filter(|&&b| self.pool.ref_count(b) == 0).count() } else { 0 };
        let new_blocks = self.blocks_for(total_tokens).saturating_sub(have) + usize::from(cow);
        let available = self.pool.num_available();
        if new_blocks + revived > available {
            return Err(NoFreeBlocks { needed: new_blocks + revived, available });
        }
        if existing.is_none() {
            for &b in hits {
                self.pool.incref(b);
            }
            let hashes = hits.iter().map(|&b| self.pool.hash_of(b).expect("hit block has a hash")).collect();
            self.tables.insert(seq, Table { blocks: hits.to_vec(), hashes });
        }
        let mut copies = Vec::new();
        let pool = &mut self.pool;
        let table = self.tables.get_mut(&seq).expect("table exists");
        if cow {
            let idx = num_computed / bs;
            let old = table.blocks[idx];
            let new = pool.allocate().expect("counted above");
            pool.decref(old);
            table.blocks[idx] = new;
            copies.push(BlockCopy { src: old, dst: new });
        }
        while table.blocks.len() < total_tokens.div_ceil(bs) {
            table.blocks.push(pool.allocate().expect("counted above"));
        }
        Ok(copies)
    }

    /// Publishes the hashes of `seq`'s full, computed blocks (its first `num_computed` tokens).
    pub fn publish(&mut self, seq: SeqId, tokens: &[u32], num_computed: usize, extra: &[ExtraKey]) {
        if !self.prefix_caching {
            return;
        }
        let bs = self.block_size;
        let Some(table) = self.tables.get_mut(&seq) else {
            return;
        };
        let full = (num_computed / bs).min(table.blocks.len());
        while table.hashes.len() < full {
            let i = table.hashes.len();
            let h = block_hash(table.hashes.last().copied(), &tokens[i * bs..(i + 1) * bs], i * bs, extra);
            self.pool.publish(table.blocks[i], h);
            table.hashes.push(h);
        }
    }

    /// Gives `child` the blocks of `parent`, shared.
    #[track_caller]
    pub fn fork(&mut self, parent: SeqId, child: SeqId) {
        assert!(!self.tables.contains_key(&child), "seq {child} forked twice");
        let t = self.tables.get(&parent).expect("fork of a sequence without blocks");
        let (blocks, hashes) = (t.blocks.clone(), t.hashes.clone());
        for &b in &blocks {
            self.pool.incref(b);
        }
        self.tables.insert(child, Table { blocks, hashes });
    }

    /// Returns every block of `seq` to the pool and forgets its table. Freeing a sequence without
    /// a table is a no-op.
    pub fn free(&mut self, seq: SeqId) {
        if let Some(t) = self.tables.remove(&seq) {
            for &b in t.blocks.iter().rev() {
                self.pool.decref(b);
            }
        }
    }

    /// Forgets every cached prefix (after sleep or a weight update: cached KV is stale).
    pub fn reset_prefix_cache(&mut self) {
        self.pool.reset_prefix_cache();
    }

    /// Checks the pool and that every reference is held by some table.
    pub fn check(&self) -> Result<(), String> {
        self.pool.check()?;
        let mut refs = vec![0u32; self.pool.total()];
        for t in self.tables.values() {
            for &b in &t.blocks {
                refs[b as usize] += 1;
            }
        }
        for (i, &r) in refs.iter().enumerate() {
            let have = self.pool.ref_count(i as u32);
            if have != r {
                return Err(format!("block {i} has {have} references but tables hold {r}"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(n: usize) -> KvManager {
        KvManager::new(n, 4, true, &mut Registries::new())
    }

    #[test]
    fn fork_shares_then_copies_partial_last_block_on_write() {
        let mut m = kv(8);
        m.allocate(1, &[], 0, 6).unwrap(); // 2 blocks, the second half full
        m.fork(1, 2);
        assert_eq!(m.counts().used, 2);
        assert_eq!(m.pool().ref_count(m.block_table(1)[1]), 2);
        // seq 2 writes position 6: its shared partial block is copied first.
        let copies = m.allocate(2, &[], 6, 7).unwrap();
        assert_eq!(copies.len(), 1);
        assert_eq!(copies[0].src, m.block_table(1)[1]);
        assert_eq!(m.block_table(1)[0], m.block_table(2)[0]);
        assert_ne!(m.block_table(1)[1], m.block_table(2)[1]);
        // seq 1 now owns its last block alone: no copy.
        assert!(m.allocate(1, &[], 6, 7).unwrap().is_empty());
        m.check().unwrap();
        m.free(1);
        m.free(2);
        assert_eq!(m.counts().used, 0);
        m.check().unwrap();
    }

    #[test]
    fn repeated_prompt_hits_prefix_cache_but_computes_last_token() {
        let mut m = kv(8);
        let prompt: Vec<u32> = (0..9).collect(); // 2 full blocks + 1
        assert!(m.prefix_hits(&prompt, &[]).is_empty());
        m.allocate(1, &[], 0, 9).unwrap();
        m.publish(1, &prompt, 9, &[]);
        m.free(1);
        let hits = m.prefix_hits(&prompt, &[]);
        assert_eq!(hits.len(), 2);
        // Exactly two full blocks: the last one is left to compute.
        assert_eq!(m.prefix_hits(&prompt[..8], &[]).len(), 1);
        // Other extra keys: no hit.
        let img = [ExtraKey { start: 0, end: 2, hash: 9 }];
        assert!(m.prefix_hits(&prompt, &img).is_empty());
        m.allocate(2, &hits, 8, 9).unwrap();
        assert_eq!(&m.block_table(2)[..2], &hits[..]);
        m.check().unwrap();
    }

    #[test]
    fn allocation_is_all_or_nothing() {
        let mut m = kv(2);
        assert_eq!(m.allocate(1, &[], 0, 12), Err(NoFreeBlocks { needed: 3, available: 2 }));
        assert!(!m.has_table(1));
        assert_eq!(m.counts().used, 0);
    }
}
