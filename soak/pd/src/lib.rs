//! Prefill/decode disaggregation in the shell: registered transfer regions, the in-process
//! transport, and the pair of engines with their router.

pub mod node;
pub mod pair;
pub mod region;
pub mod remote;
pub mod router;
pub mod transport;
pub mod wire;
