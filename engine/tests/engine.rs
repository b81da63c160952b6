//! The engine from outside its crate, one file per concern, in one test binary (a binary per
//! file linked the engine again for each). `injections.rs` stays a binary of its own: it
//! installs a counting global allocator. Run one file's tests by its module: `cargo test
//! --release -p plateau-engine --test engine determinism::`.

mod common;

mod bad_input;
mod cuda;
mod determinism;
mod device_sampling;
mod engine_props;
mod kv_props;
mod multimodal;
mod pd;
mod sharing;
