//! memray inside a Python server's processes, over a profiled replay's window: which processes
//! `--profile-process` names, and starting and stopping the tracker in each through plateau's
//! hook (`python.rs`). Lifecycle: the window's first edge calls [`Http::memray_start`], which
//! records the processes it tracks; the last edge (or the run's end) calls [`Http::memray_stop`],
//! after which each process's capture file is complete.

use plateau_driver::RunError;

use super::http_target::Http;
use super::tree;

/// How long starting or stopping memray in one process may take: stopping writes out what the
/// tracker still buffers.
const MEMRAY_CALL: std::time::Duration = std::time::Duration::from_secs(120);

impl Http<'_> {
    /// The processes `--profile-process` names: a deployment role's tree, a role of the server's
    /// tree, or every process of the server (`*`).
    pub(super) fn profiled_pids(&self, which: &str) -> Result<Vec<(i32, String)>, RunError> {
        if let Some(p) = self.deployment.procs.iter().find(|p| p.role == which) {
            return Ok(tree::descendants(p.target.pid).into_iter().map(|pid| (pid, which.to_string())).collect());
        }
        let Some(t) = &self.tree else {
            return Err(RunError::Input(format!("--profile-process {which}: this run started no server")));
        };
        if which == "*" {
            return Ok(tree::descendants(t.root()).into_iter().map(|pid| (pid, "*".to_string())).collect());
        }
        let found: Vec<(i32, String)> =
            t.members().into_iter().filter(|(role, _)| role == which).map(|(role, pid)| (pid, role)).collect();
        if found.is_empty() {
            let roles: Vec<String> = t.members().into_iter().map(|(r, _)| r).collect();
            return Err(RunError::Input(format!(
                "--profile-process {which}: the server has no such process (its processes: {})",
                if roles.is_empty() { "one, `*`".to_string() } else { roles.join(", ") }
            )));
        }
        Ok(found)
    }

    /// Starts memray inside the profiled processes through the hook: each writes
    /// `memray.<pid>.bin`; `memray-processes.json` says which, with their interpreters. Without
    /// memray in the server's environment, `memray.no-memray` names the interpreter to install it
    /// into.
    pub(super) fn memray_start(&mut self, which: &str, out_dir: &std::path::Path) -> Result<(), RunError> {
        let hook = self.hook.as_ref().ok_or_else(|| {
            RunError::Input("--profile-process: the server's processes have no plateau hook (--no-python-hook)".into())
        })?;
        let mut tracked = Vec::new();
        let mut no_memray = None;
        for (pid, role) in self.profiled_pids(which)? {
            let path = out_dir.join(format!("memray.{pid}.bin"));
            let answer = hook
                .ask(pid, &format!("memray-start {}", path.display()), MEMRAY_CALL)
                .map_err(|e| RunError::Harness(format!("starting memray in process {pid}: {e}")))?;
            let Some(v) = answer else { continue };
            if v["ok"].as_bool() == Some(true) {
                self.memray_pids.push(pid);
                tracked.push(serde_json::json!({"pid": pid, "role": role, "executable": v["executable"]}));
            } else if v["error"] == "no memray" {
                no_memray = v["executable"].as_str().map(str::to_string);
            } else {
                return Err(RunError::Harness(format!("starting memray in process {pid}: {}", v["error"])));
            }
        }
        if let (true, Some(exe)) = (tracked.is_empty(), no_memray) {
            let marker = out_dir.join("memray.no-memray");
            std::fs::write(&marker, format!("{exe}\n"))
                .map_err(|e| RunError::Harness(format!("{}: {e}", marker.display())))?;
        }
        plateau_driver::write_json(&out_dir.join("memray-processes.json"), &tracked)
    }

    /// Stops memray in the processes it records in: each capture is complete when its answer
    /// comes.
    pub(super) fn memray_stop(&mut self) -> Result<(), RunError> {
        let Some(hook) = &self.hook else { return Ok(()) };
        for pid in std::mem::take(&mut self.memray_pids) {
            match hook.ask(pid, "memray-stop", MEMRAY_CALL) {
                Ok(Some(v)) if v["ok"].as_bool() == Some(true) => {}
                Ok(other) => eprintln!("plateau: stopping memray in process {pid}: {other:?}"),
                Err(e) => eprintln!("plateau: stopping memray in process {pid}: {e}"),
            }
        }
        Ok(())
    }
}
