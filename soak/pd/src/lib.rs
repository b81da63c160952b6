//! Prefill/decode disaggregation in the shell: registered transfer regions, the in-process
//! transport, and the pair of engines with their router.

// The harness's allocator in this crate's unit tests, as the `plateau` binary has it (the
// tests read jemalloc's statistics and arenas).
#[cfg(test)]
plateau_probes::install_harness_allocator!();

pub mod node;
pub mod pair;
pub mod region;
pub mod remote;
pub mod router;
pub mod transport;
pub mod wire;
