//! Which library of a process defines a function: memray names a native frame by its function and
//! source line only, and a site of native code is named by its library (`libledger.so!ledger_worker`)
//! the way people meet it. The libraries are the ELF files the process maps executable; each one's
//! symbol names (its symbol table and dynamic symbols, demangled) are read when first needed, the
//! smallest files first, within a time budget.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use object::{Object, ObjectSymbol};

/// The time all lookups of one process may take: a library of a GiB (libtorch) takes a second or
/// two to read; a run's end should not wait minutes for names.
const BUDGET: Duration = Duration::from_secs(60);

/// A library's file name and, once read, the names it defines.
struct Library {
    path: String,
    size: u64,
    names: Option<BTreeSet<String>>,
}

pub struct Libraries {
    libraries: Vec<Library>,
    spent: Duration,
}

/// A function's name as compared: demangled, without its parameter list.
fn bare(name: &str) -> &str {
    name.split('(').next().unwrap_or(name).trim()
}

impl Libraries {
    /// The executable files mapped by process `pid` (none when it is gone).
    pub fn of(pid: i32) -> Libraries {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        let mut paths: Vec<String> = maps
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() >= 6 && f[1].contains('x') && f[5].starts_with('/')).then(|| f[5].to_string())
            })
            .collect();
        paths.sort();
        paths.dedup();
        let mut libraries: Vec<Library> = paths
            .into_iter()
            .map(|path| {
                let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(u64::MAX);
                Library { path, size, names: None }
            })
            .collect();
        libraries.sort_by_key(|l| l.size);
        Libraries { libraries, spent: Duration::ZERO }
    }

    /// The file name of the library that defines `function`, if one does (within the budget).
    pub fn defining(&mut self, function: &str) -> Option<String> {
        let want = bare(function);
        for lib in &mut self.libraries {
            if lib.names.is_none() {
                if self.spent >= BUDGET {
                    return None;
                }
                let t0 = Instant::now();
                lib.names = Some(read_names(&lib.path, lib.size));
                self.spent += t0.elapsed();
            }
            if lib.names.as_ref().is_some_and(|n| n.contains(want)) {
                return Some(lib.path.rsplit('/').next().unwrap_or(&lib.path).to_string());
            }
        }
        None
    }
}

/// Libraries past this size are not read (a 2 GiB read for one name is not worth it).
const MAX_LIBRARY_BYTES: u64 = 2 << 30;

/// The defined function names of an ELF file, demangled and bare; empty when it does not read.
fn read_names(path: &str, size: u64) -> BTreeSet<String> {
    if size > MAX_LIBRARY_BYTES {
        return BTreeSet::new();
    }
    let Ok(bytes) = std::fs::read(path) else { return BTreeSet::new() };
    let Ok(obj) = object::File::parse(&*bytes) else { return BTreeSet::new() };
    obj.symbols()
        .chain(obj.dynamic_symbols())
        .filter(|s| s.is_definition() && s.kind() == object::SymbolKind::Text)
        .filter_map(|s| s.name().ok().map(|n| bare(&addr2line::demangle_auto(n.into(), None)).to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_function_of_this_process_is_found_in_the_library_that_defines_it() {
        let mut libs = Libraries::of(std::process::id() as i32);
        // The C library defines malloc.
        let lib = libs.defining("malloc").expect("a library defines malloc");
        assert!(lib.starts_with("libc") || lib.contains("plateau") || lib.contains("external"), "{lib}");
        assert_eq!(libs.defining("no_such_function_anywhere_1234"), None);
        assert_eq!(bare("at::foo(int, long)"), "at::foo");
    }
}
