//! plateau-soak: scenarios, the soak driver, probes, the growth detector and `plateau selftest`.
//! The `plateau` binary (main.rs) is a thin command-line shell over this library. Without the
//! `harness` feature only the scenario format, the workload generator and the detector remain.

/// jemalloc is the allocator of everything that links this crate (the `plateau` binary and the
/// tests), unprefixed so that C libraries' malloc is counted too.
#[cfg(feature = "harness")]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[cfg(feature = "harness")]
pub mod analysis;
pub mod detector;
#[cfg(feature = "harness")]
pub mod driver;
#[cfg(feature = "harness")]
pub mod pd;
#[cfg(feature = "harness")]
pub mod probes;
pub mod scenario;
#[cfg(feature = "harness")]
pub mod selftest;
#[cfg(feature = "harness")]
pub mod system;
pub mod workload;
