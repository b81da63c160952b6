//! The encoder cache: vision-encoder outputs keyed by the image's content hash, shared by every
//! request with the same image.
//!
//! Lifecycle of an entry:
//! 1. A request needs an image's embeddings to prefill its placeholder positions. `acquire` finds
//!    the entry (a hit: the request takes a reference) or reports a miss; on a miss the scheduler
//!    `reserve`s the entry with the request's reference once `make_room` has evicted enough freed
//!    entries, and the model runner encodes the image and `fill`s it in the same step (or, if the
//!    encoder fails, the engine `cancel`s it and fails its holders).
//! 2. When every live sequence of the request has computed past the placeholders (their KV now
//!    holds what the embeddings contributed), or the request ends or is preempted, `release` drops
//!    its reference.
//! 3. An entry with no reference is *freed* but kept, most recently freed last, until the budget
//!    (in embeddings) or the entry cap forces its eviction; a later request with the same image
//!    takes it back without encoding.
//!
//! A reference that outlives its request is a leak: `refs()` must be 0 whenever nothing is in flight.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::registry::{MetricKind, Registries, TrackedMap};
use crate::request::RequestId;

#[derive(Debug)]
struct Entry {
    /// None while reserved and not yet encoded.
    embeds: Option<Arc<Vec<f32>>>,
    tokens: usize,
    refs: BTreeSet<RequestId>,
    /// Position in the freed LRU while `refs` is empty.
    freed_at: Option<u64>,
}

#[derive(Debug)]
pub struct EncoderCache {
    entries: TrackedMap<u64, Entry>,
    /// Every reference, (image hash, request), counted: where each was taken is known.
    held: TrackedMap<(u64, RequestId), ()>,
    /// Freed entries by the tick they were freed: the first is evicted first.
    freed: BTreeMap<u64, u64>,
    tick: u64,
    used_tokens: usize,
    budget_tokens: usize,
    max_entries: usize,
}

impl EncoderCache {
    pub fn new(budget_tokens: usize, max_entries: usize, book: &mut Registries) -> Self {
        EncoderCache {
            entries: book.map("registry.encoder_cache.entries", MetricKind::Bounded { capacity: max_entries as u64 }),
            held: book.map("registry.encoder_cache.refs", MetricKind::PerRequest),
            freed: BTreeMap::new(),
            tick: 0,
            used_tokens: 0,
            budget_tokens,
            max_entries,
        }
    }

    pub fn budget_tokens(&self) -> usize {
        self.budget_tokens
    }

    pub fn used_tokens(&self) -> usize {
        self.used_tokens
    }

    /// References held by requests, over all entries.
    pub fn refs(&self) -> usize {
        self.held.len()
    }

    pub fn freed_entries(&self) -> usize {
        self.freed.len()
    }

    /// A hit adds `req`'s reference and returns true; a miss returns false.
    #[track_caller]
    pub fn acquire(&mut self, hash: u64, req: RequestId) -> bool {
        let Some(e) = self.entries.get_mut(&hash) else { return false };
        if let Some(t) = e.freed_at.take() {
            self.freed.remove(&t);
        }
        if e.refs.insert(req) {
            self.held.insert((hash, req), ());
        }
        true
    }

    /// Evicts freed entries, oldest first, until `tokens` more fit in the budget and the entry cap.
    /// False (and nothing evicted) when even evicting every freed entry would not do.
    pub fn make_room(&mut self, tokens: usize) -> bool {
        let freed_tokens: usize = self.freed.values().map(|h| self.entries.get(h).map_or(0, |e| e.tokens)).sum();
        let fits_tokens = self.used_tokens - freed_tokens + tokens <= self.budget_tokens;
        let fits_entries = self.entries.len() - self.freed.len() < self.max_entries;
        if tokens > self.budget_tokens || !fits_tokens || !fits_entries {
            return false;
        }
        while self.used_tokens + tokens > self.budget_tokens || self.entries.len() >= self.max_entries {
            let (_, hash) = self.freed.pop_first().expect("room was counted above");
            let e = self.entries.remove(&hash).expect("freed entry exists");
            self.used_tokens -= e.tokens;
        }
        true
    }

    /// Reserves room for an image about to be encoded, with `req`'s reference. `make_room` must
    /// have said yes.
    #[track_caller]
    pub fn reserve(&mut self, hash: u64, tokens: usize, req: RequestId) {
        assert!(!self.entries.contains_key(&hash), "encoder cache entry reserved twice");
        assert!(self.used_tokens + tokens <= self.budget_tokens, "encoder cache over budget");
        self.used_tokens += tokens;
        self.held.insert((hash, req), ());
        self.entries.insert(hash, Entry { embeds: None, tokens, refs: BTreeSet::from([req]), freed_at: None });
    }

    /// Stores the embeddings of a reserved entry.
    pub fn fill(&mut self, hash: u64, embeds: Vec<f32>) {
        let e = self.entries.get_mut(&hash).expect("a reserved entry");
        assert!(e.embeds.is_none(), "encoder cache entry filled twice");
        e.embeds = Some(Arc::new(embeds));
    }

    /// Drops a reserved entry whose encoding failed; returns the requests that held it.
    pub fn cancel(&mut self, hash: u64) -> Vec<RequestId> {
        let Some(e) = self.entries.remove(&hash) else { return Vec::new() };
        if let Some(t) = e.freed_at {
            self.freed.remove(&t);
        }
        self.used_tokens -= e.tokens;
        for r in &e.refs {
            self.held.remove(&(hash, *r));
        }
        e.refs.into_iter().collect()
    }

    /// Reserves and fills at once (an image encoded outside a step).
    #[track_caller]
    pub fn insert(&mut self, hash: u64, embeds: Vec<f32>, tokens: usize, req: RequestId) {
        self.reserve(hash, tokens, req);
        self.fill(hash, embeds);
    }

    /// The embeddings of an encoded entry.
    pub fn get(&self, hash: u64) -> Option<Arc<Vec<f32>>> {
        self.entries.get(&hash).and_then(|e| e.embeds.clone())
    }

    pub fn holds(&self, hash: u64, req: RequestId) -> bool {
        self.entries.get(&hash).is_some_and(|e| e.refs.contains(&req))
    }

    /// Drops `req`'s reference; an entry left with none joins the freed LRU.
    pub fn release(&mut self, hash: u64, req: RequestId) {
        let Some(e) = self.entries.get_mut(&hash) else { return };
        if e.refs.remove(&req) {
            self.held.remove(&(hash, req));
            if e.refs.is_empty() {
                self.tick += 1;
                e.freed_at = Some(self.tick);
                self.freed.insert(self.tick, hash);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_then_freed_then_evicted_by_budget() {
        let mut c = EncoderCache::new(10, 8, &mut Registries::new());
        assert!(!c.acquire(1, 100));
        assert!(c.make_room(6));
        c.insert(1, vec![0.0; 6], 6, 100);
        assert!(c.acquire(1, 101), "same image: a hit");
        assert_eq!(c.refs(), 2);
        // 6 + 6 does not fit while entry 1 is held.
        assert!(!c.make_room(6));
        c.release(1, 100);
        c.release(1, 101);
        assert_eq!((c.refs(), c.freed_entries()), (0, 1));
        // A freed entry is still a hit.
        assert!(c.acquire(1, 102));
        c.release(1, 102);
        // Now it is evicted to make room.
        assert!(c.make_room(6));
        assert!(c.get(1).is_none());
        c.insert(2, vec![0.0; 6], 6, 103);
        assert_eq!(c.used_tokens(), 6);
    }
}
