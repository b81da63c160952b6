//! Probes: what a sample reads. jemalloc's statistics (after advancing its epoch), the kernel's
//! view of the process (/proc through procfs), and every registry of the engine's `stats()`.
//! Each probe's own cost is measured and recorded with the sample.

use std::collections::BTreeMap;
use std::time::Instant;

use plateau_engine::Metric;
use plateau_reports::{Kind, MetricSpec};
use procfs::process::{MMapPath, Process};

/// jemalloc statistics sampled, all gauges in bytes.
pub const JEMALLOC: [&str; 6] = ["allocated", "active", "resident", "mapped", "retained", "metadata"];
/// /proc figures sampled: (name, unit).
pub const PROC: [(&str, &str); 9] = [
    ("rss", "bytes"),
    ("anon_outside_heap", "bytes"),
    ("rss_anon", "bytes"),
    ("rss_file", "bytes"),
    ("swap", "bytes"),
    ("anon_mappings", "count"),
    ("anon_bytes", "bytes"),
    ("fds", "count"),
    ("threads", "count"),
];

/// One anonymous mapping as the kernel lists it: its name (`[anon:NAME]` when the owner named it,
/// else `anonymous`), and its size.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AnonMapping {
    pub name: String,
    pub perms: String,
    pub start: u64,
    pub bytes: u64,
}

/// The process-wide probes (allocator and kernel view) of the process that runs them.
pub struct ProcessProbes {
    proc: Option<Process>,
}

impl Default for ProcessProbes {
    fn default() -> Self {
        Self::new()
    }
}

impl ProcessProbes {
    pub fn new() -> Self {
        ProcessProbes { proc: Process::myself().ok() }
    }

    /// Metric specs of the process probes, names prefixed with `prefix` (a role, or empty).
    pub fn specs(prefix: &str) -> BTreeMap<String, MetricSpec> {
        let mut m = BTreeMap::new();
        for j in JEMALLOC {
            m.insert(
                format!("{prefix}jemalloc.{j}"),
                MetricSpec { kind: Kind::Gauge, unit: "bytes".into(), capacity: None },
            );
        }
        for (p, unit) in PROC {
            // Judged: anonymous memory outside the allocator's resident pages, and the anonymous
            // mappings' size. Plotted only: RSS and its file-backed part, which come and go with
            // what the kernel keeps cached, and RssAnon, whose heap part jemalloc's own gauges
            // judge exactly (its page-granular settling would only add noise).
            let kind = if matches!(p, "rss" | "rss_file" | "rss_anon") { Kind::Counter } else { Kind::Gauge };
            m.insert(format!("{prefix}proc.{p}"), MetricSpec { kind, unit: unit.into(), capacity: None });
        }
        m
    }

    /// Reads jemalloc and /proc into `values`, each probe's cost into `cost_us`. At a quiescent
    /// point (`settle`) the allocator is first settled: this thread's cache flushed, so that
    /// `allocated` counts exactly the live bytes, and dirty pages purged, so that RSS shows what is
    /// live rather than what the allocator happens to keep.
    pub fn sample(
        &mut self,
        prefix: &str,
        settle: bool,
        values: &mut BTreeMap<String, f64>,
        cost_us: &mut BTreeMap<String, f64>,
    ) {
        let t0 = Instant::now();
        if settle {
            settle_allocator();
        }
        read_jemalloc(prefix, values);
        let t1 = Instant::now();
        cost_us.insert("jemalloc".into(), (t1 - t0).as_secs_f64() * 1e6);
        if let Some(p) = &self.proc {
            read_proc(p, prefix, values);
        }
        let (anon, heap) =
            (values.get(&format!("{prefix}proc.rss_anon")), values.get(&format!("{prefix}jemalloc.resident")));
        if let (Some(anon), Some(heap)) = (anon, heap) {
            values.insert(format!("{prefix}proc.anon_outside_heap"), anon - heap);
        }
        cost_us.insert("proc".into(), t1.elapsed().as_secs_f64() * 1e6);
    }

    pub fn process(&self) -> Option<&Process> {
        self.proc.as_ref()
    }

    /// The process's anonymous mappings now, for a pmap-style diff.
    pub fn anon_mappings(&self) -> Vec<AnonMapping> {
        self.proc.as_ref().and_then(|p| anon_mappings(p).ok()).unwrap_or_default()
    }
}

/// Advances jemalloc's epoch and reads its statistics.
pub fn read_jemalloc(prefix: &str, values: &mut BTreeMap<String, f64>) {
    if tikv_jemalloc_ctl::epoch::advance().is_err() {
        return;
    }
    use tikv_jemalloc_ctl::stats;
    let reads = [
        stats::allocated::read(),
        stats::active::read(),
        stats::resident::read(),
        stats::mapped::read(),
        stats::retained::read(),
        stats::metadata::read(),
    ];
    for (name, r) in JEMALLOC.iter().zip(reads) {
        if let Ok(v) = r {
            values.insert(format!("{prefix}jemalloc.{name}"), v as f64);
        }
    }
}

/// Reads /proc/<pid>/status, maps and fd: RSS by kind, swap, threads, anonymous mappings, fds.
pub fn read_proc(p: &Process, prefix: &str, values: &mut BTreeMap<String, f64>) {
    if let Ok(s) = p.status() {
        let kb = |v: Option<u64>| v.map(|x| x as f64 * 1024.0);
        for (name, v) in
            [("rss", kb(s.vmrss)), ("rss_anon", kb(s.rssanon)), ("rss_file", kb(s.rssfile)), ("swap", kb(s.vmswap))]
        {
            if let Some(v) = v {
                values.insert(format!("{prefix}proc.{name}"), v);
            }
        }
        values.insert(format!("{prefix}proc.threads"), s.threads as f64);
    }
    if let Ok(maps) = anon_mappings(p) {
        values.insert(format!("{prefix}proc.anon_mappings"), maps.len() as f64);
        values.insert(format!("{prefix}proc.anon_bytes"), maps.iter().map(|m| m.bytes as f64).sum());
    }
    if let Ok(n) = p.fd_count() {
        values.insert(format!("{prefix}proc.fds"), n as f64);
    }
}

/// Flushes this thread's jemalloc cache and purges every arena's unused dirty pages.
pub fn settle_allocator() {
    for name in [&b"thread.tcache.flush\0"[..], &b"arena.4096.purge\0"[..]] {
        // SAFETY: both names are NUL-terminated void mallctls: no old or new value is read or written.
        let _ = unsafe {
            tikv_jemalloc_sys::mallctl(
                name.as_ptr().cast(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
    }
}

fn anon_mappings(p: &Process) -> procfs::ProcResult<Vec<AnonMapping>> {
    Ok(p.maps()?
        .into_iter()
        .filter_map(|m| {
            let name = match &m.pathname {
                MMapPath::Anonymous => "anonymous".to_string(),
                MMapPath::Other(o) if o.starts_with("anon:") => format!("[{o}]"),
                _ => return None,
            };
            Some(AnonMapping {
                name,
                perms: m.perms.as_str().to_string(),
                start: m.address.0,
                bytes: m.address.1 - m.address.0,
            })
        })
        .collect())
}

/// The engine's registries and counters, with `prefix`.
pub fn sample_engine(stats: &[Metric], prefix: &str, values: &mut BTreeMap<String, f64>) {
    for m in stats {
        values.insert(format!("{prefix}{}", m.name), m.value as f64);
    }
}
