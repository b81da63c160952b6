//! Finds what optional tests need on this machine: `plateau_gxx` when g++ runs (the host emulation
//! of the CUDA kernels compiles them with it). A test whose tool is missing is reported as ignored.

use std::process::Command;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(plateau_gxx)");
    println!("cargo::rerun-if-env-changed=PATH");
    let gxx = Command::new("g++").arg("--version").output().is_ok_and(|o| o.status.success());
    if gxx {
        println!("cargo::rustc-cfg=plateau_gxx");
    }
}
