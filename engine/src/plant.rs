//! Plants: must-pass caches, all off by default, each modelled on a real cache an engine keeps.
//! A leak injection must fail; a plant must pass. Each grows at first, or in a cycle, and then
//! holds its level, the way a correct cache does, so a detector that reads every fill as a leak
//! fails on them. Like the injections, they hold heap only (no registry counts them) and a
//! detector must never special-case their names.
//!
//! Lifecycle: the output processor hands each request that ends to [`Garden::request_ended`]; the
//! shell's epoch (its iteration) reaches [`Garden::epoch`]. Nothing else touches them.
//! - `bounded-cache`: a CPU cache of prompts' KV bounded by bytes (an offloading KV connector's
//!   local store, or vLLM's multimodal processor cache): 2 KiB a prompt token, keyed by the
//!   prompt's hash, least recently used evicted above 64 MiB. Unique prompts churn through it.
//! - `cleared-buffer`: a stats logger's per-request records (tokens and the step each came at),
//!   handed off and freed every 100 epochs, as a logger flushes at its interval.
//! - `prompt-lru`: a tokenizer-side LRU of 64 entries keyed by prompt hash, each holding the
//!   prompt's tokens (Python's `functools.lru_cache(maxsize=64)` on a tokenize call).

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::str::FromStr;

use crate::stable_hash::StableHasher;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Plant {
    BoundedCache,
    ClearedBuffer,
    PromptLru,
}

impl Plant {
    pub const ALL: [Plant; 3] = [Plant::BoundedCache, Plant::ClearedBuffer, Plant::PromptLru];

    pub fn name(self) -> &'static str {
        match self {
            Plant::BoundedCache => "bounded-cache",
            Plant::ClearedBuffer => "cleared-buffer",
            Plant::PromptLru => "prompt-lru",
        }
    }

    pub fn description(self) -> &'static str {
        match self {
            Plant::BoundedCache => {
                "a 64 MiB cache of prompts' KV (2 KiB a token) keyed by prompt hash, least recently used evicted: fills, then churns under its bound"
            }
            Plant::ClearedBuffer => {
                "a stats logger's per-request records, freed every 100 iterations: a sawtooth that never climbs"
            }
            Plant::PromptLru => "an LRU of 64 tokenized prompts keyed by prompt hash: full at once, then churns",
        }
    }
}

impl fmt::Display for Plant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Plant {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Plant::ALL.iter().copied().find(|p| p.name() == s).ok_or_else(|| {
            let known: Vec<&str> = Plant::ALL.iter().map(|p| p.name()).collect();
            format!("unknown plant `{s}`; known: {}", known.join(", "))
        })
    }
}

/// The bound of `bounded-cache`, in bytes of entries.
const BOUNDED_CACHE_BYTES: usize = 64 << 20;
/// What `bounded-cache` keeps per prompt token: one token's K and V for a small model
/// (16 layers x 2 x 16 floats of 4 bytes).
const BOUNDED_CACHE_BYTES_PER_TOKEN: usize = 2048;
/// Epochs between two flushes of `cleared-buffer`.
const FLUSH_EVERY_EPOCHS: u64 = 100;
/// Entries of `prompt-lru`.
const PROMPT_LRU_ENTRIES: usize = 64;

fn prompt_key(prompt: &[u32]) -> u64 {
    StableHasher::new().u32s(prompt).finish()
}

/// A least-recently-used map bounded by a cost (bytes or entries): `touch` on a hit, `insert`
/// evicts the oldest entries until the total cost is within the bound.
#[derive(Debug, Default)]
struct Lru<V> {
    entries: BTreeMap<u64, (u64, usize, V)>,
    /// Use tick -> key, oldest first.
    order: BTreeMap<u64, u64>,
    tick: u64,
    cost: usize,
    bound: usize,
}

impl<V> Lru<V> {
    fn new(bound: usize) -> Self {
        Lru { entries: BTreeMap::new(), order: BTreeMap::new(), tick: 0, cost: 0, bound }
    }

    /// Marks `key` used; false when it is not cached.
    fn touch(&mut self, key: u64) -> bool {
        let Some((tick, _, _)) = self.entries.get_mut(&key) else { return false };
        self.order.remove(tick);
        self.tick += 1;
        *tick = self.tick;
        self.order.insert(self.tick, key);
        true
    }

    fn insert(&mut self, key: u64, cost: usize, value: V) {
        assert!(!self.entries.contains_key(&key), "insert of a cached key: touch it instead");
        self.tick += 1;
        self.entries.insert(key, (self.tick, cost, value));
        self.order.insert(self.tick, key);
        self.cost += cost;
        while self.cost > self.bound {
            let (_, oldest) = self.order.pop_first().expect("a cost above the bound has entries");
            let (_, c, _) = self.entries.remove(&oldest).expect("ordered keys are cached");
            self.cost -= c;
        }
        assert_eq!(self.entries.len(), self.order.len());
    }
}

/// One request's record in `cleared-buffer`.
#[derive(Debug)]
#[allow(dead_code)] // written for the logger that would read it, never read here
struct Record {
    prompt_tokens: u32,
    tokens: Vec<u32>,
}

/// The plants switched on for one engine, with their state.
#[derive(Debug, Default)]
pub(crate) struct Garden {
    bounded: Option<Lru<Vec<u8>>>,
    buffer: Option<VecDeque<Record>>,
    lru: Option<Lru<Vec<u32>>>,
}

impl Garden {
    pub fn new(plants: &[Plant]) -> Self {
        Garden {
            bounded: plants.contains(&Plant::BoundedCache).then(|| Lru::new(BOUNDED_CACHE_BYTES)),
            buffer: plants.contains(&Plant::ClearedBuffer).then(VecDeque::new),
            lru: plants.contains(&Plant::PromptLru).then(|| Lru::new(PROMPT_LRU_ENTRIES)),
        }
    }

    /// A request ended with `prompt` and, over its sequences, `tokens`.
    pub fn request_ended(&mut self, prompt: &[u32], tokens: Vec<u32>) {
        let key = prompt_key(prompt);
        if let Some(c) = &mut self.bounded {
            if !c.touch(key) {
                let bytes = prompt.len() * BOUNDED_CACHE_BYTES_PER_TOKEN;
                // Filled, as a copy from the device would: every byte written.
                c.insert(key, bytes, vec![1u8; bytes]);
            }
        }
        if let Some(b) = &mut self.buffer {
            b.push_back(Record { prompt_tokens: prompt.len() as u32, tokens });
        }
        if let Some(c) = &mut self.lru {
            if !c.touch(key) {
                c.insert(key, 1, prompt.to_vec());
            }
        }
    }

    /// The shell's epoch: `cleared-buffer` hands its records off (they are freed) every
    /// [`FLUSH_EVERY_EPOCHS`].
    pub fn epoch(&mut self, epoch: u64) {
        if let Some(b) = &mut self.buffer {
            if epoch > 0 && epoch % FLUSH_EVERY_EPOCHS == 0 {
                drop(std::mem::take(b));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_holds_its_bound_and_evicts_the_least_recently_used() {
        let mut l = Lru::new(3);
        for k in 0..3 {
            l.insert(k, 1, ());
        }
        assert!(l.touch(0));
        l.insert(3, 1, ());
        assert!(!l.touch(1), "1 was least recently used");
        assert!(l.touch(0) && l.touch(2) && l.touch(3));
        assert_eq!((l.cost, l.entries.len()), (3, 3));
    }

    #[test]
    fn the_bounded_cache_stops_at_64_mib_and_the_buffer_empties_each_period() {
        let mut g = Garden::new(&Plant::ALL);
        for i in 0..2_000u32 {
            g.request_ended(&[i; 100], vec![i; 10]);
        }
        let c = g.bounded.as_ref().unwrap();
        assert!(c.cost <= BOUNDED_CACHE_BYTES && c.cost > BOUNDED_CACHE_BYTES - 100 * 2048);
        assert_eq!(g.lru.as_ref().unwrap().entries.len(), PROMPT_LRU_ENTRIES);
        g.epoch(99);
        assert_eq!(g.buffer.as_ref().unwrap().len(), 2_000);
        g.epoch(100);
        assert!(g.buffer.as_ref().unwrap().is_empty());
    }

    #[test]
    fn names_parse_back() {
        for p in Plant::ALL {
            assert_eq!(p.name().parse::<Plant>(), Ok(p));
        }
        assert!("bounded".parse::<Plant>().unwrap_err().contains("known: bounded-cache"));
    }
}
