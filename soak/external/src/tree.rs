//! The target's process tree: the server process and every descendant (vLLM's API server, its
//! engine core and its workers are separate processes), each probed as the soak probes itself
//! (every memory level of /proc/<pid>/status, mappings by kind, descriptors, threads) under a role
//! of its own (`target.engine_core.proc.rss_anon`), and summed over the tree
//! (`target.proc.rss_anon`). A Python process that answers plateau's hook ([`super::python`]) adds
//! the layers of its memory under its role (`target.engine_core.py.object_bytes`).
//!
//! Roles are named when the run starts, after the server answers, for what each process is where
//! that can be told ([`role_name`]: vLLM's API server, engine core and workers), else by its
//! command name (a second of the same name gets `-2`). The header declares them then. Later, the
//! tree is walked again at every sample: a process that takes the place of one that ended (a role
//! of the same name whose process is gone, such as a restarted worker) carries on its role's
//! series; any other process that starts later counts in the sums and is named at the end of the
//! run ([`Tree::late`]). A process that ends leaves its role's series, and [`Tree::vanished`]
//! names it when the run fails.

use std::collections::BTreeMap;

use plateau_reports::MetricSpec;
use procfs::process::Process;

use super::mapping::PREFIX;
use super::python::{self, Hook};
use plateau_probes::probes::{read_proc, ProcessProbes};

/// Processes a tree is followed to at most: a bound on the walk of /proc at every sample.
const MAX_PROCESSES: usize = 256;

/// Processes that started after the roles were named, remembered at most (for the end's summary).
const MAX_LATE: usize = 64;

/// One process of the tree with a role.
#[derive(Debug, Clone)]
struct Member {
    pid: i32,
    role: String,
    /// Whether its Python layers are declared (it answered the hook when the run started).
    layered: bool,
}

pub struct Tree {
    root: i32,
    /// What every metric of this tree starts with: `target.`, or `decode.target.` for one role
    /// of a deployment (`--topology`).
    prefix: String,
    /// The processes with roles; empty when the server is one process.
    members: Vec<Member>,
    /// Whether the root's layers are declared, for a server of one process (under the prefix).
    root_layered: bool,
    /// Specs of the layers found at the start, by metric.
    layer_specs: BTreeMap<String, MetricSpec>,
    /// The processes of the last sample: (pid, role or command name).
    last_seen: Vec<(i32, String)>,
    /// Processes that started later and took no role: (pid, what it is), in order.
    late: Vec<(i32, String)>,
}

/// `pid` and its descendants, parents first, at most [`MAX_PROCESSES`].
pub fn descendants(root: i32) -> Vec<i32> {
    let mut parent_of: Vec<(i32, i32)> = Vec::new();
    if let Ok(all) = procfs::process::all_processes() {
        for p in all.flatten() {
            if let Ok(stat) = p.stat() {
                parent_of.push((stat.pid, stat.ppid));
            }
        }
    }
    let mut out = vec![root];
    let mut k = 0;
    while k < out.len() && out.len() < MAX_PROCESSES {
        let parent = out[k];
        let mut children: Vec<i32> = parent_of.iter().filter(|&&(_, pp)| pp == parent).map(|&(p, _)| p).collect();
        children.sort_unstable();
        out.extend(children.into_iter().take(MAX_PROCESSES - out.len()));
        k += 1;
    }
    out
}

/// What a process is, as a metric name's part: vLLM's processes by what they do (its V1 engine
/// names them `VLLM::EngineCore` and `VLLM::Worker` with setproctitle; the API server is the
/// process that runs `vllm serve` or the API server module; V0's engine process runs
/// `run_mp_engine`), multiprocessing's resource tracker by its module, another process
/// multiprocessing started by the function it runs (`mp_target`, as plateau's hook reports it),
/// others by their command name.
pub fn role_name(comm: &str, cmdline: &str, is_root: bool, mp_target: Option<&str>) -> String {
    let vllm = cmdline.contains("vllm");
    if let Some(rest) = comm.strip_prefix("VLLM::") {
        return match rest {
            r if r.starts_with("EngineCor") => "engine_core".into(),
            r if r.starts_with("Worker") => "worker".into(),
            r if r.starts_with("APIServer") => "api_server".into(),
            r => snake(r),
        };
    }
    if cmdline.contains("EngineCore") {
        return "engine_core".into();
    }
    if cmdline.contains("multiprocessing.resource_tracker") {
        return "resource_tracker".into();
    }
    if is_root && vllm && (cmdline.contains(" serve") || cmdline.contains("entrypoints.openai.api_server")) {
        return "api_server".into();
    }
    match mp_target.map(|t| t.rsplit('.').next().unwrap_or(t)) {
        Some("run_mp_engine") => "engine".into(),
        Some("run_engine_core") => "engine_core".into(),
        Some(t) if !t.is_empty() && !t.starts_with('<') => sanitize(t),
        _ => sanitize(comm),
    }
}

/// `EngineCor` -> `engine_cor`: vLLM's CamelCase process titles as the snake_case of metric names.
fn snake(s: &str) -> String {
    let mut out = String::new();
    let mut after_lower = false;
    for c in s.chars() {
        if c.is_ascii_uppercase() && after_lower {
            out.push('_');
        }
        after_lower = c.is_ascii_lowercase();
        out.push(c.to_ascii_lowercase());
    }
    sanitize(&out)
}

fn sanitize(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect()
}

/// A process's command name and command line (NUL-separated arguments joined by spaces).
fn identity(pid: i32) -> (String, String) {
    let comm = Process::new(pid).and_then(|p| p.stat()).map(|s| s.comm).unwrap_or_else(|_| format!("pid{pid}"));
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " ").trim().to_string())
        .unwrap_or_default();
    (comm, cmdline)
}

impl Tree {
    /// The tree of the one server, its Python processes read through `hook` where they answer.
    pub fn new(root: i32, hook: Option<&Hook>) -> Tree {
        Tree::with_prefix(root, PREFIX.to_string(), hook)
    }

    /// The tree of one process of a deployment, its metrics under `ROLE.target.`.
    pub fn for_role(root: i32, role: &str, hook: Option<&Hook>) -> Tree {
        Tree::with_prefix(root, format!("{role}.{PREFIX}"), hook)
    }

    fn with_prefix(root: i32, prefix: String, hook: Option<&Hook>) -> Tree {
        let pids = descendants(root);
        let stats = hook.map(|h| h.stats(&pids)).unwrap_or_default();
        let mut layer_specs = BTreeMap::new();
        let mut members = Vec::new();
        let mut root_layered = false;
        if pids.len() > 1 {
            let mut seen: BTreeMap<String, u32> = BTreeMap::new();
            for pid in pids {
                let (comm, cmdline) = identity(pid);
                let target = stats.get(&pid).and_then(|s| s["process_target"].as_str());
                let mut name = role_name(&comm, &cmdline, pid == root, target);
                let n = seen.entry(name.clone()).or_insert(0);
                *n += 1;
                if *n > 1 {
                    name = format!("{name}-{n}");
                }
                let layered = match stats.get(&pid) {
                    Some(first) => {
                        layer_specs.extend(python::specs(&format!("{prefix}{name}."), first));
                        true
                    }
                    None => false,
                };
                members.push(Member { pid, role: name, layered });
            }
        } else if let Some(first) = stats.get(&root) {
            layer_specs.extend(python::specs(&prefix, first));
            root_layered = true;
        }
        Tree { root, prefix, members, root_layered, layer_specs, last_seen: Vec::new(), late: Vec::new() }
    }

    pub fn root(&self) -> i32 {
        self.root
    }

    /// The roles, for the summary line.
    pub fn roles(&self) -> Vec<String> {
        self.members.iter().map(|m| format!("{} (pid {})", m.role, m.pid)).collect()
    }

    /// The processes whose Python layers are read (they answered plateau's hook when the run
    /// started), each with the prefix of its gauges: where allocation sites are recorded.
    pub fn layered(&self) -> Vec<(i32, String)> {
        if self.root_layered {
            return vec![(self.root, self.prefix.clone())];
        }
        self.members.iter().filter(|m| m.layered).map(|m| (m.pid, format!("{}{}.", self.prefix, m.role))).collect()
    }

    /// (role, pid) of the processes with roles, for `processes.json`.
    pub fn members(&self) -> Vec<(String, i32)> {
        self.members.iter().map(|m| (m.role.clone(), m.pid)).collect()
    }

    /// Processes that started after the roles were named and took none (counted in the sums).
    pub fn late(&self) -> Vec<String> {
        self.late.iter().map(|(pid, what)| format!("{what} (pid {pid})")).collect()
    }

    /// Whether any process of the tree answers plateau's Python hook.
    pub fn has_layers(&self) -> bool {
        !self.layer_specs.is_empty()
    }

    /// Specs of the tree's probes: the sums, each role's, and the Python layers found.
    pub fn specs(&self) -> BTreeMap<String, MetricSpec> {
        let mut m = BTreeMap::new();
        let mut add = |prefix: String| {
            for (name, spec) in ProcessProbes::specs(&prefix) {
                // The allocator's view is the target's own business; its heap outside the
                // allocator needs it too.
                if name.contains("jemalloc.") || name.ends_with("anon_outside_heap") {
                    continue;
                }
                m.insert(name, spec);
            }
        };
        add(self.prefix.clone());
        for mem in &self.members {
            add(format!("{}{}.", self.prefix, mem.role));
        }
        m.extend(self.layer_specs.clone());
        if self.root_layered {
            python::relate_process_pages(&self.prefix, &mut m);
        }
        for mem in self.members.iter().filter(|m| m.layered) {
            python::relate_process_pages(&format!("{}{}.", self.prefix, mem.role), &mut m);
        }
        m
    }

    /// A process not seen when roles were named takes the role of a member that is gone, if its
    /// own role name is that member's (without the `-N` of a second one); else it is late.
    fn follow(&mut self, pids: &[i32], hook: Option<&Hook>) {
        for &pid in pids {
            if pid == self.root || self.members.iter().any(|m| m.pid == pid) || self.late.iter().any(|l| l.0 == pid) {
                continue;
            }
            let (comm, cmdline) = identity(pid);
            let stats = hook.and_then(|h| h.ask(pid, "stats", python::STATS_TIMEOUT).ok().flatten());
            let target = stats.as_ref().and_then(|s| s["process_target"].as_str());
            let name = role_name(&comm, &cmdline, pid == self.root, target);
            let heir = self.members.iter_mut().find(|m| {
                let base =
                    m.role.rsplit_once('-').filter(|(_, n)| n.parse::<u32>().is_ok()).map_or(&*m.role, |(b, _)| b);
                base == name && !pids.contains(&m.pid)
            });
            match heir {
                Some(m) => m.pid = pid,
                None if self.late.len() < MAX_LATE => self.late.push((pid, name)),
                None => {}
            }
        }
    }

    /// Samples every process of the tree into `values`: each role under its prefix (with its
    /// Python layers, through `hook`), the sums under `target.`. Returns the pids sampled (for
    /// per-process GPU memory).
    pub fn sample(&mut self, values: &mut BTreeMap<String, f64>, hook: Option<&Hook>) -> Vec<i32> {
        let pids = descendants(self.root);
        self.follow(&pids, hook);
        let mut sums: BTreeMap<String, f64> = BTreeMap::new();
        let mut seen = Vec::new();
        for &pid in &pids {
            let Ok(p) = Process::new(pid) else { continue };
            let mut one = BTreeMap::new();
            read_proc(&p, "", &mut one);
            let member = self.members.iter().find(|m| m.pid == pid);
            for (k, v) in &one {
                if let Some(m) = member {
                    values.insert(format!("{}{}.{k}", self.prefix, m.role), *v);
                }
                *sums.entry(format!("{}{k}", self.prefix)).or_insert(0.0) += v;
            }
            let layered = match member {
                Some(m) if m.layered => Some(format!("{}{}.", self.prefix, m.role)),
                None if pid == self.root && self.root_layered => Some(self.prefix.clone()),
                _ => None,
            };
            if let (Some(prefix), Some(h)) = (layered, hook) {
                if let Ok(Some(stats)) = h.ask(pid, "stats", python::STATS_TIMEOUT) {
                    python::values(&prefix, &stats, values);
                }
            }
            let what = member.map(|m| m.role.clone()).unwrap_or_else(|| identity(pid).0);
            seen.push((pid, what));
        }
        values.extend(sums);
        self.last_seen = seen;
        pids
    }

    /// The processes of the last sample that are gone now: "engine_core (pid 4242)".
    pub fn vanished(&self) -> Vec<String> {
        self.vanished_pids().into_iter().map(|(pid, what)| format!("{what} (pid {pid})")).collect()
    }

    /// The processes of [`Tree::vanished`], by pid and name.
    pub fn vanished_pids(&self) -> Vec<(i32, String)> {
        let alive = |pid: i32| Process::new(pid).and_then(|p| p.stat()).is_ok_and(|s| s.state != 'Z' && s.state != 'X');
        self.last_seen.iter().filter(|(pid, _)| !alive(*pid)).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_of_the_tree_that_ends_is_named_as_gone() {
        let mut root = std::process::Command::new("sh").args(["-c", "sleep 30 & wait"]).spawn().unwrap();
        let pid = root.id() as i32;
        // The shell has started its child once the tree holds two processes.
        for _ in 0..200 {
            if descendants(pid).len() > 1 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let mut t = Tree::new(pid, None);
        let mut values = BTreeMap::new();
        t.sample(&mut values, None);
        let child =
            t.members().into_iter().find(|(role, _)| role == "sleep").map(|(_, p)| p).expect("the child's role");
        assert!(values.contains_key("target.sleep.proc.rss") && values.contains_key("target.proc.rss"), "{values:?}");
        assert!(t.vanished().is_empty());
        // SAFETY: a child process of this test.
        unsafe { libc::kill(child, libc::SIGKILL) };
        let _ = root.wait();
        let gone = t.vanished();
        assert!(gone.contains(&format!("sleep (pid {child})")), "{gone:?}");
    }

    #[test]
    fn vllm_processes_are_named_for_what_they_do() {
        let root = "/venv/bin/python /venv/bin/vllm serve /m --port 8000";
        assert_eq!(role_name("vllm", root, true, None), "api_server");
        assert_eq!(role_name("VLLM::EngineCor", "VLLM::EngineCore", false, None), "engine_core");
        assert_eq!(role_name("VLLM::Worker", "VLLM::Worker", false, None), "worker");
        assert_eq!(role_name("VLLM::DPCoordinato", "VLLM::DPCoordinator", false, None), "dpcoordinato");
        let tracker = "/venv/bin/python -B -c from multiprocessing.resource_tracker import main;main(32)";
        assert_eq!(role_name("python", tracker, false, None), "resource_tracker");
        assert_eq!(
            role_name("python3", "python3 -m vllm.entrypoints.openai.api_server --model m", true, None),
            "api_server"
        );
        // V0's engine process, spawned by multiprocessing, is known by the function it runs.
        let spawned = "/venv/bin/python -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7) --multiprocessing-fork";
        assert_eq!(role_name("python", spawned, false, Some("run_mp_engine")), "engine");
        assert_eq!(role_name("python", spawned, false, Some("Server.serve_forever")), "serve_forever");
        // Anything else by its command name, as a metric name's part.
        assert_eq!(role_name("llama-server", "llama-server -m x", true, None), "llama-server");
        assert_eq!(role_name("a b.c", "", false, None), "a_b_c");
    }
}
