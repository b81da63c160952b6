//! Where inside someone else's server: the profiled replay of an external run, which names the
//! function and line that allocated what the server kept.
//!
//! Lifecycle:
//! 1. During the run, before plateau stops the server, what kind of program it is goes into
//!    `server.json` (`kind.rs`): Python, native on the C library's malloc, or a program with an
//!    allocator of its own.
//! 2. When a process-memory gauge of the server fails (or with `--profile`) and plateau started
//!    it (`--spawn`), the same scenario and seed run again against a fresh server started under a
//!    profiler: memray for Python (`memray.rs`: the process that grew records its allocations over
//!    the window, started and stopped through plateau's hook), a preloaded jemalloc with plateau's
//!    dump trigger for a native server
//!    (`native.rs`: the live heap dumped at the replay's quiescent points). The replay is the same
//!    run loop; it marks its window's three quiescent points (the end of warm-up, the middle, the
//!    end) in `profile-window.json`.
//! 3. What was allocated between the marks and still held, by allocation stack, counted where it
//!    grew in both halves of the window (a leak does; memory alive at one point and not another
//!    does not), becomes growth.txt, growth.pb.gz, growth.svg and growth.json, and the failing
//!    gauge names the top lines, as for plateau's own engine.
//!
//! A server with an allocator of its own is named as such: no preloaded profiler sees its heap,
//! and the mapping diff is what says where memory grew.

pub mod kind;
pub mod native;

use std::path::{Path, PathBuf};
use std::process::Command;

pub use kind::{classify, ServerKind};
use plateau_profile::replay::{Explains, LiveHeap};
use plateau_profile::{Growth, GrowthRecord};

pub use plateau_driver::SERVERS_FILE;

/// The environment variable that tells plateau's dump trigger, preloaded into a native server,
/// where plateau asks for dumps.
pub const DUMP_REQUEST_ENV: &str = "PLATEAU_DUMP_REQUEST";

/// A replay's growth within this factor of the run's reproduces it. Wider than for plateau's own
/// engine (2): the run measured the kernel's pages of a process tree, the replay the live bytes one
/// allocator hands out, and a server's own caching of freed memory (Python's object arenas, the C
/// library's bins) sits between the two; a factor of 4 still tells a leak that kept the rate from
/// memory that came once.
const REPRODUCED_WITHIN: f64 = 4.0;

/// The window a replay marked: (iteration, wall clock in ms) at its start, middle and end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub iters: [u64; 3],
    pub unix_ms: [u64; 3],
}

impl Window {
    /// Reads `profile-window.json` from a replay's directory.
    pub fn read(dir: &Path) -> Result<Window, String> {
        let p = dir.join("profile-window.json");
        let text = std::fs::read_to_string(&p)
            .map_err(|e| format!("{}: {e} (did the replay reach its window?)", p.display()))?;
        let marks: Vec<serde_json::Value> = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))?;
        let mut w = Window { iters: [0; 3], unix_ms: [0; 3] };
        for (k, edge) in ["start", "mid", "end"].iter().enumerate() {
            let m = marks
                .iter()
                .find(|m| m["edge"] == *edge)
                .ok_or_else(|| format!("{}: no `{edge}` mark (the replay ended before its window did)", p.display()))?;
            w.iters[k] = m["iter"].as_u64().ok_or_else(|| format!("{}: `{edge}` has no iteration", p.display()))?;
            w.unix_ms[k] = m["unix_ms"].as_u64().ok_or_else(|| format!("{}: `{edge}` has no time", p.display()))?;
        }
        Ok(w)
    }
}

/// What an external run started, as its profiled replay starts it again.
pub enum Launch<'a> {
    /// One server (`--target URL --spawn CMD`), all of it under the profiler.
    Server { url: &'a str, spawn: &'a str },
    /// A deployment (`--topology FILE`, with the run's injections for its `{inject}`), of which
    /// only `role`'s process runs under the profiler: the rest run as they did.
    Role { topology: &'a Path, injections: &'a [String], role: &'a str },
}

impl Launch<'_> {
    fn args(&self, env: &[(String, String)]) -> Vec<String> {
        let mut a = Vec::new();
        let env_key = |k: &str| match self {
            Launch::Server { .. } => k.to_string(),
            Launch::Role { role, .. } => format!("{role}:{k}"),
        };
        match self {
            Launch::Server { url, spawn } => {
                a.extend(["--target".to_string(), url.to_string(), "--spawn".into(), spawn.to_string()])
            }
            Launch::Role { topology, injections, .. } => {
                a.extend(["--topology".to_string(), topology.display().to_string()]);
                for i in *injections {
                    a.extend(["--inject".to_string(), i.clone()]);
                }
            }
        }
        for (k, v) in env {
            a.extend(["--spawn-env".to_string(), format!("{}={v}", env_key(k))]);
        }
        a
    }
}

/// A profiled replay of an external run to run.
pub struct ExternalReplay<'a> {
    /// The `plateau` binary (this one).
    pub exe: &'a Path,
    /// The scenario as the user named it.
    pub scenario: &'a str,
    pub seed: u64,
    /// What the replay starts, and which process of it runs under the profiler.
    pub launch: &'a Launch<'a>,
    /// The run's other target flags, passed on as given (timeouts, concurrency, metrics map).
    pub target_args: Vec<String>,
    pub explains: Explains<'a>,
    pub kind: &'a ServerKind,
    /// The other gauges of the process's memory its live heap is weighed against too.
    pub also: Vec<String>,
}

impl ExternalReplay<'_> {
    fn out(&self) -> PathBuf {
        self.explains.run_dir.join("replay")
    }

    fn args(&self, env: &[(String, String)]) -> Vec<String> {
        let window = (self.explains.start_iter, self.explains.end_iter);
        let mut a = plateau_profile::replay::window_run_args(self.scenario, self.seed, window, &self.out());
        a.extend(self.target_args.iter().cloned());
        a.extend(self.launch.args(env));
        a
    }

    /// The replay as a person would type it.
    pub fn command(&self, env: &[(String, String)]) -> String {
        let quote = |s: &str| if s.contains(' ') || s.contains('"') { format!("{s:?}") } else { s.to_string() };
        format!("plateau {}", self.args(env).iter().map(|a| quote(a)).collect::<Vec<_>>().join(" "))
    }

    /// Runs the replay and writes growth.txt, growth.pb.gz, growth.svg and growth.json into the
    /// run's directory. An error says why nothing could be named (the caller keeps the verdict).
    pub fn run(&self) -> Result<GrowthRecord, String> {
        let out = self.out();
        let _ = std::fs::remove_dir_all(&out);
        // The replay's own run directory, marked before the profiler's files go in.
        plateau_reports::fsutil::claim_run_dir(&out)?;
        let env = match self.kind {
            ServerKind::Native { .. } => native::prepare(&out)?,
            ServerKind::Python { .. } | ServerKind::OwnAllocator { .. } => return Err(self.kind.describe()),
        };
        let command = self.command(&env);
        plateau_profile::replay::run_to_its_end(Command::new(self.exe).args(self.args(&env)))?;
        let window = Window::read(&out)?;
        let growth: Growth = native::growth(&out, &window)?;
        let live_heap = LiveHeap {
            bytes_per_iter: growth.net_bytes_per_iter(),
            source: "jemalloc's heap dumps".into(),
            also: self.also.clone(),
        };
        self.explains.record(&growth, (window.iters[0], window.iters[2]), REPRODUCED_WITHIN, command, Some(live_heap))
    }
}
