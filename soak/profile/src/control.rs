//! jemalloc's heap profiler, switched from inside the profiled process: whether this build has
//! it, activation, the sample rate, and dumps. Profiling must be enabled when the process starts
//! (`prof:true`: the `plateau` binary's allocator configuration has it, inactive, and a run of
//! plateau's own engine activates it before the engine is built, `live.rs`), so that what was
//! allocated before a point and freed after it (a table's old buffer when it doubles, a cache's
//! evicted entries) counts against its site.

use std::ffi::CString;
use std::path::Path;

/// Whether this binary's jemalloc was built with heap profiling.
pub fn compiled_in() -> bool {
    // SAFETY: `config.prof` is a read-only bool mallctl.
    unsafe { tikv_jemalloc_ctl::raw::read::<bool>(b"config.prof\0") }.unwrap_or(false)
}

/// Whether profiling was enabled at start (`opt.prof`).
pub fn enabled() -> bool {
    // SAFETY: `opt.prof` is a read-only bool mallctl.
    unsafe { tikv_jemalloc_ctl::raw::read::<bool>(b"opt.prof\0") }.unwrap_or(false)
}

/// Whether allocations are being sampled now (`prof.active`).
pub fn active() -> bool {
    // SAFETY: `prof.active` is a read-write bool mallctl.
    unsafe { tikv_jemalloc_ctl::raw::read::<bool>(b"prof.active\0") }.unwrap_or(false)
}

/// The sample period's base-2 logarithm now (`prof.lg_sample`).
pub fn lg_sample() -> Option<usize> {
    // SAFETY: `prof.lg_sample` is a read-only size_t mallctl.
    unsafe { tikv_jemalloc_ctl::raw::read::<usize>(b"prof.lg_sample\0") }.ok()
}

/// Starts sampling allocations.
pub fn activate() -> Result<(), String> {
    if !enabled() {
        return Err("heap profiling is not enabled in this process (start it with MALLOC_CONF=prof:true)".into());
    }
    // SAFETY: `prof.active` is a read-write bool mallctl.
    unsafe { tikv_jemalloc_ctl::raw::write::<bool>(b"prof.active\0", true) }.map_err(|e| format!("prof.active: {e}"))
}

/// Forgets every sample taken so far and samples one allocation in 2^`lg_sample` bytes from now.
pub fn reset(lg_sample: usize) -> Result<(), String> {
    // SAFETY: `prof.reset` takes the new lg_prof_sample as a size_t.
    unsafe { tikv_jemalloc_ctl::raw::write::<usize>(b"prof.reset\0", lg_sample) }
        .map_err(|e| format!("prof.reset: {e}"))
}

/// Writes the live heap's profile (jemalloc's heap_v2 text) to `path`.
pub fn dump(path: &Path) -> Result<(), String> {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|e| format!("{}: {e}", path.display()))?;
    // SAFETY: `prof.dump` takes a NUL-terminated path that lives for the call.
    unsafe { tikv_jemalloc_ctl::raw::write::<*const std::ffi::c_char>(b"prof.dump\0", c.as_ptr()) }
        .map_err(|e| format!("prof.dump {}: {e}", path.display()))
}
