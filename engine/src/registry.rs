//! Counted registries: every map, set and queue of the engine that holds per-request state.
//!
//! Lifecycle: a [`Registries`] book is created with the engine. Each structure that holds state is
//! created *through* the book ([`Registries::map`], [`Registries::queue`]), which hands back a
//! tracked container sharing a live length counter with the book. The structure cannot exist
//! without being listed, so `stats()` and `check_idle()` see every one of them; forgetting to count
//! a new structure would mean bypassing the book with a bare `BTreeMap`, which review catches.
//! Tracked containers are ordered (`BTreeMap`, `VecDeque`) so iteration never depends on hashing.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What a metric means to the detector (samples.jsonl v1): decided by kind, never by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// Memory-like level: trend-tested.
    Gauge,
    /// Per-request state: must be zero at every quiescent point.
    PerRequest,
    /// Must never exceed `capacity`.
    Bounded { capacity: u64 },
    /// Grows by nature: plotted, never judged.
    Counter,
}

impl MetricKind {
    /// The contract's name for the kind.
    pub fn as_str(self) -> &'static str {
        match self {
            MetricKind::Gauge => "gauge",
            MetricKind::PerRequest => "per_request",
            MetricKind::Bounded { .. } => "bounded",
            MetricKind::Counter => "counter",
        }
    }
}

/// One named figure of `stats()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metric {
    /// Dot-separated family name, e.g. `registry.requests`.
    pub name: String,
    pub kind: MetricKind,
    /// `count` or `bytes`.
    pub unit: &'static str,
    pub value: u64,
}

#[derive(Debug)]
struct Entry {
    name: &'static str,
    kind: MetricKind,
    len: Arc<AtomicU64>,
}

/// The book of every tracked structure of one engine.
#[derive(Debug, Default)]
pub struct Registries {
    entries: Vec<Entry>,
}

impl Registries {
    pub fn new() -> Self {
        Self::default()
    }

    fn register(&mut self, name: &'static str, kind: MetricKind) -> Arc<AtomicU64> {
        assert!(self.entries.iter().all(|e| e.name != name), "registry {name} registered twice");
        assert!(name.starts_with("registry."), "registry name {name} must start with registry.");
        let len = Arc::new(AtomicU64::new(0));
        self.entries.push(Entry { name, kind, len: Arc::clone(&len) });
        len
    }

    /// A tracked ordered map named `name` (e.g. `registry.requests`).
    pub fn map<K: Ord, V>(&mut self, name: &'static str, kind: MetricKind) -> TrackedMap<K, V> {
        TrackedMap { inner: BTreeMap::new(), len: self.register(name, kind) }
    }

    /// A tracked FIFO queue named `name`.
    pub fn queue<T>(&mut self, name: &'static str, kind: MetricKind) -> TrackedQueue<T> {
        TrackedQueue { inner: VecDeque::new(), len: self.register(name, kind) }
    }

    /// The current size of every tracked structure, in registration order.
    pub fn metrics(&self) -> impl Iterator<Item = Metric> + '_ {
        self.entries.iter().map(|e| Metric {
            name: e.name.to_string(),
            kind: e.kind,
            unit: "count",
            value: e.len.load(Ordering::Relaxed),
        })
    }
}

/// An ordered map whose length the [`Registries`] book always knows.
#[derive(Debug)]
pub struct TrackedMap<K, V> {
    inner: BTreeMap<K, V>,
    len: Arc<AtomicU64>,
}

impl<K: Ord, V> TrackedMap<K, V> {
    fn sync(&self) {
        self.len.store(self.inner.len() as u64, Ordering::Relaxed);
    }
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        let old = self.inner.insert(key, value);
        self.sync();
        old
    }
    pub fn remove(&mut self, key: &K) -> Option<V> {
        let old = self.inner.remove(key);
        self.sync();
        old
    }
    pub fn get(&self, key: &K) -> Option<&V> {
        self.inner.get(key)
    }
    pub fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        self.inner.get_mut(key)
    }
    pub fn contains_key(&self, key: &K) -> bool {
        self.inner.contains_key(key)
    }
    pub fn len(&self) -> usize {
        self.inner.len()
    }
    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.inner.keys()
    }
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.inner.values()
    }
    pub fn clear(&mut self) {
        self.inner.clear();
        self.sync();
    }
}

/// A FIFO queue whose length the [`Registries`] book always knows.
#[derive(Debug)]
pub struct TrackedQueue<T> {
    inner: VecDeque<T>,
    len: Arc<AtomicU64>,
}

impl<T: PartialEq> TrackedQueue<T> {
    fn sync(&self) {
        self.len.store(self.inner.len() as u64, Ordering::Relaxed);
    }
    pub fn push_back(&mut self, v: T) {
        self.inner.push_back(v);
        self.sync();
    }
    pub fn push_front(&mut self, v: T) {
        self.inner.push_front(v);
        self.sync();
    }
    pub fn pop_front(&mut self) -> Option<T> {
        let v = self.inner.pop_front();
        self.sync();
        v
    }
    pub fn pop_back(&mut self) -> Option<T> {
        let v = self.inner.pop_back();
        self.sync();
        v
    }
    pub fn front(&self) -> Option<&T> {
        self.inner.front()
    }
    pub fn back(&self) -> Option<&T> {
        self.inner.back()
    }
    /// Removes the first element equal to `v`; true if one was there.
    pub fn remove_item(&mut self, v: &T) -> bool {
        let found = self.inner.iter().position(|x| x == v).map(|i| self.inner.remove(i));
        self.sync();
        found.is_some()
    }
    pub fn contains(&self, v: &T) -> bool {
        self.inner.contains(v)
    }
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.inner.iter()
    }
    pub fn len(&self) -> usize {
        self.inner.len()
    }
    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }
    /// Moves the contents out, leaving the queue empty.
    pub fn drain_all(&mut self) -> Vec<T> {
        let v: Vec<T> = self.inner.drain(..).collect();
        self.sync();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn book_counts_every_structure() {
        let mut book = Registries::new();
        let mut m: TrackedMap<u32, u32> = book.map("registry.a", MetricKind::PerRequest);
        let mut q: TrackedQueue<u32> = book.queue("registry.b", MetricKind::Bounded { capacity: 4 });
        m.insert(1, 1);
        m.insert(2, 2);
        q.push_back(7);
        let got: Vec<(String, u64)> = book.metrics().map(|m| (m.name, m.value)).collect();
        assert_eq!(got, vec![("registry.a".into(), 2), ("registry.b".into(), 1)]);
        m.remove(&1);
        assert!(q.remove_item(&7));
        assert!(!q.remove_item(&7));
        let got: Vec<u64> = book.metrics().map(|m| m.value).collect();
        assert_eq!(got, vec![1, 0]);
    }

    #[test]
    #[should_panic(expected = "registered twice")]
    fn duplicate_names_are_refused() {
        let mut book = Registries::new();
        let _a: TrackedMap<u32, u32> = book.map("registry.a", MetricKind::PerRequest);
        let _b: TrackedMap<u32, u32> = book.map("registry.a", MetricKind::PerRequest);
    }
}
