//! What kind of program a server is, for the profiler that can see its heap: a Python interpreter
//! (memray), a native program that allocates through the C library's `malloc` (a preloaded
//! jemalloc with profiling), or one with an allocator of its own linked in, whose heap no preloaded
//! allocator sees (then only the mapping diff says where memory grew).
//!
//! Read from the running server at the end of the run: `/proc/<pid>/exe`, its mappings (a
//! `libpython` mapped in makes an embedded interpreter Python too) and the executable's ELF
//! symbols (`malloc` defined in the executable itself wins over any preloaded one).

use std::path::{Path, PathBuf};

use object::read::elf::{ElfFile64, ProgramHeader};
use object::{Object, ObjectSymbol};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ServerKind {
    /// A Python interpreter: its allocation sites are recorded by the run itself, with memray
    /// through plateau's hook.
    Python { exe: PathBuf },
    /// A native program on the C library's allocator: profiled by preloading jemalloc.
    Native { exe: PathBuf },
    /// A program with its own allocator (named), which a preloaded one would not see.
    OwnAllocator { exe: PathBuf, allocator: String },
}

impl ServerKind {
    pub fn exe(&self) -> &Path {
        match self {
            ServerKind::Python { exe } | ServerKind::Native { exe } | ServerKind::OwnAllocator { exe, .. } => exe,
        }
    }

    /// One line for a person: what the server is and how its heap can be seen.
    pub fn describe(&self) -> String {
        match self {
            ServerKind::Python { exe } => format!(
                "a Python server ({}): its allocation sites are recorded by the run itself (memray through plateau's hook, `--sites`), and no second run of it can see more",
                exe.display()
            ),
            ServerKind::Native { exe } => {
                format!("a native server on the C library's malloc ({}): its heap is read by a preloaded jemalloc", exe.display())
            }
            ServerKind::OwnAllocator { exe, allocator } => format!(
                "a server with its own allocator, {allocator} ({}): a preloaded profiler cannot see its heap, so only its mappings say where memory grew",
                exe.display()
            ),
        }
    }
}

/// The kind of the running process `pid`.
pub fn classify(pid: i32) -> Result<ServerKind, String> {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).map_err(|e| format!("/proc/{pid}/exe: {e}"))?;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).map_err(|e| format!("/proc/{pid}/maps: {e}"))?;
    let name = exe.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if name.starts_with("python") || maps.lines().any(|l| l.contains("/libpython")) {
        return Ok(ServerKind::Python { exe });
    }
    let bytes = std::fs::read(&exe).map_err(|e| format!("{}: {e}", exe.display()))?;
    match own_allocator(&bytes).map_err(|e| format!("{}: {e}", exe.display()))? {
        Some(allocator) => Ok(ServerKind::OwnAllocator { exe, allocator }),
        None => Ok(ServerKind::Native { exe }),
    }
}

/// The allocator an executable brings with it, if any: a statically linked program (no dynamic
/// loader: nothing can be preloaded), one that defines `malloc` itself, or one whose code calls a
/// prefixed allocator directly (Rust's jemallocator, mimalloc, tcmalloc, Go's runtime).
fn own_allocator(elf: &[u8]) -> Result<Option<String>, String> {
    let file = object::File::parse(elf).map_err(|e| format!("not an ELF file the profiler can read: {e}"))?;
    let defined = |want: &dyn Fn(&str) -> bool| {
        file.symbols().chain(file.dynamic_symbols()).any(|s| s.is_definition() && s.name().is_ok_and(want))
    };
    let brand = if defined(&|n| n.starts_with("_rjem_") || n.starts_with("je_") || n.contains("jemalloc")) {
        "jemalloc"
    } else if defined(&|n| n.starts_with("mi_malloc")) {
        "mimalloc"
    } else if defined(&|n| n.starts_with("tc_malloc") || n.contains("tcmalloc")) {
        "tcmalloc"
    } else if defined(&|n| n == "runtime.mallocgc") {
        "Go's runtime allocator"
    } else {
        ""
    };
    if !elf_has_interpreter(elf) {
        let what = if brand.is_empty() {
            "the allocator linked into a static executable".to_string()
        } else {
            brand.to_string()
        };
        return Ok(Some(what));
    }
    if !brand.is_empty() || defined(&|n| n == "malloc") {
        return Ok(Some(if brand.is_empty() { "a malloc of its own".into() } else { brand.into() }));
    }
    Ok(None)
}

/// Whether an ELF file names a dynamic loader (a PT_INTERP program header): without one, nothing
/// is preloaded into it.
fn elf_has_interpreter(elf: &[u8]) -> bool {
    let Ok(f) = ElfFile64::<object::Endianness>::parse(elf) else { return false };
    let e = f.endian();
    f.elf_program_headers().iter().any(|p| p.p_type(e) == object::elf::PT_INTERP)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_test_binary_brings_its_own_allocator_and_a_shell_does_not() {
        // The test binary links plateau's jemalloc, unprefixed: it defines malloc.
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert_eq!(own_allocator(&me).unwrap().as_deref(), Some("jemalloc"));
        let sh = std::fs::read("/bin/sh").unwrap();
        assert_eq!(own_allocator(&sh).unwrap(), None, "/bin/sh allocates through libc");
        assert!(elf_has_interpreter(&sh));
    }

    #[test]
    fn a_running_process_is_classified() {
        let kind = classify(std::process::id() as i32).unwrap();
        assert!(matches!(kind, ServerKind::OwnAllocator { .. }), "{kind:?}");
        assert!(classify(-5).is_err());
    }
}
