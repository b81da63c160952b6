//! Sites of plateau's own process as the run goes: jemalloc's heap profiler samples allocations
//! from the run's start, and at every quiescent point the live heap is dumped, its stacks
//! unbiased for the sampling and symbolized, and their live bytes summed by allocation site
//! (`FILE:LINE FUNCTION`, the first frame of the project's own code past the allocator) into a
//! [`Snapshot`] for sites.jsonl.
//!
//! Lifecycle: [`HeapSites::start`] before the engine is built (so every object the run keeps was
//! allocated under the profiler and its frees are seen); [`HeapSites::snapshot`] at each quiescent
//! point, inside the harness's scope (whose own allocations the profiler skips:
//! `plateau_probes::arena`), dumping into the run's directory; the dump file is removed when the
//! recorder goes.
//!
//! Cost and precision: one allocation in [`LG_SAMPLE`] bytes is sampled (its stack unwound and
//! kept); a dump writes every sampled stack. The live bytes of a site are then an estimate whose
//! noise falls as its bytes grow (a site of 1 MiB is seen through about 256 samples). See
//! soak/README.md for the measured cost.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use plateau_sites::{Domain, SiteName, Snapshot};

use super::control;
use super::parse::HeapProfile;
use super::symbolize::{short_name, Frame, Symbolizer};

/// One allocation in 2^12 = 4 KiB is sampled: a leak of 80 B a request in a run of 20 requests
/// an iteration is seen about every 2.5 iterations (a steady staircase of samples the judge reads
/// as the line it is), at about a tenth more run time than no profiling (a default n-sampling run:
/// 5.3 s without, 5.9 s with). Every allocation (2^0) doubles it.
pub const LG_SAMPLE: usize = 12;

/// The heap profile a snapshot dumps, in the run's directory (removed when the run ends).
pub const DUMP_FILE: &str = ".sites-heap.prof";

/// What plateau's own process's sites are recorded with, for sites.jsonl.
pub fn profiler() -> String {
    match control::lg_sample() {
        Some(0) => "jemalloc heap profile, every allocation".to_string(),
        Some(lg) => format!("jemalloc heap profile, one allocation in {} B sampled", 1u64 << lg),
        None => "jemalloc heap profile".to_string(),
    }
}

/// The recorder of plateau's own heap by site.
pub struct HeapSites {
    dump: Option<PathBuf>,
    exe: PathBuf,
    /// The mappings of the last dump (this process's, for the symbolizer at the end).
    maps: String,
    /// Every stack seen, by the key it was recorded under.
    seen: BTreeMap<String, Vec<u64>>,
}

/// The key a stack is recorded under during the run: its return addresses.
fn key(stack: &[u64]) -> String {
    stack.iter().map(|a| format!("{a:x}")).collect::<Vec<_>>().join(";")
}

impl HeapSites {
    /// Starts sampling (jemalloc's profiler must be enabled at start: `prof:true`, which the
    /// `plateau` binary's allocator configuration holds).
    pub fn start() -> Result<HeapSites, String> {
        if !control::enabled() {
            return Err("jemalloc's heap profiler is not enabled in this process (it needs prof:true at start)".into());
        }
        // A process started with the profiler active (a replay's child, MALLOC_CONF) samples as
        // it was told from its first allocation; any other starts here.
        if !control::active() {
            control::reset(LG_SAMPLE)?;
            control::activate()?;
        }
        let exe = std::env::current_exe().map_err(|e| format!("this binary's path: {e}"))?;
        Ok(HeapSites { dump: None, exe, maps: String::new(), seen: BTreeMap::new() })
    }

    /// The live heap by stack now, each stack under its key (named at the end: [`HeapSites::names`],
    /// so that the run's memory holds no debug information); the dump goes into `dir`.
    pub fn snapshot(&mut self, dir: &Path) -> Result<Snapshot, String> {
        let dump = self.dump.get_or_insert_with(|| dir.join(DUMP_FILE)).clone();
        control::dump(&dump)?;
        let text = std::fs::read_to_string(&dump).map_err(|e| format!("{}: {e}", dump.display()))?;
        let profile = HeapProfile::parse(&text).map_err(|e| format!("{}: {e}", dump.display()))?;
        let mut snap = Snapshot { prefix: String::new(), ..Snapshot::default() };
        for (stack, (objects, bytes)) in profile.unbiased() {
            let k = key(stack);
            snap.add(Domain::Jemalloc, &k, bytes.round() as i64, objects.round() as i64, Vec::new);
            self.seen.entry(k).or_insert_with(|| stack.clone());
        }
        self.maps = profile.maps;
        Ok(snap)
    }

    /// Every stack seen, named: its site (`FILE:LINE FUNCTION`, the first frame of the project's
    /// own code past the allocator) and its frames as text, innermost first.
    pub fn names(&self) -> Result<Vec<SiteName>, String> {
        if self.seen.is_empty() {
            return Ok(Vec::new());
        }
        let sym = Symbolizer::new(&self.exe, &self.maps)?;
        let mut frames: BTreeMap<u64, Vec<Frame>> = BTreeMap::new();
        let mut out = Vec::with_capacity(self.seen.len());
        for (k, stack) in &self.seen {
            let flat: Vec<Frame> =
                stack.iter().flat_map(|&a| frames.entry(a).or_insert_with(|| sym.frames(a)).clone()).collect();
            let (name, stack) = site_of(&flat);
            out.push(SiteName { prefix: String::new(), domain: Domain::Jemalloc, key: k.clone(), name, stack });
        }
        Ok(out)
    }
}

/// A stack's site and its frames as text, innermost first: the allocator's frames and the
/// unknown ones before the first known frame left out.
fn site_of(flat: &[Frame]) -> (String, Vec<String>) {
    let unknown = |f: &Frame| f.file.is_none() && f.function.starts_with("0x");
    let frames: Vec<&Frame> = flat.iter().filter(|f| !f.is_allocator()).skip_while(|f| unknown(f)).collect();
    let site = frames
        .iter()
        .find(|f| f.is_project())
        .or_else(|| frames.iter().find(|f| !f.file.as_deref().is_some_and(|p| p.starts_with("target/"))))
        .or(frames.first());
    let name = site.map_or_else(|| "(no frame)".to_string(), |f| text(f));
    (name, frames.iter().map(|f| text(f)).collect())
}

/// A frame as a site names it: `FILE:LINE FUNCTION`, the standard library's files from `library/`.
fn text(f: &Frame) -> String {
    let file = f.file.as_deref().map(|p| match p.find("/library/") {
        Some(i) if p.starts_with("/rustc/") => &p[i + 1..],
        _ => p,
    });
    match (file, f.line) {
        (Some(file), Some(line)) => format!("{file}:{line} {}", short_name(&f.function)),
        (Some(file), None) => format!("{file} {}", short_name(&f.function)),
        _ => short_name(&f.function),
    }
}

impl Drop for HeapSites {
    fn drop(&mut self) {
        if let Some(d) = &self.dump {
            let _ = std::fs::remove_file(d);
        }
    }
}
