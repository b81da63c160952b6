//! Child processes that end when plateau is told to stop.
//!
//! Lifecycle: a command that runs other processes (`bisect`, `fuzz`, `shrink`) takes one stop flag
//! from [`stop_on_signals`]: SIGTERM (what `timeout` and a CI system's cancel send) and SIGINT
//! (Ctrl-C) set it, from the handler itself, and do nothing else. Each child starts through [`run`]
//! in a process group of its own, so that Ctrl-C at the terminal reaches plateau alone, and plateau
//! decides: [`run`] waits for the child while the flag is clear; once it is set, the child's whole
//! group (the child and whatever it started: a soak's server) gets SIGINT, which a `plateau run`
//! takes as an interrupt (it stops its server and writes an incomplete verdict), then SIGKILL after
//! [`GRACE_MS`]. A child so stopped is [`Ended::Stopped`], never an exit status: an interrupted soak
//! is never read as an undecided or failed one.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a stopped child's group has to end after SIGINT before it is killed: a soak ends its
/// iteration and stops its server (a server's own shutdown is given 10 s by `plateau run`).
pub const GRACE_MS: u64 = 20_000;

/// Why a child has no outcome when plateau was told to stop while it ran: what bisect, fuzz and
/// shrink record of it (an interrupted soak says nothing of what it soaked).
pub const INTERRUPTED: &str = "interrupted (SIGTERM or Ctrl-C) before its verdict";

/// How often a running child is looked at: the delay between a signal and its children's stop.
const POLL_MS: u64 = 50;

/// A flag that SIGTERM and SIGINT set; an error says which could not be registered (the command
/// then runs on, and a signal ends it the default way).
pub fn stop_on_signals() -> Result<Arc<AtomicBool>, String> {
    let stop = Arc::new(AtomicBool::new(false));
    for (name, sig) in [("SIGTERM", signal_hook::consts::SIGTERM), ("SIGINT", signal_hook::consts::SIGINT)] {
        signal_hook::flag::register(sig, Arc::clone(&stop)).map_err(|e| format!("{name}: {e}"))?;
    }
    Ok(stop)
}

/// How a child ended.
#[derive(Debug)]
pub enum Ended {
    /// On its own: its status, and its stdout and stderr where [`run`] captured them.
    Exited { status: ExitStatus, stdout: Vec<u8>, stderr: Vec<u8> },
    /// Stopped by plateau because the stop flag was set.
    Stopped,
}

/// Runs `cmd` in a process group of its own until it exits or `stop` is set (see the module).
/// With `capture`, its stdout and stderr are read into [`Ended::Exited`]; otherwise they go where
/// `cmd` sends them. A child is never started once `stop` is set.
pub fn run(cmd: &mut Command, capture: bool, stop: &AtomicBool) -> std::io::Result<Ended> {
    if stop.load(Ordering::SeqCst) {
        return Ok(Ended::Stopped);
    }
    if capture {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    }
    let mut child = cmd.process_group(0).spawn()?;
    // Readers drain the pipes while the child runs: a full pipe would block it forever.
    let out = child.stdout.take().map(drain);
    let err = child.stderr.take().map(drain);
    let collect = |h: Option<std::thread::JoinHandle<Vec<u8>>>| h.and_then(|h| h.join().ok()).unwrap_or_default();
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Ended::Exited { status, stdout: collect(out), stderr: collect(err) });
        }
        if stop.load(Ordering::SeqCst) {
            stop_group(&mut child);
            let _ = (collect(out), collect(err));
            return Ok(Ended::Stopped);
        }
        std::thread::sleep(Duration::from_millis(POLL_MS));
    }
}

/// A thread that reads `pipe` to its end.
fn drain(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        bytes
    })
}

/// SIGINT to the child's group, SIGKILL after [`GRACE_MS`]; waits for the child itself.
fn stop_group(child: &mut std::process::Child) {
    let Ok(pgid) = libc::pid_t::try_from(child.id()) else { return };
    // SAFETY: kill(2) with a negative pid signals that process group; it touches no memory.
    unsafe { libc::kill(-pgid, libc::SIGINT) };
    let deadline = Instant::now() + Duration::from_millis(GRACE_MS);
    while Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_))) {
            break;
        }
        std::thread::sleep(Duration::from_millis(POLL_MS));
    }
    // What the child started may outlive it: the group goes whole.
    // SAFETY: as above.
    unsafe { libc::kill(-pgid, libc::SIGKILL) };
    let _ = child.wait();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_that_exits_gives_its_status_and_output() {
        let stop = AtomicBool::new(false);
        let ended = run(Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]), true, &stop).unwrap();
        match ended {
            Ended::Exited { status, stdout, stderr } => {
                assert_eq!(status.code(), Some(3));
                assert_eq!((&stdout[..], &stderr[..]), (&b"out\n"[..], &b"err\n"[..]));
            }
            Ended::Stopped => panic!("stopped without a stop"),
        }
    }

    #[test]
    fn a_stop_ends_the_child_and_what_it_started() {
        let stop = Arc::new(AtomicBool::new(false));
        let dir = std::env::temp_dir().join(format!("plateau-shell-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pidfile = dir.join("grandchild.pid");
        // The child starts a grandchild that ignores nothing, writes its pid, and both sleep.
        let script = format!("sleep 600 & echo $! > {}; wait", pidfile.display());
        let setter = {
            let stop = Arc::clone(&stop);
            let pidfile = pidfile.clone();
            std::thread::spawn(move || {
                while !pidfile.exists() || std::fs::read_to_string(&pidfile).unwrap_or_default().trim().is_empty() {
                    std::thread::sleep(Duration::from_millis(20));
                }
                stop.store(true, Ordering::SeqCst);
            })
        };
        let t0 = Instant::now();
        let ended = run(Command::new("sh").args(["-c", &script]), false, &stop).unwrap();
        setter.join().unwrap();
        assert!(matches!(ended, Ended::Stopped), "{ended:?}");
        assert!(t0.elapsed() < Duration::from_millis(GRACE_MS), "SIGINT ends sh and its sleep at once");
        let pid: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
        // A killed process is gone once its new parent reaps it: that takes a moment.
        let reaped = Instant::now() + Duration::from_secs(5);
        // SAFETY: signal 0 only asks whether the process exists.
        let alive = || unsafe { libc::kill(pid, 0) } == 0;
        while alive() && Instant::now() < reaped {
            std::thread::sleep(Duration::from_millis(20));
        }
        let alive = alive();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(!alive, "the grandchild {pid} outlived the stop");
    }

    #[test]
    fn nothing_starts_once_stopped() {
        let stop = AtomicBool::new(true);
        let ended = run(&mut Command::new("sh"), false, &stop).unwrap();
        assert!(matches!(ended, Ended::Stopped));
    }
}
