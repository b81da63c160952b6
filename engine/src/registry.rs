//! Counted registries: every map, set and queue of the engine that holds per-request state.
//!
//! Lifecycle: a [`Registries`] book is created with the engine. Each structure that holds state is
//! created *through* the book ([`Registries::map`], [`Registries::queue`]), which hands back a
//! tracked container sharing a live length counter with the book. The structure cannot exist
//! without being listed, so `stats()` and `check_idle()` see every one of them; forgetting to count
//! a new structure would mean bypassing the book with a bare `BTreeMap`, which review catches.
//! Tracked containers are ordered (`BTreeMap`, `VecDeque`) so iteration never depends on hashing.
//!
//! Every entry also remembers where it was inserted (the caller's source location, through
//! `#[track_caller]`) and in which epoch (the iteration the shell last set), so that entries left
//! behind with nothing in flight can be traced to the code that put them there:
//! [`Registries::residues`].

use std::collections::{BTreeMap, VecDeque};
use std::panic::Location;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub use plateau_model::metric::{Metric, MetricKind};

/// Where and when an entry was inserted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Origin {
    site: &'static Location<'static>,
    epoch: u64,
}

/// What the book knows of one structure: its length, and its live entries by insertion site and
/// epoch.
#[derive(Debug, Default)]
struct Shared {
    len: AtomicU64,
    sites: Mutex<Vec<SiteCounts>>,
}

/// The live entries one call site inserted, by epoch: `(epoch, count)` in ascending epoch order,
/// no count zero. A structure has one to three inserting sites, so a list found by address beats
/// a map; epochs only grow, so an insertion is at the back, and the buffers keep their capacity
/// from iteration to iteration (bookkeeping allocates nothing in a steady state).
#[derive(Debug)]
struct SiteCounts {
    site: &'static Location<'static>,
    epochs: VecDeque<(u64, u64)>,
}

impl Shared {
    fn added(&self, o: Origin) {
        let Ok(mut s) = self.sites.lock() else { return };
        let i = match s.iter().position(|c| std::ptr::eq(c.site, o.site)) {
            Some(i) => i,
            None => {
                s.push(SiteCounts { site: o.site, epochs: VecDeque::new() });
                s.len() - 1
            }
        };
        let epochs = &mut s[i].epochs;
        match epochs.back_mut() {
            Some((e, n)) if *e == o.epoch => *n += 1,
            // The epoch is set from outside and could in principle go back: keep the order.
            _ => match epochs.binary_search_by_key(&o.epoch, |x| x.0) {
                Ok(j) => epochs[j].1 += 1,
                Err(j) => epochs.insert(j, (o.epoch, 1)),
            },
        }
    }

    fn removed(&self, o: Origin) {
        let Ok(mut s) = self.sites.lock() else { return };
        let Some(c) = s.iter_mut().find(|c| std::ptr::eq(c.site, o.site)) else { return };
        if let Ok(j) = c.epochs.binary_search_by_key(&o.epoch, |x| x.0) {
            c.epochs[j].1 -= 1;
            if c.epochs[j].1 == 0 {
                c.epochs.remove(j);
            }
        }
    }
}

/// Entries of one registry inserted at one site and still there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Residue {
    pub registry: String,
    /// The inserting call site (`engine/src/store.rs`, a line).
    pub file: &'static str,
    pub line: u32,
    pub count: u64,
    /// The epoch (iteration) of the oldest of them.
    pub oldest_epoch: u64,
}

#[derive(Debug)]
struct Entry {
    name: &'static str,
    kind: MetricKind,
    shared: Arc<Shared>,
}

/// The book of every tracked structure of one engine.
#[derive(Debug, Default)]
pub struct Registries {
    entries: Vec<Entry>,
    /// The epoch new entries are stamped with (the shell's iteration; 0 until it says).
    epoch: Arc<AtomicU64>,
}

impl Registries {
    pub fn new() -> Self {
        Self::default()
    }

    fn register(&mut self, name: &'static str, kind: MetricKind) -> Tracker {
        assert!(self.entries.iter().all(|e| e.name != name), "registry {name} registered twice");
        assert!(name.starts_with("registry."), "registry name {name} must start with registry.");
        let shared = Arc::new(Shared::default());
        self.entries.push(Entry { name, kind, shared: Arc::clone(&shared) });
        Tracker { shared, epoch: Arc::clone(&self.epoch) }
    }

    /// A tracked ordered map named `name` (e.g. `registry.requests`).
    pub fn map<K: Ord, V>(&mut self, name: &'static str, kind: MetricKind) -> TrackedMap<K, V> {
        TrackedMap { inner: BTreeMap::new(), t: self.register(name, kind) }
    }

    /// A tracked FIFO queue named `name`.
    pub fn queue<T>(&mut self, name: &'static str, kind: MetricKind) -> TrackedQueue<T> {
        TrackedQueue { inner: VecDeque::new(), t: self.register(name, kind) }
    }

    /// The epoch entries inserted from now on are stamped with.
    pub fn set_epoch(&self, epoch: u64) {
        self.epoch.store(epoch, Ordering::Relaxed);
    }

    /// The current size of every tracked structure, in registration order.
    pub fn metrics(&self) -> impl Iterator<Item = Metric> + '_ {
        self.entries.iter().map(|e| Metric {
            name: e.name.to_string(),
            kind: e.kind,
            unit: "count",
            value: e.shared.len.load(Ordering::Relaxed),
        })
    }

    /// Every live entry of every structure, by where and when it was inserted: registration
    /// order, then site.
    pub fn residues(&self) -> Vec<Residue> {
        let mut out = Vec::new();
        for e in &self.entries {
            let Ok(sites) = e.shared.sites.lock() else { continue };
            let mut found: Vec<Residue> = sites
                .iter()
                .filter(|c| !c.epochs.is_empty())
                .map(|c| Residue {
                    registry: e.name.to_string(),
                    file: c.site.file(),
                    line: c.site.line(),
                    count: c.epochs.iter().map(|x| x.1).sum(),
                    oldest_epoch: c.epochs.front().map_or(0, |x| x.0),
                })
                .collect();
            found.sort_by(|a, b| (a.file, a.line).cmp(&(b.file, b.line)));
            out.extend(found);
        }
        out
    }
}

/// What a tracked container shares with the book.
#[derive(Debug)]
struct Tracker {
    shared: Arc<Shared>,
    epoch: Arc<AtomicU64>,
}

impl Tracker {
    #[track_caller]
    fn origin(&self) -> Origin {
        Origin { site: Location::caller(), epoch: self.epoch.load(Ordering::Relaxed) }
    }

    fn set_len(&self, len: usize) {
        self.shared.len.store(len as u64, Ordering::Relaxed);
    }
}

/// An ordered map whose length, and whose entries' insertion sites, the [`Registries`] book
/// always knows.
#[derive(Debug)]
pub struct TrackedMap<K, V> {
    inner: BTreeMap<K, (V, Origin)>,
    t: Tracker,
}

impl<K: Ord, V> TrackedMap<K, V> {
    #[track_caller]
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        let o = self.t.origin();
        let old = self.inner.insert(key, (value, o));
        if let Some((_, old_origin)) = &old {
            self.t.shared.removed(*old_origin);
        }
        self.t.shared.added(o);
        self.t.set_len(self.inner.len());
        old.map(|x| x.0)
    }
    pub fn remove(&mut self, key: &K) -> Option<V> {
        let old = self.inner.remove(key);
        if let Some((_, o)) = &old {
            self.t.shared.removed(*o);
        }
        self.t.set_len(self.inner.len());
        old.map(|x| x.0)
    }
    pub fn get(&self, key: &K) -> Option<&V> {
        self.inner.get(key).map(|x| &x.0)
    }
    pub fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        self.inner.get_mut(key).map(|x| &mut x.0)
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
        self.inner.values().map(|x| &x.0)
    }
    pub fn clear(&mut self) {
        for (_, o) in self.inner.values() {
            self.t.shared.removed(*o);
        }
        self.inner.clear();
        self.t.set_len(0);
    }
}

/// A FIFO queue whose length, and whose entries' insertion sites, the [`Registries`] book always
/// knows.
#[derive(Debug)]
pub struct TrackedQueue<T> {
    inner: VecDeque<(T, Origin)>,
    t: Tracker,
}

impl<T: PartialEq> TrackedQueue<T> {
    fn taken(&self, o: Option<Origin>) {
        if let Some(o) = o {
            self.t.shared.removed(o);
        }
        self.t.set_len(self.inner.len());
    }
    #[track_caller]
    pub fn push_back(&mut self, v: T) {
        let o = self.t.origin();
        self.inner.push_back((v, o));
        self.t.shared.added(o);
        self.t.set_len(self.inner.len());
    }
    #[track_caller]
    pub fn push_front(&mut self, v: T) {
        let o = self.t.origin();
        self.inner.push_front((v, o));
        self.t.shared.added(o);
        self.t.set_len(self.inner.len());
    }
    pub fn pop_front(&mut self) -> Option<T> {
        let v = self.inner.pop_front();
        self.taken(v.as_ref().map(|x| x.1));
        v.map(|x| x.0)
    }
    pub fn pop_back(&mut self) -> Option<T> {
        let v = self.inner.pop_back();
        self.taken(v.as_ref().map(|x| x.1));
        v.map(|x| x.0)
    }
    pub fn front(&self) -> Option<&T> {
        self.inner.front().map(|x| &x.0)
    }
    pub fn back(&self) -> Option<&T> {
        self.inner.back().map(|x| &x.0)
    }
    /// Removes the first element equal to `v`; true if one was there.
    pub fn remove_item(&mut self, v: &T) -> bool {
        let found = self.inner.iter().position(|x| &x.0 == v).and_then(|i| self.inner.remove(i));
        self.taken(found.as_ref().map(|x| x.1));
        found.is_some()
    }
    pub fn contains(&self, v: &T) -> bool {
        self.inner.iter().any(|x| &x.0 == v)
    }
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.inner.iter().map(|x| &x.0)
    }
    pub fn len(&self) -> usize {
        self.inner.len()
    }
    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }
    /// Moves the contents out, leaving the queue empty.
    pub fn drain_all(&mut self) -> Vec<T> {
        let v: Vec<(T, Origin)> = self.inner.drain(..).collect();
        for (_, o) in &v {
            self.t.shared.removed(*o);
        }
        self.t.set_len(0);
        v.into_iter().map(|x| x.0).collect()
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
    fn residues_name_the_inserting_line_and_the_oldest_epoch() {
        let mut book = Registries::new();
        let mut m: TrackedMap<u32, u32> = book.map("registry.a", MetricKind::PerRequest);
        book.set_epoch(3);
        m.insert(1, 1);
        let line = line!() - 1;
        book.set_epoch(5);
        m.insert(2, 2);
        m.insert(3, 3);
        m.remove(&2);
        let r = book.residues();
        assert_eq!(r.len(), 2, "the entry inserted and removed leaves nothing: {r:?}");
        assert_eq!((r[0].line, r[0].count, r[0].oldest_epoch), (line, 1, 3));
        assert_eq!((r[1].line, r[1].count, r[1].oldest_epoch), (line + 4, 1, 5));
        assert!(r[0].file.ends_with("registry.rs"));
        m.clear();
        assert!(book.residues().is_empty());
    }

    #[test]
    #[should_panic(expected = "registered twice")]
    fn duplicate_names_are_refused() {
        let mut book = Registries::new();
        let _a: TrackedMap<u32, u32> = book.map("registry.a", MetricKind::PerRequest);
        let _b: TrackedMap<u32, u32> = book.map("registry.a", MetricKind::PerRequest);
    }
}
