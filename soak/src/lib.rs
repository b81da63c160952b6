//! plateau-soak: scenarios, the soak driver, probes, the growth detector and `plateau selftest`.
//! The `plateau` binary (main.rs) is a thin command-line shell over this library.

/// jemalloc is the allocator of everything that links this crate (the `plateau` binary and the
/// tests), unprefixed so that C libraries' malloc is counted too.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

pub mod analysis;
pub mod detector;
pub mod driver;
pub mod pd;
pub mod probes;
pub mod scenario;
pub mod selftest;
pub mod system;
pub mod workload;
