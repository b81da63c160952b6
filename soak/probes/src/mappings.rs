//! Mappings: the process's memory map as the kernel lists it, where the project's own mappings
//! came from, and a pmap-style diff of two moments of a run that names what grew outside the heap.
//!
//! Lifecycle of an own mapping: the code that maps memory outside the allocator (the transfer
//! regions of `pd::region`) calls [`record`] with its start, length and caller line when it maps
//! or remaps, and [`forget`] when it unmaps. A snapshot ([`of_process`]) lists every mapping the
//! kernel shows, by name (`[anon:LABEL]`, a file path, a shared-memory or memfd name,
//! `anonymous`), and for each the bytes in it that an own mapping made, by source line. The run
//! takes one snapshot at the end of warm-up and one at its end ([`Snapshots`]); when an
//! outside-heap level fails, [`name_grown`] says which mapping grew, how much per iteration, and,
//! where the mapping is the project's own, the line that mapped it.

use std::collections::BTreeMap;
use std::panic::Location;
use std::sync::Mutex;

use plateau_reports::{Site, Status, Verdict};
use procfs::process::{MMapPath, MemoryMap, Process};
use serde::{Deserialize, Serialize};

/// One mapping as the kernel lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mapping {
    /// `[anon:LABEL]` when the owner labelled it, `anonymous` when not, the path of a file,
    /// shared-memory object or memfd, `[heap]`, `[stack]`...
    pub name: String,
    /// As /proc/<pid>/maps shows them: `rw-p` private, `rw-s` shared.
    pub perms: String,
    pub start: u64,
    pub bytes: u64,
    /// The bytes of this range that the project's own code mapped, by the line that mapped them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mapped_at: Vec<MappedAt>,
    /// The bytes of this range that plateau's allocator (jemalloc) mapped, as its extent hooks
    /// recorded them: its arenas, never a library's mapping. 0 for another process's mappings.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub allocator_bytes: u64,
}

fn is_zero(b: &u64) -> bool {
    *b == 0
}

/// Bytes the project mapped at one source line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MappedAt {
    pub file: String,
    pub line: u32,
    pub bytes: u64,
}

/// One mapping of the project's, mapped now: start, length, the line that mapped it.
type Own = (u64, u64, &'static Location<'static>);

/// Own mappings recorded at most. The table is reserved whole at its first use, so that it costs
/// the heap a constant 2 MiB (allocated, touched only as it fills) instead of growing with the
/// mappings it records: a leak of mappings must not also show as a leak of the heap.
const MAX_OWN: usize = 1 << 16;

/// The project's mappings that are mapped now, sorted by start (they never overlap). Process-wide
/// because the kernel's map is: every region cache of the process records here.
static OWN: Mutex<Vec<Own>> = Mutex::new(Vec::new());

fn own() -> std::sync::MutexGuard<'static, Vec<Own>> {
    // The table holds plain values: a panic elsewhere while it was held leaves it consistent.
    OWN.lock().unwrap_or_else(|e| e.into_inner())
}

/// Records a mapping the project made, `bytes` long from `start`, mapped at `at`. Beyond
/// [`MAX_OWN`] mappings at once, says so (once) and leaves the rest unattributed.
pub fn record(start: u64, bytes: u64, at: &'static Location<'static>) {
    static FULL_SAID: std::sync::Once = std::sync::Once::new();
    let mut t = own();
    if t.capacity() == 0 {
        t.reserve_exact(MAX_OWN);
    }
    let i = t.partition_point(|e| e.0 < start);
    if t.get(i).is_some_and(|e| e.0 == start) {
        t[i] = (start, bytes, at);
    } else if t.len() < MAX_OWN {
        t.insert(i, (start, bytes, at));
    } else {
        FULL_SAID.call_once(|| {
            plateau_shell::errln!(
                "plateau: warning: more than {MAX_OWN} own mappings at once; the rest are not attributed to a line"
            )
        });
    }
}

/// Forgets the mapping that started at `start` (unmapped, or moved by a remap).
pub fn forget(start: u64) {
    let mut t = own();
    if let Ok(i) = t.binary_search_by_key(&start, |e| e.0) {
        t.remove(i);
    }
}

/// The process's mappings now. Empty when /proc cannot be read.
pub fn of_process(p: &Process) -> Vec<Mapping> {
    let Ok(maps) = p.maps() else { return Vec::new() };
    let own = own();
    // The allocator's ranges are this process's: another's (a server plateau spawned) has its own.
    let allocator = if p.pid as u32 == std::process::id() { crate::extents::allocator_ranges() } else { Vec::new() };
    maps.into_iter().map(|m| listed(&m, &own, &allocator)).collect()
}

/// Another process's mappings now (a server under test): none of them is plateau's own, whatever
/// their addresses. Empty when /proc cannot be read.
pub fn of_other_process(p: &Process) -> Vec<Mapping> {
    let Ok(maps) = p.maps() else { return Vec::new() };
    maps.into_iter().map(|m| listed(&m, &[], &[])).collect()
}

/// A kernel mapping, with the bytes of it that own mappings made and that the allocator mapped
/// (`allocator`: sorted ranges). Own mappings are sorted by start and do not overlap, so they are
/// sorted by end too: the ones overlapping `m` are a run.
fn listed(m: &MemoryMap, own: &[Own], allocator: &[(usize, usize)]) -> Mapping {
    let (start, end) = m.address;
    let lo = own.partition_point(|e| e.0 + e.1 <= start);
    let hi = own.partition_point(|e| e.0 < end);
    let mut by_line: BTreeMap<(String, u32), u64> = BTreeMap::new();
    for &(s, len, at) in own.get(lo..hi).unwrap_or_default() {
        let overlap = (s + len).min(end).saturating_sub(s.max(start));
        if overlap > 0 {
            *by_line.entry((at.file().to_string(), at.line())).or_default() += overlap;
        }
    }
    Mapping {
        name: mapping_name(&m.pathname),
        perms: m.perms.as_str().to_string(),
        start,
        bytes: end - start,
        mapped_at: by_line.into_iter().map(|((file, line), bytes)| MappedAt { file, line, bytes }).collect(),
        allocator_bytes: allocator
            .iter()
            .map(|&(a, b)| (b as u64).min(end).saturating_sub((a as u64).max(start)))
            .sum(),
    }
}

fn mapping_name(p: &MMapPath) -> String {
    match p {
        MMapPath::Anonymous => "anonymous".to_string(),
        MMapPath::Path(path) => path.display().to_string(),
        MMapPath::Heap => "[heap]".to_string(),
        MMapPath::Stack => "[stack]".to_string(),
        MMapPath::TStack(t) => format!("[stack:{t}]"),
        MMapPath::Other(o) => format!("[{o}]"),
        MMapPath::Vsys(key) => format!("SYSV{key:08x} (System V shared memory)"),
        MMapPath::Vdso => "[vdso]".to_string(),
        MMapPath::Vvar => "[vvar]".to_string(),
        MMapPath::Vsyscall => "[vsyscall]".to_string(),
        MMapPath::Rollup => "[rollup]".to_string(),
    }
}

/// The process's mappings at the first quiescent point after warm-up and at the end of the run;
/// for a deployment (`--topology`), each role's process's too, under its role.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Snapshots {
    pub start_iter: u64,
    pub end_iter: u64,
    pub start: Vec<Mapping>,
    pub end: Vec<Mapping>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub roles: BTreeMap<String, RoleMaps>,
}

/// One role's process's mappings at the same two moments as the run's.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RoleMaps {
    pub start: Vec<Mapping>,
    pub end: Vec<Mapping>,
}

/// One address range that grew between the snapshots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrownRange {
    pub name: String,
    pub perms: String,
    pub start: u64,
    pub end: u64,
    /// Bytes of the range that were not mapped at the first snapshot.
    pub grown_bytes: u64,
    /// Whether the allocator mapped most of the range (its arenas).
    pub allocator: bool,
}

impl Snapshots {
    /// Puts each role's mappings into the snapshot `which` picks (its start or its end).
    pub fn set_roles(
        &mut self,
        maps: BTreeMap<String, Vec<Mapping>>,
        which: impl Fn(&mut RoleMaps) -> &mut Vec<Mapping>,
    ) {
        for (role, m) in maps {
            *which(self.roles.entry(role).or_default()) = m;
        }
    }

    /// One role's process's snapshots, as those of a run of its own.
    fn of_role(&self, role: &str) -> Option<Snapshots> {
        let r = self.roles.get(role)?;
        Some(Snapshots {
            start_iter: self.start_iter,
            end_iter: self.end_iter,
            start: r.start.clone(),
            end: r.end.clone(),
            roles: BTreeMap::new(),
        })
    }

    /// Ranges mapped at the end that were not (wholly) mapped at the start, largest growth first.
    /// Adjacent anonymous mappings with the same permissions are merged by the kernel, so a leak
    /// of many mappings can show as one range that grew.
    pub fn grown(&self) -> Vec<GrownRange> {
        let mut v: Vec<GrownRange> = self
            .end
            .iter()
            .map(|e| {
                let (e0, e1) = (e.start, e.start + e.bytes);
                let overlap: u64 = self
                    .start
                    .iter()
                    .map(|s| (s.start.max(e0), (s.start + s.bytes).min(e1)))
                    .filter(|(a, b)| a < b)
                    .map(|(a, b)| b - a)
                    .sum();
                GrownRange {
                    name: e.name.clone(),
                    perms: e.perms.clone(),
                    start: e0,
                    end: e1,
                    grown_bytes: e.bytes - overlap.min(e.bytes),
                    allocator: 2 * e.allocator_bytes >= e.bytes,
                }
            })
            .filter(|g| g.grown_bytes > 0)
            .collect();
        v.sort_by(|a, b| b.grown_bytes.cmp(&a.grown_bytes).then(a.start.cmp(&b.start)));
        v
    }

    /// The project's own mapped bytes that grew between the snapshots, by the line that mapped
    /// them, largest first.
    pub fn own_growth(&self) -> Vec<MappedAt> {
        let totals = |maps: &[Mapping]| {
            let mut t: BTreeMap<(String, u32), u64> = BTreeMap::new();
            for a in maps.iter().flat_map(|m| &m.mapped_at) {
                *t.entry((a.file.clone(), a.line)).or_default() += a.bytes;
            }
            t
        };
        let before = totals(&self.start);
        let mut grown: Vec<MappedAt> = totals(&self.end)
            .into_iter()
            .filter_map(|((file, line), bytes)| {
                let was = before.get(&(file.clone(), line)).copied().unwrap_or(0);
                (bytes > was).then(|| MappedAt { file, line, bytes: bytes - was })
            })
            .collect();
        grown.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| (&a.file, a.line).cmp(&(&b.file, b.line))));
        grown
    }
}

/// What a grown range that plateau's own code did not map is: the allocator's arena (its extent
/// hooks recorded it), else a library's mapping.
fn unowned(g: &GrownRange) -> &'static str {
    if g.allocator {
        "; the allocator's own arena (jemalloc mapped it for the heap: its extents, not a library's mapping; see mappings.json)"
    } else {
        "; none of it mapped by plateau's own code (a library's mapping: see mappings.json)"
    }
}

/// Adds to a verdict whose outside-heap levels fail the mapping that grew (name, permissions,
/// range, bytes per iteration) and, where the project mapped it, the lines that did with their
/// bytes per iteration (as the failing metrics' `sites`).
/// For a deployment, each role whose outside-heap levels fail is named from its own process's
/// snapshots (`decode.target.proc.anon_outside_heap` from the decode process's mappings).
pub fn name_grown(snap: &Snapshots, v: &mut Verdict) {
    let failing_roles: std::collections::BTreeSet<Option<&str>> = v
        .metrics
        .iter()
        .filter(|m| m.status == Status::Fail && m.location.as_deref().is_some_and(outside))
        .map(|m| role_of(&m.name, snap))
        .collect();
    for role in failing_roles {
        match role {
            None => name_grown_in(snap, None, v),
            Some(r) => {
                if let Some(s) = snap.of_role(r) {
                    name_grown_in(&s, Some(r), v);
                }
            }
        }
    }
}

/// Whether a failing metric's location says it is memory outside an allocator's heap.
fn outside(location: &str) -> bool {
    location.starts_with("outside the heap") || location.starts_with("process memory (no allocator")
}

/// The deployment role a metric is about (`decode.target.proc.rss` is the decode role's), if any.
fn role_of<'a>(metric: &str, snap: &'a Snapshots) -> Option<&'a str> {
    snap.roles.keys().map(String::as_str).find(|r| metric.strip_prefix(r).is_some_and(|t| t.starts_with('.')))
}

/// Names the growth of one process's snapshots (`role`'s, or the run's own) on the failing
/// outside-heap metrics about it.
fn name_grown_in(snap: &Snapshots, role: Option<&str>, v: &mut Verdict) {
    const MIB: f64 = 1024.0 * 1024.0;
    let about = |name: &str| match role {
        Some(r) => name.strip_prefix(r).is_some_and(|t| t.starts_with('.')),
        None => role_of(name, snap).is_none(),
    };
    let grown = snap.grown();
    let Some(g) = grown.first() else { return };
    let iters = snap.end_iter.saturating_sub(snap.start_iter).max(1) as f64;
    let fmt = |b: f64| plateau_reports::figures::fmt_value(b, "bytes");
    let total: u64 = grown.iter().map(|g| g.grown_bytes).sum();
    let name = format!("{} {} mapping {:#x}-{:#x}", g.name, g.perms, g.start, g.end);
    let own = snap.own_growth();
    let sites: Vec<Site> = own
        .iter()
        .map(|a| Site {
            function: plateau_reports::fsutil::source_function(&a.file, a.line),
            file: a.file.clone(),
            line: a.line,
            bytes_per_iter: Some(a.bytes as f64 / iters),
            bytes_per_request: v.requests_per_iter.filter(|r| *r > 0.0).map(|r| a.bytes as f64 / iters / r),
            ..Site::default()
        })
        .collect();
    let mut line = format!(
        "mapping: the {name} grew by {:.1} MiB between iterations {} and {} ({}/iteration{})",
        g.grown_bytes as f64 / MIB,
        snap.start_iter,
        snap.end_iter,
        fmt(g.grown_bytes as f64 / iters),
        if grown.len() > 1 {
            format!("; {} mappings grew, {:.1} MiB in all", grown.len(), total as f64 / MIB)
        } else {
            String::new()
        }
    );
    let said: Vec<String> = sites
        .iter()
        .map(|s| format!("{}/iteration mapped at {}", fmt(s.bytes_per_iter.unwrap_or(0.0)), s.place()))
        .collect();
    let in_target = v.metrics.iter().any(|m| m.status == Status::Fail && m.name.starts_with("target."));
    if let Some(r) = role {
        line.push_str(&format!(" in the {r} process (see mappings.json, roles.{r})"));
    } else if in_target {
        line.push_str(" in the target server's process (see mappings.json)");
    } else if said.is_empty() {
        line.push_str(unowned(g));
    } else {
        line.push_str(&format!("; plateau's own mappings still mapped: {}", said.join(", ")));
    }
    for m in v.metrics.iter_mut().filter(|m| m.status == Status::Fail && about(&m.name)) {
        if let Some(l) = m.location.as_mut().filter(|l| outside(l)) {
            l.push_str(&format!("; growing mapping: {name}"));
            if let Some(top) = sites.first() {
                l.push_str(&format!(", mapped at {}", top.place()));
            }
            // Allocation sites a profiled replay named stay: they say more than where a mapping was made.
            if m.sites.is_empty() {
                m.sites = sites.clone();
            }
        }
    }
    v.attribution.push(line);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(name: &str, start: u64, bytes: u64, mapped_at: Vec<MappedAt>) -> Mapping {
        Mapping { name: name.into(), perms: "rw-p".into(), start, bytes, mapped_at, allocator_bytes: 0 }
    }

    fn at(line: u32, bytes: u64) -> MappedAt {
        MappedAt { file: "soak/pd/src/region.rs".into(), line, bytes }
    }

    #[test]
    fn growth_by_range_and_by_own_line() {
        let snap = Snapshots {
            start_iter: 20,
            end_iter: 60,
            start: vec![map("anonymous", 0x1000, 0x2000, vec![at(10, 0x1000)])],
            end: vec![
                map("anonymous", 0x1000, 0x6000, vec![at(10, 0x1000), at(20, 0x3000)]),
                map("/dev/shm/x", 0x10000, 0x1000, vec![]),
            ],
            roles: BTreeMap::new(),
        };
        let g = snap.grown();
        assert_eq!(g.len(), 2);
        assert_eq!((g[0].start, g[0].grown_bytes), (0x1000, 0x4000));
        assert_eq!(g[1].name, "/dev/shm/x");
        assert_eq!(snap.own_growth(), vec![at(20, 0x3000)]);
    }

    #[test]
    fn own_mappings_are_attributed_to_the_kernel_ranges_they_overlap() {
        let here = Location::caller();
        let own = [(0x1000, 0x2000, here), (0x5000, 0x1000, here), (0x8000, 0x1000, here)];
        let m = MemoryMap {
            address: (0x2000, 0x6000),
            perms: procfs::process::MMPermissions::READ,
            offset: 0,
            dev: (0, 0),
            inode: 0,
            pathname: MMapPath::Anonymous,
            extension: Default::default(),
        };
        let l = listed(&m, &own, &[(0x1000, 0x3000), (0x5800, 0x7000)]);
        assert_eq!(l.mapped_at, vec![MappedAt { file: here.file().into(), line: here.line(), bytes: 0x2000 }]);
        assert_eq!(l.name, "anonymous");
        assert_eq!(l.allocator_bytes, 0x1000 + 0x800, "the allocator's ranges, clipped to the mapping");
    }

    #[test]
    fn a_grown_arena_of_the_allocator_is_named_as_the_allocator_s() {
        let arena = |bytes| Mapping { allocator_bytes: bytes, ..map("anonymous", 0x10000, bytes, vec![]) };
        let snap = Snapshots {
            start_iter: 20,
            end_iter: 60,
            start: vec![arena(0x2000)],
            end: vec![arena(0x8000)],
            roles: BTreeMap::new(),
        };
        let g = &snap.grown()[0];
        assert!(g.allocator && unowned(g).contains("the allocator's own arena"));
        let library = Snapshots {
            start: vec![map("anonymous", 0x10000, 0x2000, vec![])],
            end: vec![map("anonymous", 0x10000, 0x8000, vec![])],
            ..snap.clone()
        };
        assert!(unowned(&library.grown()[0]).contains("a library's mapping"));
    }
}
