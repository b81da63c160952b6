//! plateau-soak: the `plateau` binary (main.rs, a thin command-line shell whose subcommands are
//! in `cli/`), `plateau selftest` and the run's environment record. The harness itself is in
//! crates named for what they hold, re-exported here under the paths the binary, the tests and
//! the benches use: process probes (`plateau-probes`), the driver (`plateau-driver`), plateau's
//! engine served over HTTP (`plateau-serve`) and as a P/D pair (`plateau-pd`), other servers as
//! targets (`plateau-external`), the judge of a run directory (`plateau-analysis`), heap profiles
//! (`plateau-profile`), shrink and fuzz (`plateau-search`), bisect and history; the scenario
//! format and the detector are `plateau-scenario`'s and `plateau-detector`'s. The allocator is the
//! binary's (`plateau_probes::install_harness_allocator!`), never this library's.

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
pub use plateau_sites as sites;

pub mod environment;
pub mod repro;
pub mod selftest;
