//! The target's process tree: the server process and every descendant (vLLM's API server and its
//! EngineCore are separate processes), each probed as the soak probes itself (every memory level of
//! /proc/<pid>/status, mappings by kind, descriptors, threads) under a role prefix of its own
//! (`target.<name>.proc.rss_anon`), and summed over the tree (`target.proc.rss_anon`).
//!
//! Roles are fixed when the run starts, after the server answers: the processes there then, named
//! by their command name (a second of the same name gets `-2`). A process that appears later counts
//! in the sums only; one that goes away leaves its role's series.

use std::collections::BTreeMap;

use plateau_reports::MetricSpec;
use procfs::process::Process;

use super::mapping::PREFIX;
use crate::probes::{read_proc, ProcessProbes};

/// Processes a tree is followed to at most: a bound on the walk of /proc at every sample.
const MAX_PROCESSES: usize = 256;

pub struct Tree {
    root: i32,
    /// What every metric of this tree starts with: `target.`, or `decode.target.` for one role
    /// of a deployment (`--topology`).
    prefix: String,
    /// (pid, role) of the processes there at the start; empty when the server is one process.
    roles: Vec<(i32, String)>,
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

impl Tree {
    pub fn new(root: i32) -> Tree {
        Tree::with_prefix(root, PREFIX.to_string())
    }

    /// The tree of one process of a deployment, its metrics under `ROLE.target.`.
    pub fn for_role(root: i32, role: &str) -> Tree {
        Tree::with_prefix(root, format!("{role}.{PREFIX}"))
    }

    fn with_prefix(root: i32, prefix: String) -> Tree {
        let pids = descendants(root);
        let mut roles = Vec::new();
        if pids.len() > 1 {
            let mut seen: BTreeMap<String, u32> = BTreeMap::new();
            for pid in pids {
                let comm =
                    Process::new(pid).and_then(|p| p.stat()).map(|s| s.comm).unwrap_or_else(|_| format!("pid{pid}"));
                let mut name: String = comm
                    .chars()
                    .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
                    .collect();
                let n = seen.entry(name.clone()).or_insert(0);
                *n += 1;
                if *n > 1 {
                    name = format!("{name}-{n}");
                }
                roles.push((pid, name));
            }
        }
        Tree { root, prefix, roles }
    }

    pub fn root(&self) -> i32 {
        self.root
    }

    /// The roles, for the summary line.
    pub fn roles(&self) -> Vec<String> {
        self.roles.iter().map(|(pid, r)| format!("{r} (pid {pid})")).collect()
    }

    /// Specs of the tree's probes: the sums, and each role's.
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
        for (_, role) in &self.roles {
            add(format!("{}{role}.", self.prefix));
        }
        m
    }

    /// Samples every process of the tree into `values`: each role under its prefix, the sums under
    /// `target.`. Returns the pids sampled (for per-process GPU memory).
    pub fn sample(&self, values: &mut BTreeMap<String, f64>) -> Vec<i32> {
        let pids = descendants(self.root);
        let mut sums: BTreeMap<String, f64> = BTreeMap::new();
        for &pid in &pids {
            let Ok(p) = Process::new(pid) else { continue };
            let mut one = BTreeMap::new();
            read_proc(&p, "", &mut one);
            let role = self.roles.iter().find(|(r, _)| *r == pid).map(|(_, name)| name);
            for (k, v) in one {
                if let Some(role) = role {
                    values.insert(format!("{}{role}.{k}", self.prefix), v);
                }
                *sums.entry(format!("{}{k}", self.prefix)).or_insert(0.0) += v;
            }
        }
        values.extend(sums);
        pids
    }
}
