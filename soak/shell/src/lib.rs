//! The edges of plateau's processes, shared by every command: what they print (`say`) and the
//! child processes they run (`children`). The engine core never uses either: it prints nothing
//! and starts nothing.

pub mod children;
pub mod say;
