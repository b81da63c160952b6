//! The `plateau` command end to end, one file per concern. One test binary for them all: each
//! file as a binary of its own linked the whole harness again, a minute of the test command's
//! build on two cores. Run one file's tests by its module: `cargo test --release -p
//! plateau-soak --test soak topology::`.

// The harness's allocator, as the `plateau` binary has it (in-process runs read jemalloc).
plateau_probes::install_harness_allocator!();

mod common;

mod bisect;
mod cli;
mod data;
mod docs;
mod evidence;
mod exact_replay;
mod external;
mod nightly;
mod one_judge;
mod power;
mod random_scenarios;
mod rl_http;
mod seeds;
mod shrink;
mod topology;
mod upstream;
#[path = "where.rs"]
mod where_;
mod workflows;
