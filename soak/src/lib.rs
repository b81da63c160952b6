//! plateau-soak: the soak harness: the driver, probes, P/D transports, `plateau selftest`, and the
//! `plateau` binary (main.rs), a thin command-line shell over this library. The scenario format and
//! the workload generator are `plateau-scenario`'s, the detector `plateau-detector`'s (re-exported
//! here).

pub use plateau_analysis as analysis;
pub use plateau_analysis::explain;
pub use plateau_bisect as bisect;
pub use plateau_detector as detector;
pub use plateau_detector::corpus;
pub use plateau_driver as driver;
pub use plateau_driver::triggers;
pub use plateau_external as external;
pub use plateau_history as history;
pub use plateau_pd as pd;
pub use plateau_probes::{arena, base_blocks, extents, mappings, probes, system};
pub use plateau_profile as heapprof;
pub use plateau_reports::fsutil;
pub use plateau_scenario as scenario;
pub use plateau_scenario::workload;
pub use plateau_search as shrink;
pub use plateau_serve as serve;

/// jemalloc is the allocator of everything that links this crate (the `plateau` binary and the
/// tests), unprefixed so that C libraries' malloc is counted too; the harness's own allocations go
/// to an arena of their own ([`arena`]).
#[global_allocator]
static GLOBAL: arena::Allocator = arena::Allocator;

/// A C string pointer that may live in a static.
#[repr(transparent)]
pub struct ConfPtr(*const std::ffi::c_char);

// SAFETY: it points at a string literal, immutable for the program's life.
unsafe impl Sync for ConfPtr {}

/// jemalloc reads its options from this symbol at its first allocation (unprefixed build):
/// [`probes::MALLOC_CONF`].
#[export_name = "malloc_conf"]
pub static JEMALLOC_CONF: ConfPtr = ConfPtr(probes::MALLOC_CONF.as_ptr());

pub mod environment;
pub mod selftest;
