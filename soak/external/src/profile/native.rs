//! A native server's replay on a preloaded jemalloc: Debian's `libjemalloc2` is built with its
//! heap profiler, so a program on the C library's `malloc` started with it preloaded and
//! `MALLOC_CONF=prof:true,lg_prof_sample:0` records the stack of every allocation. plateau's dump
//! trigger (`dumper.c`, built with plateau and written beside the replay) is preloaded after it:
//! at each of the window's quiescent points plateau asks it for a dump (`request_dump`), so the
//! three dumps are the live heap of an idle server, as in plateau's own replay. Return addresses
//! are then symbolized with the server's own executable and libraries, found through the dump's
//! copy of its mappings (line tables where the files have them, else their symbol tables).
//!
//! Why jemalloc's profiler and not heaptrack: both see every allocation of such a server, but a
//! dump of the live heap at a chosen point is exactly what the window needs, and plateau already
//! reads and diffs jemalloc's dumps for its own engine; heaptrack records a trace of every
//! allocation and free for offline analysis, far larger for a soak of thousands of requests.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use object::read::elf::{ElfFile64, ProgramHeader};

use super::{Window, DUMP_REQUEST_ENV};
use plateau_profile::symbolize::Frame;
use plateau_profile::{growth_between, read_dump, Growth, Symbolize};

/// plateau's dump trigger, built from `dumper.c` by the build script.
const DUMPER: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libplateau_dump.so"));

/// Where Debian-family systems install libjemalloc2.
const LIBJEMALLOC: [&str; 4] = [
    "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
    "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2",
    "/usr/lib64/libjemalloc.so.2",
    "/usr/lib/libjemalloc.so.2",
];

/// How long a server may take to write a dump plateau asked for.
const DUMP_TIMEOUT: Duration = Duration::from_secs(60);

/// The system's libjemalloc, if installed.
pub fn libjemalloc() -> Option<PathBuf> {
    LIBJEMALLOC.iter().map(PathBuf::from).find(|p| p.exists())
}

/// Writes the dump trigger into the replay's directory; the environment the server starts with.
pub fn prepare(out: &Path) -> Result<Vec<(String, String)>, String> {
    let lib = libjemalloc().ok_or(
        "no libjemalloc.so.2 with a heap profiler on this machine: install Debian's libjemalloc2 (`apt-get install libjemalloc2`) and run again with --profile to name the allocating line",
    )?;
    let dumper = out.join("libplateau_dump.so");
    std::fs::write(&dumper, DUMPER).map_err(|e| format!("{}: {e}", dumper.display()))?;
    Ok(vec![
        ("LD_PRELOAD".into(), format!("{}:{}", lib.display(), dumper.display())),
        ("MALLOC_CONF".into(), "prof:true,prof_active:true,lg_prof_sample:0".into()),
        (DUMP_REQUEST_ENV.into(), out.join("dump-request").display().to_string()),
    ])
}

/// Asks the dump trigger of process `pid` (the server) for a dump into `dump` through `request`,
/// and waits for it.
pub fn request_dump(request: &Path, pid: i32, dump: &Path) -> Result<(), String> {
    let _ = std::fs::remove_file(dump);
    let failed = PathBuf::from(format!("{}.failed", dump.display()));
    let tmp = request.with_extension("tmp");
    std::fs::write(&tmp, format!("{pid} {}", dump.display())).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, request).map_err(|e| format!("{}: {e}", request.display()))?;
    let t0 = Instant::now();
    while t0.elapsed() < DUMP_TIMEOUT {
        if !request.exists() {
            if let Ok(why) = std::fs::read_to_string(&failed) {
                return Err(format!(
                    "the server's heap dump failed ({}): is its libjemalloc built with profiling?",
                    why.trim()
                ));
            }
            if dump.exists() {
                return Ok(());
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Err(format!(
        "the server wrote no heap dump within {} s of plateau's request: it did not load plateau's dump trigger (a server with its own allocator, or a wrapper that drops LD_PRELOAD?)",
        DUMP_TIMEOUT.as_secs()
    ))
}

/// The growth between the replay's three dumps, symbolized with the server's files.
pub fn growth(out: &Path, window: &Window) -> Result<Growth, String> {
    let [a, m, b] = ["heap-start.prof", "heap-mid.prof", "heap-end.prof"].map(|n| read_dump(&out.join(n)));
    let (a, m, b) = (a?, m?, b?);
    let sym = ProcessSymbolizer::new(&b.maps);
    let binary = sym.executable().unwrap_or_else(|| "the server".into());
    Ok(growth_between([&a, &m, &b], (window.iters[0], window.iters[2]), binary, &sym))
}

/// One executable mapping of the server: its addresses, file offset and file.
struct Mapping {
    start: u64,
    end: u64,
    offset: u64,
    path: String,
}

/// A file's debug information and its loadable segments (file offset, size, virtual address).
struct Loaded {
    loader: addr2line::Loader,
    segments: Vec<(u64, u64, u64)>,
}

/// Symbolizes a server's return addresses with the files its mappings name.
pub struct ProcessSymbolizer {
    maps: Vec<Mapping>,
    files: RefCell<BTreeMap<String, Option<Rc<Loaded>>>>,
}

impl ProcessSymbolizer {
    /// From a copy of /proc/<pid>/maps (a dump's `MAPPED_LIBRARIES:`).
    pub fn new(maps: &str) -> ProcessSymbolizer {
        let maps = maps
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let (range, perms, offset) = (f.next()?, f.next()?, f.next()?);
                let path = f.nth(2)?.to_string();
                if !perms.contains('x') || !path.starts_with('/') {
                    return None;
                }
                let (s, e) = range.split_once('-')?;
                Some(Mapping {
                    start: u64::from_str_radix(s, 16).ok()?,
                    end: u64::from_str_radix(e, 16).ok()?,
                    offset: u64::from_str_radix(offset, 16).ok()?,
                    path,
                })
            })
            .collect();
        ProcessSymbolizer { maps, files: RefCell::new(BTreeMap::new()) }
    }

    /// The first executable mapping's file: the program itself.
    pub fn executable(&self) -> Option<String> {
        self.maps.first().map(|m| m.path.clone())
    }

    fn load(&self, path: &str) -> Option<Rc<Loaded>> {
        let mut files = self.files.borrow_mut();
        files
            .entry(path.to_string())
            .or_insert_with(|| {
                let bytes = std::fs::read(path).ok()?;
                let elf = ElfFile64::<object::Endianness>::parse(&*bytes).ok()?;
                let e = elf.endian();
                let segments = elf
                    .elf_program_headers()
                    .iter()
                    .filter(|p| p.p_type(e) == object::elf::PT_LOAD)
                    .map(|p| (p.p_offset(e), p.p_filesz(e), p.p_vaddr(e)))
                    .collect();
                Some(Rc::new(Loaded { loader: addr2line::Loader::new(path).ok()?, segments }))
            })
            .clone()
    }
}

/// A frame of the C library, the C++ runtime, the allocator or the loader: never a leak's site.
fn is_system(path: &str, file: Option<&str>, function: &str) -> bool {
    let lib =
        ["/libc.so", "/libc-", "/libstdc++", "/libjemalloc", "/ld-linux", "/libgcc_s", "/libm.so", "/libplateau_dump"]
            .iter()
            .any(|l| path.contains(l));
    let header = file.is_some_and(|f| {
        f.starts_with("/usr/include/")
            || f.starts_with("./")
            || f.starts_with("../sysdeps")
            || f.contains("/libstdc++-v3/")
    });
    let runtime =
        ["std::", "__gnu_cxx::", "operator new", "__cxx", "__libc_", "_dl_"].iter().any(|p| function.starts_with(p));
    lib || header || runtime
}

impl Symbolize for ProcessSymbolizer {
    fn frames(&self, addr: u64) -> Vec<Frame> {
        // A return address points after the call: one byte back is inside it.
        let probe = addr.wrapping_sub(1);
        let unknown = || vec![Frame { function: format!("{addr:#x}"), file: None, line: None, own: false }];
        let Some(m) = self.maps.iter().find(|m| m.start <= probe && probe < m.end) else { return unknown() };
        let Some(loaded) = self.load(&m.path) else {
            let name = m.path.rsplit('/').next().unwrap_or("?");
            return vec![Frame {
                function: format!("{name}+{:#x}", probe - m.start + m.offset),
                file: None,
                line: None,
                own: false,
            }];
        };
        let file_offset = probe - m.start + m.offset;
        let Some(vaddr) = loaded
            .segments
            .iter()
            .find(|(off, size, _)| *off <= file_offset && file_offset < off + size)
            .map(|(off, _, vaddr)| vaddr + (file_offset - off))
        else {
            return unknown();
        };
        let mut out = Vec::new();
        if let Ok(mut it) = loaded.loader.find_frames(vaddr) {
            while let Ok(Some(f)) = it.next() {
                let function = f
                    .function
                    .as_ref()
                    .and_then(|n| n.demangle().ok().map(std::borrow::Cow::into_owned))
                    .unwrap_or_else(|| "?".to_string());
                let (file, line) = f.location.map_or((None, None), |l| (l.file.map(str::to_string), l.line));
                let own = !is_system(&m.path, file.as_deref(), &function);
                out.push(Frame { function, file, line, own });
            }
        }
        if let Some(sym) = loaded.loader.find_symbol(vaddr) {
            let name = addr2line::demangle_auto(std::borrow::Cow::Borrowed(sym), None).into_owned();
            match out.last_mut() {
                Some(last) if last.function == "?" || last.file.is_none() => last.function = name,
                Some(_) => {}
                None => {
                    let own = !is_system(&m.path, None, &name);
                    out.push(Frame { function: name, file: None, line: None, own });
                }
            }
        }
        if out.is_empty() {
            return unknown();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_binary_is_symbolized_through_its_own_mappings() {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let s = ProcessSymbolizer::new(&maps);
        let addr = this_binary_is_symbolized_through_its_own_mappings as *const () as usize as u64 + 1;
        let frames = s.frames(addr);
        assert!(
            frames.iter().any(|f| f.function.contains("this_binary_is_symbolized_through_its_own_mappings")),
            "{frames:?}"
        );
        assert!(frames.iter().any(|f| f.own), "{frames:?}");
    }

    #[test]
    fn the_c_library_and_the_cxx_runtime_are_never_the_site() {
        assert!(is_system("/usr/lib/x86_64-linux-gnu/libc.so.6", None, "malloc"));
        assert!(is_system(
            "/srv/llama-server",
            Some("/usr/include/c++/12/bits/vector.tcc"),
            "std::vector<int>::_M_realloc_insert"
        ));
        assert!(!is_system(
            "/srv/llama-server",
            Some("/src/llama.cpp/tools/server/server.cpp"),
            "server_prompt_cache::save"
        ));
    }

    #[test]
    fn a_dump_request_is_answered_with_the_dump() {
        let dir = std::env::temp_dir().join(format!("plateau-dump-request-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // Answered by a thread standing in for the server's trigger.
        let (req, dump) = (dir.join("dump-request"), dir.join("heap-start.prof"));
        let r2 = req.clone();
        let t = std::thread::spawn(move || {
            for _ in 0..500 {
                if let Ok(p) = std::fs::read_to_string(&r2) {
                    let (pid, path) = p.trim().split_once(' ').unwrap();
                    assert_eq!(pid, "4242");
                    std::fs::write(path, "heap_v2/1\n").unwrap();
                    std::fs::remove_file(&r2).unwrap();
                    return;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        request_dump(&req, 4242, &dump).unwrap();
        t.join().unwrap();
        assert!(dump.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
