//! The layers of a Python server's memory, read inside each of its processes: plateau's hook
//! (`sitecustomize.py`) is put first on the PYTHONPATH of every server it starts, so each Python
//! process of the server, the ones multiprocessing starts included, answers on a Unix socket of its
//! own. At each quiescent sample every process of the tree that answers gives:
//! - `py.object_bytes`: what Python's small objects (up to 512 bytes: most objects) hold, the
//!   bytes in pymalloc's allocated blocks: the program keeping objects shows here;
//! - `py.arena_bytes`: the arenas pymalloc holds for them (an overhead on the objects: arenas a
//!   few live objects pin are kept);
//! - `malloc.in_use_bytes`: the C library's malloc in use: Python's larger objects and native
//!   memory (torch's CPU tensors, extension modules) alike (glibc's per-thread caches of freed
//!   chunks are turned off in the servers plateau starts, so none of them counts: [`NO_THREAD_CACHE`]);
//! - `malloc.free_bytes`: freed memory malloc keeps instead of returning it (an overhead on what
//!   it has in use);
//! - `py.blocks`: the count of allocated pymalloc blocks, shown only.
//!
//! Each is read after the hook empties the interpreter's caches (its type cache, and a full
//! garbage collection where the program has its collector on; `sitecustomize.py` says why), as
//! plateau settles its own allocator at a quiescent point: what remains is what the program keeps.
//!
//! The relations are declared in the samples header, so the judge weighs a process's RSS against
//! what it holds: objects kept, native memory kept, or pages an allocator keeps. The same socket
//! starts and stops memray inside a process in live mode, whose reader records the process's
//! allocation sites as the run goes (`sites.rs`).
//!
//! Lifecycle: [`Hook::create`] writes the module into a short folder under the system's temporary
//! folder (a Unix socket path is limited to 108 bytes) at the start of a run against a server
//! plateau spawns; [`Hook::env`] and [`Hook::command`] put it on the server's path, also when the
//! command sets PYTHONPATH itself with `env`; dropping the hook removes the folder.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use plateau_reports::{Kind, MetricSpec};
use serde_json::Value;

pub mod native_names;
pub mod sites;

const MODULE: &str = include_str!("sitecustomize.py");

/// The environment variable that tells the module where the sockets go.
pub const SOCKETS_ENV: &str = "PLATEAU_PY_SOCKETS";

/// glibc's malloc settings, colon-separated `NAME=VALUE` pairs read at a process's start.
pub const TUNABLES_ENV: &str = "GLIBC_TUNABLES";

/// glibc keeps up to 7 freed chunks of each size up to 1 KiB in a cache of each thread, and
/// mallinfo2 counts them as in use: in a server with a thread per connection the caches fill as
/// each thread meets each size, slowly and for as long as a soak runs (a 32-connection
/// `http.server` under n-sampling: `malloc.in_use_bytes` rose 63 B an iteration over 600 iterations
/// in 3 runs of 3 with the caches, and was level in 2 of 2 without). So the servers plateau starts
/// with its hook run without them, and `malloc.in_use_bytes` is what the program holds; a user's
/// own `glibc.malloc.tcache_count` is kept.
const NO_THREAD_CACHE: &str = "glibc.malloc.tcache_count=0";

/// GLIBC_TUNABLES for a spawned server: the user's (`inherited`) with the thread caches turned
/// off unless it sets their size itself.
fn tunables(inherited: Option<&str>) -> String {
    match inherited.filter(|t| !t.is_empty()) {
        Some(t) if t.split(':').any(|kv| kv.starts_with("glibc.malloc.tcache_count=")) => t.to_string(),
        Some(t) => format!("{t}:{NO_THREAD_CACHE}"),
        None => NO_THREAD_CACHE.to_string(),
    }
}

/// How long one process may take to answer a `stats` request: it needs the interpreter's lock,
/// which a busy thread hands over every 5 ms (Python's switch interval).
pub const STATS_TIMEOUT: Duration = Duration::from_secs(2);

/// The metrics one process's answer gives, by family: (name, answer field, kind, quantum in bytes).
const LAYERS: [(&str, &str, Kind, f64); 5] = [
    // pymalloc's blocks are multiples of 16 bytes.
    ("py.object_bytes", "py_object_bytes", Kind::Gauge, 16.0),
    // Arenas are 1 MiB since Python 3.10, 256 KiB before: the smaller is the step.
    ("py.arena_bytes", "py_arena_bytes", Kind::Gauge, 262_144.0),
    // glibc's chunks are multiples of 16 bytes.
    ("malloc.in_use_bytes", "malloc_in_use_bytes", Kind::Gauge, 16.0),
    ("malloc.free_bytes", "malloc_free_bytes", Kind::Gauge, 16.0),
    ("py.blocks", "py_blocks", Kind::Observed, 1.0),
];

/// plateau's hook for one run: the module's folder and the sockets' folder.
pub struct Hook {
    root: PathBuf,
}

impl Hook {
    /// Writes the module into a fresh folder under the temporary folder.
    pub fn create() -> Result<Hook, String> {
        let base = std::env::temp_dir();
        for n in 0..1000u32 {
            let root = base.join(format!("plateau-py-{}-{n}", std::process::id()));
            match std::fs::create_dir(&root) {
                Ok(()) => {
                    let hook = Hook { root };
                    let err = |p: &Path, e: std::io::Error| format!("{}: {e}", p.display());
                    std::fs::create_dir(hook.site()).map_err(|e| err(&hook.site(), e))?;
                    std::fs::create_dir(hook.sockets()).map_err(|e| err(&hook.sockets(), e))?;
                    let module = hook.site().join("sitecustomize.py");
                    std::fs::write(&module, MODULE).map_err(|e| err(&module, e))?;
                    let reader = hook.reader_script();
                    std::fs::write(&reader, sites::READER).map_err(|e| err(&reader, e))?;
                    return Ok(hook);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(format!("{}: {e}", root.display())),
            }
        }
        Err(format!("{}: no free name for plateau's Python hook folder", base.display()))
    }

    fn site(&self) -> PathBuf {
        self.root.join("site")
    }

    /// The hook's module as the server's processes load it.
    pub fn module(&self) -> PathBuf {
        self.site().join("sitecustomize.py")
    }

    /// The reader of a process's allocation sites (`memray_sites.py`), beside the hook's module
    /// but outside the folder on the server's path.
    pub fn reader_script(&self) -> PathBuf {
        self.root.join("memray_sites.py")
    }

    fn sockets(&self) -> PathBuf {
        self.root.join("s")
    }

    /// The PYTHONPATH a server starts with: the module's folder first, then what it would have had
    /// (`inherited`: the user's `--spawn-env PYTHONPATH`, else plateau's own environment's).
    fn python_path(&self, inherited: Option<&str>) -> String {
        match inherited.filter(|p| !p.is_empty()) {
            Some(p) => format!("{}:{p}", self.site().display()),
            None => self.site().display().to_string(),
        }
    }

    /// The environment to add for a spawned server, given the one the user asked for: PYTHONPATH
    /// with the module first, where the sockets go, and glibc's per-thread caches off
    /// ([`tunables`]).
    pub fn env(&self, user: &[(String, String)]) -> Vec<(String, String)> {
        let last = |name: &str| {
            user.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v.clone()).or_else(|| std::env::var(name).ok())
        };
        let mut env: Vec<(String, String)> =
            user.iter().filter(|(k, _)| k != "PYTHONPATH" && k != TUNABLES_ENV).cloned().collect();
        env.push(("PYTHONPATH".into(), self.python_path(last("PYTHONPATH").as_deref())));
        env.push((SOCKETS_ENV.into(), self.sockets().display().to_string()));
        env.push((TUNABLES_ENV.into(), tunables(last(TUNABLES_ENV).as_deref())));
        env
    }

    /// The server's command with the hook kept on its path where the command sets the environment
    /// itself (`env [-i] [NAME=VALUE]... PROGRAM`): its PYTHONPATH gets the module first, and the
    /// sockets' folder is named there too. Other commands are returned as they are (they inherit
    /// [`Hook::env`]); one that cannot be split as the shell would is left to the shell.
    pub fn command(&self, cmd: &str) -> String {
        let Some(mut words) = shlex::split(cmd) else { return cmd.to_string() };
        if words.first().map(|w| w == "env" || w.ends_with("/env")) != Some(true) {
            return cmd.to_string();
        }
        let mut end = 1;
        let mut had_path = false;
        let mut had_tunables = false;
        while end < words.len() {
            let w = &words[end];
            if let Some(v) = w.strip_prefix("PYTHONPATH=") {
                words[end] = format!("PYTHONPATH={}", self.python_path(Some(v)));
                had_path = true;
            } else if let Some(v) = w.strip_prefix("GLIBC_TUNABLES=") {
                words[end] = format!("{TUNABLES_ENV}={}", tunables(Some(v)));
                had_tunables = true;
            } else if !(w.starts_with('-') || w.contains('=')) {
                break;
            }
            end += 1;
        }
        let mut add = vec![format!("{SOCKETS_ENV}={}", self.sockets().display())];
        if !had_path {
            let inherited = std::env::var("PYTHONPATH").ok();
            add.push(format!("PYTHONPATH={}", self.python_path(inherited.as_deref())));
        }
        if !had_tunables {
            add.push(format!("{TUNABLES_ENV}={}", tunables(std::env::var(TUNABLES_ENV).ok().as_deref())));
        }
        words.splice(end..end, add);
        shlex::try_join(words.iter().map(String::as_str)).unwrap_or_else(|_| cmd.to_string())
    }

    /// Asks process `pid` (one line, `stats` or a memray request) and returns its answer; None
    /// when the process has no hook socket (not a Python process, or one that did not load the
    /// module).
    pub fn ask(&self, pid: i32, request: &str, timeout: Duration) -> Result<Option<Value>, String> {
        let path = self.sockets().join(format!("{pid}.sock"));
        if !path.exists() {
            return Ok(None);
        }
        let mut s = UnixStream::connect(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        s.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
        s.set_write_timeout(Some(timeout)).map_err(|e| e.to_string())?;
        s.write_all(format!("{request}\n").as_bytes()).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut line = String::new();
        BufReader::new(s)
            .read_line(&mut line)
            .map_err(|e| format!("process {pid} did not answer `{request}` within {} s: {e}", timeout.as_secs()))?;
        serde_json::from_str(&line)
            .map(Some)
            .map_err(|e| format!("process {pid}'s answer to `{request}`: {e}: {}", line.trim()))
    }

    /// The processes among `pids` that answer, with their `stats`.
    pub fn stats(&self, pids: &[i32]) -> BTreeMap<i32, Value> {
        pids.iter().filter_map(|&pid| self.ask(pid, "stats", STATS_TIMEOUT).ok().flatten().map(|v| (pid, v))).collect()
    }
}

impl Drop for Hook {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// The layer metrics of one process under `prefix` (`target.engine_core.`), from its `stats`.
pub fn values(prefix: &str, stats: &Value, out: &mut BTreeMap<String, f64>) {
    for (name, field, _, _) in LAYERS {
        if let Some(v) = stats.get(field).and_then(Value::as_f64) {
            out.insert(format!("{prefix}{name}"), v);
        }
    }
}

/// The specs of one process's layers under `prefix`, with their relations: pymalloc's arenas are
/// an overhead on the objects in them, malloc's free memory on what it has in use, and the
/// process's anonymous pages on malloc's heap together with pymalloc's arenas. Only the layers
/// its first answer gave (a process on another malloc reads zeros from glibc's: none of those).
pub fn specs(prefix: &str, first: &Value) -> BTreeMap<String, MetricSpec> {
    let mut m = BTreeMap::new();
    let on_glibc = first.get("malloc_in_use_bytes").and_then(Value::as_f64).is_some_and(|v| v > 0.0);
    for (name, field, kind, quantum) in LAYERS {
        if first.get(field).and_then(Value::as_f64).is_none() || (name.starts_with("malloc.") && !on_glibc) {
            continue;
        }
        m.insert(format!("{prefix}{name}"), MetricSpec { quantum: Some(quantum), ..MetricSpec::new(kind, "bytes") });
    }
    if let Some(s) = m.get_mut(&format!("{prefix}py.blocks")) {
        s.unit = "count".into();
    }
    let relate = |m: &mut BTreeMap<String, MetricSpec>, name: &str, heap: &str, with: &[&str]| {
        let heap = format!("{prefix}{heap}");
        if !m.contains_key(&heap) {
            return;
        }
        let with: Vec<String> = with.iter().map(|w| format!("{prefix}{w}")).filter(|w| m.contains_key(w)).collect();
        if let Some(s) = m.get_mut(&format!("{prefix}{name}")) {
            s.overhead_of = Some(heap);
            s.overhead_with = with;
        }
    };
    relate(&mut m, "py.arena_bytes", "py.object_bytes", &[]);
    relate(&mut m, "malloc.free_bytes", "malloc.in_use_bytes", &[]);
    m
}

/// The relation of a process's anonymous pages to its layers, for a process the hook reads:
/// they hold malloc's heap (its overhead) together with pymalloc's arenas.
pub fn relate_process_pages(prefix: &str, m: &mut BTreeMap<String, MetricSpec>) {
    let heap = format!("{prefix}malloc.in_use_bytes");
    if !m.contains_key(&heap) {
        return;
    }
    let with: Vec<String> = ["py.arena_bytes", "py.object_bytes"]
        .iter()
        .map(|w| format!("{prefix}{w}"))
        .filter(|w| m.contains_key(w))
        .collect();
    for level in ["proc.rss_anon", "proc.rss"] {
        if let Some(s) = m.get_mut(&format!("{prefix}{level}")) {
            s.overhead_of = Some(heap.clone());
            s.overhead_with = with.clone();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_that_sets_pythonpath_itself_keeps_the_hook_first() {
        let h = Hook { root: PathBuf::from("/tmp/plateau-py-1-0") };
        let words = |c: &str| shlex::split(c).unwrap().join(" ");
        assert_eq!(
            words(&h.command("env PYTHONPATH=/o A=1 /v/bin/vllm serve /m --port 8")),
            "env PYTHONPATH=/tmp/plateau-py-1-0/site:/o A=1 PLATEAU_PY_SOCKETS=/tmp/plateau-py-1-0/s GLIBC_TUNABLES=glibc.malloc.tcache_count=0 /v/bin/vllm serve /m --port 8"
        );
        // The user's own tunables stay, the thread caches' size too where they set it.
        assert_eq!(
            words(&h.command("env GLIBC_TUNABLES=glibc.malloc.arena_max=2 python3 s.py")),
            "env GLIBC_TUNABLES=glibc.malloc.arena_max=2:glibc.malloc.tcache_count=0 PLATEAU_PY_SOCKETS=/tmp/plateau-py-1-0/s PYTHONPATH=/tmp/plateau-py-1-0/site python3 s.py"
        );
        assert!(words(&h.command("env GLIBC_TUNABLES=glibc.malloc.tcache_count=3 python3 s.py"))
            .starts_with("env GLIBC_TUNABLES=glibc.malloc.tcache_count=3 PLATEAU"));
        // `env -i` clears the environment: the hook's variables go on its command line.
        let c = words(&h.command("env -i X=1 python3 s.py"));
        assert!(
            c.starts_with("env -i X=1 PLATEAU_PY_SOCKETS=/tmp/plateau-py-1-0/s PYTHONPATH=/tmp/plateau-py-1-0/site"),
            "{c}"
        );
        assert!(c.ends_with(" python3 s.py"), "{c}");
        assert_eq!(h.command("python3 server.py 'a b'"), "python3 server.py 'a b'");
        std::mem::forget(h); // not created: nothing to remove
    }

    #[test]
    fn the_environment_puts_the_hook_before_the_user_s_pythonpath() {
        let h = Hook { root: PathBuf::from("/tmp/plateau-py-2-0") };
        let env = h.env(&[("PYTHONPATH".into(), "/x".into()), ("A".into(), "1".into())]);
        assert!(env.contains(&("PYTHONPATH".into(), "/tmp/plateau-py-2-0/site:/x".into())), "{env:?}");
        assert!(env.contains(&("A".into(), "1".into())));
        assert!(env.contains(&(SOCKETS_ENV.into(), "/tmp/plateau-py-2-0/s".into())));
        assert!(env.contains(&(TUNABLES_ENV.into(), "glibc.malloc.tcache_count=0".into())), "{env:?}");
        let env = h.env(&[(TUNABLES_ENV.into(), "glibc.malloc.tcache_count=7".into())]);
        assert_eq!(env.iter().filter(|(k, _)| k == TUNABLES_ENV).count(), 1, "{env:?}");
        assert!(env.contains(&(TUNABLES_ENV.into(), "glibc.malloc.tcache_count=7".into())), "{env:?}");
        std::mem::forget(h);
    }

    #[test]
    fn layers_are_declared_with_their_relations_and_only_where_measured() {
        let first = serde_json::json!({"py_object_bytes": 1000, "py_arena_bytes": 1048576, "malloc_in_use_bytes": 5000,
            "malloc_free_bytes": 10, "py_blocks": 12});
        let mut m = specs("target.engine_core.", &first);
        assert_eq!(
            m["target.engine_core.py.arena_bytes"].overhead_of.as_deref(),
            Some("target.engine_core.py.object_bytes")
        );
        assert_eq!(
            m["target.engine_core.malloc.free_bytes"].overhead_of.as_deref(),
            Some("target.engine_core.malloc.in_use_bytes")
        );
        assert_eq!(m["target.engine_core.py.blocks"].kind, Kind::Observed);
        m.insert("target.engine_core.proc.rss_anon".into(), MetricSpec::new(Kind::Gauge, "bytes"));
        relate_process_pages("target.engine_core.", &mut m);
        let rss = &m["target.engine_core.proc.rss_anon"];
        assert_eq!(rss.overhead_of.as_deref(), Some("target.engine_core.malloc.in_use_bytes"));
        assert_eq!(rss.overhead_with, ["target.engine_core.py.arena_bytes", "target.engine_core.py.object_bytes"]);
        // Another malloc than glibc's reads zeros: no malloc layers, no relation of its pages.
        let other = specs("target.", &serde_json::json!({"py_object_bytes": 1, "malloc_in_use_bytes": 0}));
        assert!(other.keys().all(|k| !k.contains("malloc.")), "{other:?}");
    }

    #[test]
    #[cfg_attr(not(plateau_python3), ignore = "no python3 on this machine: the hook cannot be loaded")]
    fn a_python_process_answers_through_the_hook() {
        let python = "python3";
        let hook = Hook::create().unwrap();
        let mut child = std::process::Command::new(python)
            .args(["-c", "import time; x = [bytearray(64) for _ in range(10000)]; time.sleep(30)"])
            .envs(hook.env(&[]))
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let mut answer = None;
        for _ in 0..200 {
            if let Ok(Some(v)) = hook.ask(pid, "stats", STATS_TIMEOUT) {
                answer = Some(v);
                break;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        let _ = child.kill();
        let _ = child.wait();
        let v = answer.expect("the Python process answered its hook socket");
        assert_eq!(v["pid"].as_i64(), Some(pid as i64));
        assert!(v["py_object_bytes"].as_f64().unwrap() > 640_000.0, "{v}");
        let mut out = BTreeMap::new();
        values("target.", &v, &mut out);
        assert!(
            out.contains_key("target.py.object_bytes") && out.contains_key("target.malloc.in_use_bytes"),
            "{out:?}"
        );
        let root = hook.root.clone();
        drop(hook);
        assert!(!root.exists(), "the hook's folder goes with it");
    }
}
