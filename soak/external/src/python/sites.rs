//! The live bytes of every allocation site inside a Python server's processes, recorded as the run
//! goes: memray's tracker in live mode inside each process plateau's hook answers in, and a reader
//! of plateau's (`memray_sites.py`, run with the server's own interpreter) beside each.
//!
//! Lifecycle: [`PySites::start`] at the quiescent point where recording begins (the end of
//! warm-up) asks each process's hook to start its tracker on a free port, starts the reader that
//! connects to it, and waits until the tracker tracks. At each quiescent point after it,
//! [`PySites::snapshot`] has the hook allocate a numbered marker and asks the reader for the live
//! bytes by site once it has seen the marker (so every allocation and free before the point is
//! counted), one [`Snapshot`] per process. A process whose recording fails is said once in a note
//! and left out from then on; the run goes on. [`PySites::stop`] at the end stops the trackers and
//! the readers; [`PySites::names`] names the sites of native code by their library.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use plateau_sites::{Depth, Domain, Process, Recorded, SiteName, Snapshot};

use super::Hook;

/// The reader plateau runs beside each process (with that process's interpreter).
pub const READER: &str = include_str!("memray_sites.py");

/// How long a reader may take to connect and its tracker to start tracking: memray's reader
/// retries every half second, and a busy process hands its interpreter lock over every 5 ms.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How long one snapshot may take: the marker's records arrive within memray's flush interval
/// (10 ms) of being made; the rest is the reader summing a snapshot of a large process.
const SNAP_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the hook may take to answer a memray request.
const HOOK_TIMEOUT: Duration = Duration::from_secs(10);

/// How a Python process is recorded at each depth.
fn describe(depth: Depth) -> &'static str {
    match depth {
        Depth::Heap => "memray live, malloc's allocations (Python's small objects not traced), native frames",
        _ => "memray live, every allocation (Python's own allocator traced), native frames",
    }
}

/// One process's recording.
struct Recorder {
    pid: i32,
    prefix: String,
    reader: Child,
    input: ChildStdin,
    lines: Receiver<String>,
    seq: u64,
}

impl Recorder {
    /// The reader's next line, within `timeout`.
    fn line(&mut self, timeout: Duration) -> Result<serde_json::Value, String> {
        match self.lines.recv_timeout(timeout) {
            Ok(l) => serde_json::from_str(&l).map_err(|e| format!("the reader's answer: {e}: {l}")),
            Err(RecvTimeoutError::Timeout) => Err(format!("the reader did not answer within {} s", timeout.as_secs())),
            Err(RecvTimeoutError::Disconnected) => {
                let how = self.reader.try_wait().ok().flatten().map(|s| format!(" ({s})")).unwrap_or_default();
                Err(format!("the reader ended{how}"))
            }
        }
    }

    fn snapshot(&mut self, hook: &Hook) -> Result<Snapshot, String> {
        self.seq += 1;
        ask_ok(hook, self.pid, &format!("memray-mark {}", self.seq))?;
        writeln!(self.input, "snap {} {}", self.seq, SNAP_TIMEOUT.as_millis())
            .map_err(|e| format!("the reader: {e}"))?;
        let v = self.line(SNAP_TIMEOUT + Duration::from_secs(5))?;
        if let Some(e) = v["error"].as_str() {
            return Err(e.to_string());
        }
        let mut snap = Snapshot { prefix: self.prefix.clone(), ..Snapshot::default() };
        for s in v["sites"].as_array().ok_or("the reader's answer has no `sites`")? {
            let (Some(name), Some(domain), Some(bytes), Some(objects)) =
                (s[0].as_str(), domain(s[1].as_str()), s[2].as_i64(), s[3].as_i64())
            else {
                return Err(format!("the reader's site {s}: not [name, domain, bytes, objects, stack]"));
            };
            let stack = s[4].as_array().map(|a| a.iter().filter_map(|f| f.as_str().map(str::to_string)).collect());
            let e = snap.sites.entry((domain, name.to_string())).or_default();
            e.bytes += bytes;
            e.objects += objects;
            if e.stack.is_empty() {
                e.stack = stack.unwrap_or_default();
            }
        }
        Ok(snap)
    }
}

fn domain(s: Option<&str>) -> Option<Domain> {
    match s? {
        "malloc" => Some(Domain::Malloc),
        "pymalloc" => Some(Domain::Pymalloc),
        "mmap" => Some(Domain::Mmap),
        _ => None,
    }
}

/// A hook request that must answer `{"ok": true}`.
fn ask_ok(hook: &Hook, pid: i32, request: &str) -> Result<serde_json::Value, String> {
    match hook.ask(pid, request, HOOK_TIMEOUT)? {
        Some(v) if v["ok"].as_bool() == Some(true) => Ok(v),
        Some(v) if v["error"] == "no memray" => Err(format!(
            "memray is not installed for its interpreter ({}): `{} -m pip install memray` records its allocation sites",
            v["executable"].as_str().unwrap_or("?"),
            v["executable"].as_str().unwrap_or("python3")
        )),
        Some(v) => Err(format!("`{request}`: {}", v["error"].as_str().unwrap_or(&v.to_string()))),
        None => Err("its hook no longer answers".to_string()),
    }
}

/// A free TCP port on loopback for a tracker to listen on.
fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("a free port: {e}"))?;
    l.local_addr().map(|a| a.port()).map_err(|e| format!("a free port: {e}"))
}

/// Starts the reader of the tracker on `port` with `python`, its output lines on a channel.
fn spawn_reader(
    python: &str,
    (script, module): (&Path, &Path),
    port: u16,
    log: &Path,
) -> Result<(Child, ChildStdin, Receiver<String>), String> {
    let err = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let mut child = Command::new(python)
        .arg(script)
        .arg(port.to_string())
        .arg(module)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(err)
        .spawn()
        .map_err(|e| format!("the reader ({python} {}): {e}", script.display()))?;
    let input = child.stdin.take().ok_or("the reader's standard input")?;
    let output = child.stdout.take().ok_or("the reader's standard output")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("plateau-sites-reader".into())
        .spawn(move || {
            for line in BufReader::new(output).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        })
        .map_err(|e| format!("the reader's output thread: {e}"))?;
    Ok((child, input, rx))
}

/// The recording of a server's Python processes.
pub struct PySites {
    recorders: Vec<Recorder>,
    /// Sites of native code seen, by process prefix: their provisional names.
    native: BTreeMap<(String, i32), Vec<String>>,
}

impl PySites {
    /// Starts recording in each of `processes` (pid, prefix of its gauges). What could not start
    /// is said in `r`'s notes; the processes recorded are in its processes.
    pub fn start(hook: &Hook, processes: &[(i32, String)], depth: Depth, out_dir: &Path, r: &mut Recorded) -> PySites {
        let mut sites = PySites { recorders: Vec::new(), native: BTreeMap::new() };
        let script = hook.reader_script();
        for (pid, prefix) in processes {
            match start_one(hook, *pid, prefix, depth, &script, out_dir) {
                Ok(rec) => {
                    r.processes.push(Process {
                        prefix: prefix.clone(),
                        pid: Some(*pid),
                        profiler: describe(depth).to_string(),
                    });
                    sites.recorders.push(rec);
                }
                Err(e) => r.notes.push(format!("process {pid} ({}): no site recorded: {e}", show(prefix))),
            }
        }
        sites
    }

    /// Every recorded process's sites now; a process that fails is said in a note and dropped.
    pub fn snapshot(&mut self, hook: &Hook, r: &mut Recorded) {
        let mut kept = Vec::with_capacity(self.recorders.len());
        for mut rec in std::mem::take(&mut self.recorders) {
            match rec.snapshot(hook) {
                Ok(snap) => {
                    for (_, name) in snap.sites.keys().filter(|(_, n)| n.starts_with("native:")) {
                        let seen = self.native.entry((rec.prefix.clone(), rec.pid)).or_default();
                        if !seen.contains(name) {
                            seen.push(name.clone());
                        }
                    }
                    r.snapshots.push(snap);
                    kept.push(rec);
                }
                Err(e) => {
                    r.notes.push(format!(
                        "process {} ({}): sites no longer recorded from here: {e}",
                        rec.pid,
                        show(&rec.prefix)
                    ));
                    stop_one(hook, rec);
                }
            }
        }
        self.recorders = kept;
    }

    /// Stops every tracker and reader.
    pub fn stop(&mut self, hook: &Hook) {
        for rec in std::mem::take(&mut self.recorders) {
            stop_one(hook, rec);
        }
    }

    /// The sites of native code named by the library that defines their function
    /// (`libledger.so!ledger_worker`), else by their source (`ledger.c:21 ledger_worker`).
    pub fn names(&self) -> Vec<SiteName> {
        let mut out = Vec::new();
        for ((prefix, pid), names) in &self.native {
            let mut libraries = super::native_names::Libraries::of(*pid);
            for key in names {
                let rest = key.trim_start_matches("native:");
                if let Some(thread) = rest.strip_prefix("thread ") {
                    let name = match thread {
                        "?" | "" => "(native code without symbols, on a thread memray knows no name of)".to_string(),
                        t => format!("(native code without symbols, thread {t})"),
                    };
                    out.extend(Domain::ALL.iter().map(|&domain| SiteName {
                        prefix: prefix.clone(),
                        domain,
                        key: key.clone(),
                        name: name.clone(),
                        stack: vec![name.clone()],
                    }));
                    continue;
                }
                let (source, function) = rest.split_once(' ').unwrap_or(("?", rest));
                let name = match libraries.defining(function) {
                    Some(lib) => format!("{lib}!{function}"),
                    None if source.starts_with('?') => format!("?!{function}"),
                    None => format!("{source} {function}"),
                };
                for domain in [Domain::Malloc, Domain::Mmap, Domain::Pymalloc] {
                    out.push(SiteName {
                        prefix: prefix.clone(),
                        domain,
                        key: key.clone(),
                        name: name.clone(),
                        stack: vec![name.clone()],
                    });
                }
            }
        }
        out
    }
}

fn show(prefix: &str) -> &str {
    prefix.trim_end_matches('.')
}

fn start_one(
    hook: &Hook,
    pid: i32,
    prefix: &str,
    depth: Depth,
    script: &Path,
    out_dir: &Path,
) -> Result<Recorder, String> {
    let port = free_port()?;
    let pyalloc = u8::from(depth == Depth::Full);
    let v = ask_ok(hook, pid, &format!("memray-live {port} 1 {pyalloc}"))?;
    let python = v["executable"].as_str().filter(|e| !e.is_empty()).ok_or("the hook named no interpreter")?;
    let log: PathBuf = out_dir.join(format!("sites-reader.{pid}.log"));
    let (reader, input, lines) = spawn_reader(python, (script, &hook.module()), port, &log)?;
    let mut rec = Recorder { pid, prefix: prefix.to_string(), reader, input, lines, seq: 0 };
    let hello = rec.line(START_TIMEOUT).map_err(|e| format!("{e} (its log: {})", log.display()))?;
    if hello["ok"].as_bool() != Some(true) {
        return Err(format!("the reader: {hello}"));
    }
    let t0 = Instant::now();
    loop {
        match hook.ask(pid, "memray-live-ready", HOOK_TIMEOUT)? {
            Some(v) if v["ok"].as_bool() == Some(true) => return Ok(rec),
            Some(v) if v["error"].is_string() => return Err(format!("memray's tracker: {}", v["error"])),
            Some(_) => {}
            None => return Err("its hook no longer answers".to_string()),
        }
        if t0.elapsed() > START_TIMEOUT {
            return Err(format!("memray's tracker did not start within {} s", START_TIMEOUT.as_secs()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stop_one(hook: &Hook, mut rec: Recorder) {
    let _ = hook.ask(rec.pid, "memray-stop", HOOK_TIMEOUT);
    let _ = writeln!(rec.input, "quit");
    drop(rec.input);
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(5) {
        if rec.reader.try_wait().ok().flatten().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = rec.reader.kill();
    let _ = rec.reader.wait();
}
