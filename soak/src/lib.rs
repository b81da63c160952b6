//! plateau-soak: scenarios, the soak driver, probes, the growth detector and `plateau selftest`.
//! The `plateau` binary (main.rs) is a thin command-line shell over this library. Without the
//! `harness` feature only the scenario format, the workload generator and the detector remain.

/// jemalloc is the allocator of everything that links this crate (the `plateau` binary and the
/// tests), unprefixed so that C libraries' malloc is counted too.
#[cfg(feature = "harness")]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// A C string pointer that may live in a static.
#[cfg(feature = "harness")]
#[repr(transparent)]
pub struct ConfPtr(*const std::ffi::c_char);

// SAFETY: it points at a string literal, immutable for the program's life.
#[cfg(feature = "harness")]
unsafe impl Sync for ConfPtr {}

/// jemalloc reads its options from this symbol at its first allocation (unprefixed build):
/// [`probes::MALLOC_CONF`].
#[cfg(feature = "harness")]
#[export_name = "malloc_conf"]
pub static JEMALLOC_CONF: ConfPtr = ConfPtr(probes::MALLOC_CONF.as_ptr());

#[cfg(feature = "harness")]
pub mod analysis;
pub mod corpus;
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
