//! plateau-spec: what the soak harness (`plateau-soak`) and the simulator (`plateau-sim`) share,
//! with no harness dependency (no allocator, no /proc, no threads):
//! - `scenario`: the scenario format (TOML), strictly validated, with located errors;
//! - `workload`: the requests a scenario's phases make, deterministic from the seed;
//! - `detector`: the growth detector (exact accounting and trends) over samples.jsonl v1;
//! - `corpus`: the detector's labelled corpus generator.

pub mod corpus;
pub mod detector;
pub mod scenario;
pub mod workload;
