//! sites.jsonl, version 1: the live bytes each allocation site held at every quiescent point of a
//! run, as the run's profiler saw them (jemalloc's heap profile in plateau's own process, memray
//! inside a Python server's processes).
//!
//! One JSON object a line. The first line is the header, `{"schema":"plateau.sites.v1"}`; then,
//! in the order they happened:
//! - `{"process":{...}}`: a process whose sites are recorded from here on: the prefix of its
//!   gauges in samples.jsonl (`target.engine_core.`, `target.`, or `` for plateau's own), its pid
//!   and the profiler and sampling that record it;
//! - `{"site":{...}}`: a site seen for the first time: its id (0, 1, ... in order), the process's
//!   prefix, the allocator layer it allocates from (`domain`), its name (`FILE:LINE FUNCTION` or
//!   `LIBRARY!FUNCTION`) and the stack it was first seen with, innermost frame first;
//! - `{"iter":N,"t":S,"bytes":{"ID":B,...},"objects":{"ID":K,...},"missing":["PREFIX",...]}`: a
//!   quiescent point: the live bytes and objects of every site that changed since the point
//!   before (a site absent keeps its value; one that holds nothing reads 0), and the processes
//!   that could not be read there (their sites are unknown at this point, not unchanged);
//! - `{"note":"..."}`: what kept a process's sites from being recorded, for the verdict to say;
//! - `{"name":{"id":N,"name":"...","stack":[...]}}`: a site's name and stack given after it was
//!   recorded (a profiler that keys sites by their return addresses during the run, and reads
//!   the debug information once at its end, so that the run's memory holds none of it). Sites
//!   that end up with the same name in one process and layer are one site to a reader.
//!
//! Readers ignore fields they do not know. Every bound is explicit: at most [`MAX_SITES`] sites
//! (the rest of a process's are counted under one site, [`OTHER_SITES`]), [`MAX_STACK_FRAMES`]
//! frames a stack, and files of at most [`MAX_FILE_BYTES`].

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub const SITES_SCHEMA: &str = "plateau.sites.v1";
/// The file's name in a run directory.
pub const SITES_FILE: &str = "sites.jsonl";
/// Sites a log holds at most: a server with more distinct allocating lines than this has the
/// rest of them counted together, under [`OTHER_SITES`].
pub const MAX_SITES: usize = 20_000;
/// Frames of a site's stack kept, innermost first.
pub const MAX_STACK_FRAMES: usize = 48;
/// A sites file read at most (a few hundred sites changing at each of ten thousand points is
/// tens of MiB).
pub const MAX_FILE_BYTES: u64 = 1 << 30;
/// The site that counts a process's sites past [`MAX_SITES`].
pub const OTHER_SITES: &str = "(other sites, past the log's bound)";

/// The allocator layer a site allocates from, and so the gauge its bytes are part of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Domain {
    /// plateau's own allocator (jemalloc): `jemalloc.allocated`.
    Jemalloc,
    /// The C library's malloc of another process (Python's larger objects, native code):
    /// `malloc.in_use_bytes`.
    Malloc,
    /// Python's small-object allocator: `py.object_bytes`.
    Pymalloc,
    /// Anonymous mappings a program makes itself: `proc.anon_bytes`.
    Mmap,
}

impl Domain {
    /// The gauge family (after a process's prefix) whose bytes this domain's sites hold.
    pub fn family(self) -> &'static str {
        match self {
            Domain::Jemalloc => "jemalloc.allocated",
            Domain::Malloc => "malloc.in_use_bytes",
            Domain::Pymalloc => "py.object_bytes",
            Domain::Mmap => "proc.anon_bytes",
        }
    }

    pub const ALL: [Domain; 4] = [Domain::Jemalloc, Domain::Malloc, Domain::Pymalloc, Domain::Mmap];
}

/// A process whose sites are recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Process {
    /// The prefix of its gauges in samples.jsonl (`target.engine_core.`; empty for plateau's own).
    pub prefix: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<i32>,
    /// The profiler and how it samples (`jemalloc heap profile, 1 in 4 KiB sampled`).
    pub profiler: String,
}

/// A site as first seen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SiteDef {
    pub id: u32,
    pub prefix: String,
    pub domain: Domain,
    /// `FILE:LINE FUNCTION` (the file relative to its package) or `LIBRARY!FUNCTION`.
    pub name: String,
    /// The stack it was first seen with, innermost frame first, at most [`MAX_STACK_FRAMES`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stack: Vec<String>,
}

/// What one process's profiler saw at a quiescent point: each site's live bytes and objects
/// (sites holding nothing may be left out), with a stack for sites not yet known.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub prefix: String,
    pub sites: BTreeMap<(Domain, String), Live>,
}

/// A site's live memory at a point.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Live {
    pub bytes: i64,
    pub objects: i64,
    pub stack: Vec<String>,
}

impl Snapshot {
    /// Adds `bytes` and `objects` to site `name` of `domain` (stacks merged by their site).
    pub fn add(&mut self, domain: Domain, name: &str, bytes: i64, objects: i64, stack: impl FnOnce() -> Vec<String>) {
        let e = self.sites.entry((domain, name.to_string())).or_default();
        if e.stack.is_empty() {
            e.stack = stack();
            e.stack.truncate(MAX_STACK_FRAMES);
        }
        e.bytes += bytes;
        e.objects += objects;
    }
}

/// A site's name given at the end of a run, for the site recorded under `key`.
#[derive(Debug, Clone, PartialEq)]
pub struct SiteName {
    pub prefix: String,
    pub domain: Domain,
    pub key: String,
    pub name: String,
    pub stack: Vec<String>,
}

/// What a target recorded of its processes' sites at a quiescent point: processes recorded from
/// now on, notes on what could not be recorded, and one snapshot per process read.
#[derive(Debug, Default)]
pub struct Recorded {
    pub processes: Vec<Process>,
    pub notes: Vec<String>,
    pub snapshots: Vec<Snapshot>,
}

#[derive(Serialize)]
struct RowOut<'a> {
    iter: u64,
    t: f64,
    bytes: BTreeMap<u32, i64>,
    objects: BTreeMap<u32, i64>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    missing: &'a [String],
}

/// Writes sites.jsonl as a run goes: each row holds what changed since the row before, and is
/// on disk once written (a run killed mid-way keeps its sites so far).
pub struct SitesWriter {
    path: PathBuf,
    out: std::io::BufWriter<std::fs::File>,
    ids: BTreeMap<(String, Domain, String), u32>,
    last: BTreeMap<u32, (i64, i64)>,
    /// The processes recorded so far, by prefix.
    prefixes: Vec<String>,
}

impl SitesWriter {
    pub fn create(path: &Path) -> Result<SitesWriter, String> {
        let err = |e: std::io::Error| format!("{}: {e}", path.display());
        let f = std::fs::File::create(path).map_err(err)?;
        let mut w = SitesWriter {
            path: path.to_path_buf(),
            out: std::io::BufWriter::new(f),
            ids: BTreeMap::new(),
            last: BTreeMap::new(),
            prefixes: Vec::new(),
        };
        w.line(&serde_json::json!({ "schema": SITES_SCHEMA }))?;
        Ok(w)
    }

    fn line(&mut self, v: &impl Serialize) -> Result<(), String> {
        let err = |e: String| format!("{}: {e}", self.path.display());
        let mut text = serde_json::to_string(v).map_err(|e| err(e.to_string()))?;
        text.push('\n');
        self.out.write_all(text.as_bytes()).map_err(|e| err(e.to_string()))
    }

    /// A process whose sites are recorded from now on.
    pub fn process(&mut self, p: &Process) -> Result<(), String> {
        if !self.prefixes.contains(&p.prefix) {
            self.prefixes.push(p.prefix.clone());
        }
        self.line(&serde_json::json!({ "process": p }))
    }

    /// What kept sites from being recorded (said in the verdict).
    pub fn note(&mut self, note: &str) -> Result<(), String> {
        self.line(&serde_json::json!({ "note": note }))?;
        self.flush()
    }

    /// A quiescent point: `snapshots` of the processes read there (a process recorded before
    /// and not among them is missing at this point).
    pub fn row(&mut self, iter: u64, t: f64, snapshots: &[Snapshot]) -> Result<(), String> {
        let mut now: BTreeMap<u32, (i64, i64)> = BTreeMap::new();
        for s in snapshots {
            for ((domain, name), live) in &s.sites {
                let id = self.id(&s.prefix, *domain, name, &live.stack)?;
                let e = now.entry(id).or_default();
                e.0 += live.bytes;
                e.1 += live.objects;
            }
        }
        let read: Vec<&str> = snapshots.iter().map(|s| s.prefix.as_str()).collect();
        let missing: Vec<String> = self.prefixes.iter().filter(|p| !read.contains(&p.as_str())).cloned().collect();
        let site_prefix: BTreeMap<u32, &str> = self.ids.iter().map(|(k, id)| (*id, k.0.as_str())).collect();
        let (mut bytes, mut objects) = (BTreeMap::new(), BTreeMap::new());
        // Sites of a process read here that hold nothing now read 0; a missing process's keep
        // their values (the reader marks them unknown at this point).
        for (&id, &(b, o)) in &self.last {
            let of_read = site_prefix.get(&id).is_some_and(|p| read.contains(p));
            if of_read && !now.contains_key(&id) && (b, o) != (0, 0) {
                bytes.insert(id, 0);
                objects.insert(id, 0);
            }
        }
        for (&id, &(b, o)) in &now {
            if self.last.get(&id) != Some(&(b, o)) {
                bytes.insert(id, b);
                objects.insert(id, o);
            }
        }
        for (id, _) in bytes.iter() {
            let v = (now.get(id).map_or(0, |x| x.0), now.get(id).map_or(0, |x| x.1));
            self.last.insert(*id, v);
        }
        self.line(&RowOut { iter, t, bytes, objects, missing: &missing })?;
        self.flush()
    }

    /// Writes what a target recorded at the quiescent point of iteration `iter`.
    pub fn write(&mut self, iter: u64, t: f64, r: Recorded) -> Result<(), String> {
        for p in &r.processes {
            self.process(p)?;
        }
        for n in &r.notes {
            self.note(n)?;
        }
        self.row(iter, t, &r.snapshots)
    }

    /// Names the sites recorded under provisional keys (see the module's doc).
    pub fn names(&mut self, names: &[SiteName]) -> Result<(), String> {
        for n in names {
            let Some(&id) = self.ids.get(&(n.prefix.clone(), n.domain, n.key.clone())) else { continue };
            let mut stack = n.stack.clone();
            stack.truncate(MAX_STACK_FRAMES);
            self.line(&serde_json::json!({ "name": { "id": id, "name": n.name, "stack": stack } }))?;
        }
        self.flush()
    }

    /// The id of a site, defining it at first sight; past [`MAX_SITES`], the process's
    /// [`OTHER_SITES`].
    fn id(&mut self, prefix: &str, domain: Domain, name: &str, stack: &[String]) -> Result<u32, String> {
        let key = (prefix.to_string(), domain, name.to_string());
        if let Some(id) = self.ids.get(&key) {
            return Ok(*id);
        }
        let (key, stack) = if self.ids.len() + 1 >= MAX_SITES {
            ((prefix.to_string(), domain, OTHER_SITES.to_string()), &[][..])
        } else {
            (key, stack)
        };
        if let Some(id) = self.ids.get(&key) {
            return Ok(*id);
        }
        let id = self.ids.len() as u32;
        let def = SiteDef { id, prefix: key.0.clone(), domain, name: key.2.clone(), stack: stack.to_vec() };
        self.ids.insert(key, id);
        self.line(&serde_json::json!({ "site": def }))?;
        Ok(id)
    }

    pub fn flush(&mut self) -> Result<(), String> {
        self.out.flush().map_err(|e| format!("{}: {e}", self.path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SiteLog;

    fn snap(prefix: &str, sites: &[(&str, i64)]) -> Snapshot {
        let mut s = Snapshot { prefix: prefix.into(), ..Snapshot::default() };
        for (name, b) in sites {
            s.add(Domain::Malloc, name, *b, 1, || vec![format!("{name} frame")]);
        }
        s
    }

    #[test]
    fn rows_hold_changes_and_read_back_as_whole_series() {
        let dir = std::env::temp_dir().join(format!("plateau-sites-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(SITES_FILE);
        let mut w = SitesWriter::create(&path).unwrap();
        w.process(&Process { prefix: "target.".into(), pid: Some(7), profiler: "test".into() }).unwrap();
        w.row(0, 0.0, &[snap("target.", &[("a.py:1 f", 100), ("b.py:2 g", 50)])]).unwrap();
        w.row(1, 1.0, &[snap("target.", &[("a.py:1 f", 200), ("b.py:2 g", 50)])]).unwrap();
        w.row(2, 2.0, &[]).unwrap(); // the process could not be read here
        w.row(3, 3.0, &[snap("target.", &[("a.py:1 f", 300)])]).unwrap();
        drop(w);
        let text = std::fs::read_to_string(&path).unwrap();
        let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("{\"iter\"")).collect();
        assert_eq!(rows[1], r#"{"iter":1,"t":1.0,"bytes":{"0":200},"objects":{"0":1}}"#, "only what changed");
        assert!(rows[2].contains(r#""missing":["target."]"#), "{}", rows[2]);
        let log = SiteLog::read(&path).unwrap();
        assert_eq!(log.sites.len(), 2);
        assert_eq!(log.sites[0].stack, vec!["a.py:1 f frame".to_string()]);
        assert_eq!(log.series(0), vec![(0, 100.0), (1, 200.0), (3, 300.0)]);
        assert_eq!(log.series(1), vec![(0, 50.0), (1, 50.0), (3, 0.0)], "a site no longer seen holds nothing");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sites_named_at_the_end_with_one_name_read_as_one() {
        let dir = std::env::temp_dir().join(format!("plateau-sites-names-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(SITES_FILE);
        let mut w = SitesWriter::create(&path).unwrap();
        w.row(0, 0.0, &[snap("", &[("0x1;0x2", 100), ("0x1;0x3", 10)])]).unwrap();
        w.row(1, 1.0, &[snap("", &[("0x1;0x2", 200), ("0x1;0x3", 10), ("0x9", 5)])]).unwrap();
        w.row(2, 2.0, &[snap("", &[("0x1;0x3", 30), ("0x9", 5)])]).unwrap();
        let name = |key: &str, name: &str| SiteName {
            prefix: String::new(),
            domain: Domain::Malloc,
            key: key.into(),
            name: name.into(),
            stack: vec![format!("{name} at {key}")],
        };
        w.names(&[name("0x1;0x2", "a.rs:1 f"), name("0x1;0x3", "a.rs:1 f"), name("0x9", "b.rs:2 g")]).unwrap();
        drop(w);
        let log = SiteLog::read(&path).unwrap();
        let names: Vec<&str> = log.sites.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, vec!["a.rs:1 f", "b.rs:2 g"]);
        assert_eq!(log.series(0), vec![(0, 110.0), (1, 210.0), (2, 30.0)]);
        assert_eq!(log.series(1), vec![(0, 0.0), (1, 5.0), (2, 5.0)]);
        assert_eq!(log.sites[0].stack, vec!["a.rs:1 f at 0x1;0x2".to_string()], "the first one's stack");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sites_past_the_bound_are_counted_together() {
        let dir = std::env::temp_dir().join(format!("plateau-sites-bound-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut w = SitesWriter::create(&dir.join(SITES_FILE)).unwrap();
        let names: Vec<String> = (0..MAX_SITES + 5).map(|k| format!("f.py:{k} f")).collect();
        let mut s = Snapshot { prefix: "".into(), ..Snapshot::default() };
        for n in &names {
            s.add(Domain::Malloc, n, 1, 1, Vec::new);
        }
        w.row(0, 0.0, &[s]).unwrap();
        drop(w);
        let log = SiteLog::read(&dir.join(SITES_FILE)).unwrap();
        assert_eq!(log.sites.len(), MAX_SITES);
        let other = log.sites.iter().position(|s| s.name == OTHER_SITES).unwrap();
        assert_eq!(log.series(other), vec![(0, 6.0)]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
