//! plateau-sim: the engine's real cores as nodes of a deterministic madsim cluster (a router,
//! prefill, decode and monolithic nodes), driven by the soak's scenarios under seeded fault plans,
//! with invariants checked during and after every run, a trace hash per run, and replay by seed.
//!
//! The cluster (`cluster`, `runner`) and the node-tagging allocator (`heap`) exist only in the
//! simulation build, `RUSTFLAGS="--cfg madsim"` in its own target folder (`just sim`); the pure
//! parts (the hash model backend, cost model, fault plans, workload plans, the scenario's `[sim]`
//! section, run specs, transfer regions, traces, reports, sweep shards) build and are unit-tested
//! everywhere.

pub mod cost;
pub mod faults;
pub mod hash_model;
pub mod plan;
pub mod regions;
pub mod report;
pub mod section;
pub mod shards;
pub mod spec;
pub mod trace;

#[cfg(madsim)]
pub mod cluster;
#[cfg(madsim)]
pub mod heap;

/// Every allocation in the simulation build is tagged with the node that made it (`heap`).
#[cfg(madsim)]
#[global_allocator]
static GLOBAL: heap::TaggingAllocator = heap::TaggingAllocator;
#[cfg(madsim)]
pub mod runner;
