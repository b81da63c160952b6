//! plateau-probes: what plateau reads of a process, its own or a server's. Each sample is a set of
//! named values the driver writes into samples.jsonl; nothing here judges them.
//!
//! - `probes.rs`: jemalloc's statistics (settled on request: purged, thread caches flushed), the
//!   kernel's `/proc` view (RSS by kind, page tables, descriptors, threads) and the engine's
//!   registries, each as a metric the samples header declares;
//! - `arena.rs`: the harness's own allocations kept in an arena of their own, so that what the
//!   harness allocates never reads as the engine's growth (the binary installs its allocator);
//! - `extents.rs` and `base_blocks.rs`: the address ranges jemalloc maps, recorded by extent hooks,
//!   so that anonymous memory outside the allocator can be told from its own;
//! - `layout.rs`: the process's address space laid out the same in every run (the kernel's
//!   randomisation turned off at start, given back to a server plateau spawns);
//! - `mappings.rs`: a process's mappings grouped by what backs them, and their growth over a run;
//! - `system.rs`: the system under test as the driver samples it (one engine, a P/D pair).

// The harness's allocator in this crate's unit tests, as the `plateau` binary has it (the
// tests read jemalloc's statistics and arenas).
#[cfg(test)]
crate::install_harness_allocator!();

pub mod arena;
pub mod base_blocks;
pub mod extents;
pub mod layout;
pub mod mappings;
pub mod probes;
pub mod system;
