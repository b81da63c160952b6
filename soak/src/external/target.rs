//! The server under test: started by plateau (`--spawn`) or already running (`--pid`), and the URL
//! it answers on.
//!
//! A spawned server runs `sh -c "exec CMD"` in a process group of its own, with its output in
//! `target.log` in the run's directory and the kernel told to stop it if plateau dies
//! (PR_SET_PDEATHSIG). plateau waits for it to answer (`/health`, else `/v1/models`), and stops it
//! at the end of the run, on Ctrl-C and on any error: SIGTERM to its group, then SIGKILL after
//! [`STOP_GRACE`]. A server given by `--pid` is only watched, never stopped.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a stopped server may take to exit before it is killed.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

pub struct Target {
    pub pid: i32,
    child: Option<Child>,
}

impl Target {
    /// A running process to watch.
    pub fn attach(pid: i32) -> Result<Target, String> {
        if pid <= 0 || procfs::process::Process::new(pid).is_err() {
            return Err(format!("--pid {pid}: no such process"));
        }
        Ok(Target { pid, child: None })
    }

    /// Starts `cmd` through the shell with `env` added to plateau's environment, its output to
    /// `log`.
    pub fn spawn(cmd: &str, env: &[(String, String)], log: &Path) -> Result<Target, String> {
        let out = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| format!("{}: {e}", log.display()))?;
        let mut c = Command::new("sh");
        c.arg("-c").arg(format!("exec {cmd}")).stdin(Stdio::null()).stdout(out).stderr(err).process_group(0);
        c.envs(env.iter().map(|(k, v)| (k, v)));
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            c.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let child = c.spawn().map_err(|e| format!("--spawn {cmd:?}: {e}"))?;
        Ok(Target { pid: child.id() as i32, child: Some(child) })
    }

    /// Whether the server process is still there (a zombie child counts as gone).
    pub fn alive(&mut self) -> bool {
        if let Some(c) = &mut self.child {
            return matches!(c.try_wait(), Ok(None));
        }
        procfs::process::Process::new(self.pid).and_then(|p| p.stat()).is_ok_and(|s| s.state != 'Z' && s.state != 'X')
    }

    /// What a spawned server's exit was, if it has exited.
    pub fn exit_status(&mut self) -> Option<String> {
        let c = self.child.as_mut()?;
        c.try_wait().ok().flatten().map(|s| s.to_string())
    }

    /// Stops a spawned server (SIGTERM to its group, SIGKILL after the grace); a watched one is left.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        // SAFETY: signalling the process group this plateau created for the child.
        unsafe { libc::kill(-self.pid, libc::SIGTERM) };
        let t0 = Instant::now();
        while t0.elapsed() < STOP_GRACE {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // SAFETY: as above.
        unsafe { libc::kill(-self.pid, libc::SIGKILL) };
        let _ = child.wait();
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The last `max` bytes of a file, for an error message (a server's log).
pub fn tail(path: &Path, max: usize) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    let start = text.len().saturating_sub(max);
    String::from_utf8_lossy(&text[start..]).trim().to_string()
}
