//! Leak injections: named switches, all off by default, each re-creating a real class of leak
//! through the structure, on the trigger and at the size of its real bug (docs/INCIDENTS.md).
//! A detector must never special-case their names: each is caught by what it leaks.
//!
//! Where each one sits, in the code path of its real bug:
//! - `registry-retains-finished`: `OutputProcessor::finalize` (output.rs) forgets to remove the
//!   finished request, its prompt and its image tensors from `registry.requests`;
//! - `n-abort-orphans`: `OutputProcessor::abort` (output.rs) leaves the children of a forked n>1
//!   request registered and running;
//! - `abort-keeps-blocks`: `OutputProcessor::abort` skips `KvManager::free` for aborted sequences;
//! - `encoder-cache-abort`: `OutputProcessor::abort` finalizes without releasing the request's
//!   encoder cache references;
//! - `untracked-heap`: `OutputProcessor::finalize` appends every output's tokens to a history no
//!   registry counts (heap only);
//! - `sleep-keeps-kv`: `Injections::pool_release` (below) tells every backend to keep its KV pool
//!   at sleep beside the one wake allocates (plateau_model::PoolRelease);
//! - `pd-prefill-hold`: `KvConnector::release` and `advance_time` (pd/connector.rs) never free a
//!   held transfer the decode side aborted, and never time it out;
//! - `pd-handles`: `KvConnector::release` frees the blocks but never the transfer handle;
//! - `pd-mmap-hook`: the soak's transfer regions (`plateau-soak`, pd/region.rs): the memory hook
//!   keeps every remapped receive region mapped, outside the allocator;
//! - `pd-sender-on-abort`: the soak's in-process transport (`plateau-soak`, pd/transport.rs): the
//!   abort-time purge skips the sender side, whose state only the terminal chunk frees;
//! - `id-set-never-drained`: `Engine::step` (engine.rs) never drains the output processor's set
//!   of finished request ids (vLLM V1's `finished_req_ids`, handed to the workers each step and
//!   reset), so the hash set keeps every id ever finished and its table doubles (heap only).
//!
//! The same set carries the plants (plant.rs): must-pass caches, switched on with `--plant`.

use std::fmt;
use std::str::FromStr;

use plateau_model::PoolRelease;

use crate::plant::Plant;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Injection {
    RegistryRetainsFinished,
    NAbortOrphans,
    AbortKeepsBlocks,
    SleepKeepsKv,
    UntrackedHeap,
    EncoderCacheAbort,
    PdMmapHook,
    PdPrefillHold,
    PdHandles,
    PdSenderOnAbort,
    IdSetNeverDrained,
}

impl Injection {
    pub const ALL: [Injection; 11] = [
        Injection::RegistryRetainsFinished,
        Injection::NAbortOrphans,
        Injection::AbortKeepsBlocks,
        Injection::SleepKeepsKv,
        Injection::UntrackedHeap,
        Injection::EncoderCacheAbort,
        Injection::PdMmapHook,
        Injection::PdPrefillHold,
        Injection::PdHandles,
        Injection::PdSenderOnAbort,
        Injection::IdSetNeverDrained,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Injection::RegistryRetainsFinished => "registry-retains-finished",
            Injection::NAbortOrphans => "n-abort-orphans",
            Injection::AbortKeepsBlocks => "abort-keeps-blocks",
            Injection::SleepKeepsKv => "sleep-keeps-kv",
            Injection::UntrackedHeap => "untracked-heap",
            Injection::EncoderCacheAbort => "encoder-cache-abort",
            Injection::PdMmapHook => "pd-mmap-hook",
            Injection::PdPrefillHold => "pd-prefill-hold",
            Injection::PdHandles => "pd-handles",
            Injection::PdSenderOnAbort => "pd-sender-on-abort",
            Injection::IdSetNeverDrained => "id-set-never-drained",
        }
    }

    pub fn description(self) -> &'static str {
        match self {
            Injection::RegistryRetainsFinished => {
                "finished requests, with their prompt tokens, stay in the request registry (vLLM seq_id_to_seq_group)"
            }
            Injection::NAbortOrphans => {
                "aborting an n>1 request after it forked leaves its child sequences registered and running"
            }
            Injection::AbortKeepsBlocks => "the KV blocks of an aborted request are never returned to the pool",
            Injection::SleepKeepsKv => "sleep does not release the KV cache; wake allocates a new one beside it",
            Injection::EncoderCacheAbort => {
                "image encoder outputs of aborted requests are never freed: the abort path keeps their cache references"
            }
            Injection::PdMmapHook => {
                "the KV transport's memory hook keeps every remapped receive region mapped (anonymous memory outside the allocator)"
            }
            Injection::PdPrefillHold => {
                "the prefill side never frees a request's blocks when the decode side aborts it, and never times out"
            }
            Injection::PdHandles => "KV transfer handles are never released",
            Injection::PdSenderOnAbort => {
                "the KV sender keeps a transfer's staged KV and chunk records when the decode side aborts it mid-pull: only the terminal chunk frees them (vLLM-omni #6352; heap only, no registry)"
            }
            Injection::UntrackedHeap => {
                "finished requests' output tokens are appended to a history no registry counts (heap only)"
            }
            Injection::IdSetNeverDrained => {
                "the set of finished request ids handed to each step is never drained: a hash set that doubles (vLLM V1 finished_req_ids; heap only)"
            }
        }
    }
}

impl fmt::Display for Injection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Injection {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Injection::ALL.iter().copied().find(|i| i.name() == s).ok_or_else(|| {
            let known: Vec<&str> = Injection::ALL.iter().map(|i| i.name()).collect();
            format!("unknown injection `{s}`; known: {}", known.join(", "))
        })
    }
}

/// The switches of one engine: the leak injections on, and the plants (must-pass caches) on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Injections(Vec<Injection>, Vec<Plant>);

impl Injections {
    pub fn none() -> Self {
        Self::default()
    }
    pub fn with(mut self, i: Injection) -> Self {
        if !self.0.contains(&i) {
            self.0.push(i);
            self.0.sort();
        }
        self
    }
    pub fn on(&self, i: Injection) -> bool {
        self.0.contains(&i)
    }
    /// The leak injections on (plants are in [`Injections::plants`]).
    pub fn iter(&self) -> impl Iterator<Item = Injection> + '_ {
        self.0.iter().copied()
    }
    pub fn with_plant(mut self, p: Plant) -> Self {
        if !self.1.contains(&p) {
            self.1.push(p);
            self.1.sort();
        }
        self
    }
    pub fn plants(&self) -> &[Plant] {
        &self.1
    }

    /// What a backend does with its KV pool at sleep: dropped, or, with `sleep-keeps-kv`, kept
    /// beside the pool that wake allocates (plateau_model::PoolRelease, through which every
    /// backend releases, so the injection has one structure on the CPU, the GPU and in the
    /// simulator).
    pub fn pool_release(&self) -> PoolRelease {
        if self.on(Injection::SleepKeepsKv) {
            PoolRelease::KeepBeside
        } else {
            PoolRelease::Drop
        }
    }
}

impl FromIterator<Injection> for Injections {
    fn from_iter<T: IntoIterator<Item = Injection>>(iter: T) -> Self {
        iter.into_iter().fold(Injections::none(), Injections::with)
    }
}
