//! How a target that ended before the run did ended: its exit status or signal, and whether the
//! kernel's OOM killer did it. A leak's last act is often to be killed for it, and a user must be
//! told that apart from a crash: the kernel says so in the target's cgroup (`memory.events`,
//! `oom_kill`, cgroup v2) and, where plateau may read it, in its log (`/dev/kmsg`: "Killed process
//! PID"). Lifecycle: [`OomWatch::start`] reads the count while the target runs; after it died,
//! [`OomWatch::describe`] compares and reads the log.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;

/// Kernel log records read at most when looking for the OOM killer's line: the ring buffer holds
/// a few thousand records on a default kernel.
const MAX_KMSG_RECORDS: usize = 100_000;

/// The OOM kill count of the target's cgroup, read while it ran.
pub struct OomWatch {
    pid: i32,
    events: Option<String>,
    kills_before: Option<u64>,
}

fn cgroup_events(pid: i32) -> Option<String> {
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let path = cg.lines().find_map(|l| l.strip_prefix("0::"))?.trim().to_string();
    let events = format!("/sys/fs/cgroup{path}/memory.events");
    std::path::Path::new(&events).exists().then_some(events)
}

fn oom_kills(events: &str) -> Option<u64> {
    let text = std::fs::read_to_string(events).ok()?;
    text.lines().find_map(|l| l.strip_prefix("oom_kill ")).and_then(|v| v.trim().parse().ok())
}

/// Whether the kernel log, where readable, says the OOM killer killed `pid`.
fn kmsg_says_oom(pid: i32) -> Option<bool> {
    let mut f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open("/dev/kmsg").ok()?;
    let needle = format!("Killed process {pid} ");
    let mut buf = vec![0u8; 8192];
    for _ in 0..MAX_KMSG_RECORDS {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if String::from_utf8_lossy(&buf[..n]).contains(&needle) {
                    return Some(true);
                }
            }
            // EPIPE: a record was overwritten while reading; the next read goes on.
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(_) => break,
        }
    }
    Some(false)
}

impl OomWatch {
    pub fn start(pid: i32) -> OomWatch {
        let events = cgroup_events(pid);
        let kills_before = events.as_deref().and_then(oom_kills);
        OomWatch { pid, events, kills_before }
    }

    /// One line on how the target ended: `status` is its exit status when plateau spawned it.
    pub fn describe(&self, status: Option<String>) -> String {
        let how = match status {
            Some(s) => format!("exited ({s})"),
            None => "is gone (not plateau's child: no exit status)".into(),
        };
        let kills_after = self.events.as_deref().and_then(oom_kills);
        let cgroup = match (self.kills_before, kills_after) {
            (Some(a), Some(b)) if b > a => Some(format!(
                "the kernel's OOM killer killed it ({}: oom_kill {a} -> {b})",
                self.events.as_deref().unwrap_or_default()
            )),
            _ => None,
        };
        let oom = cgroup.or_else(|| {
            kmsg_says_oom(self.pid)
                .filter(|said| *said)
                .map(|_| "the kernel's OOM killer killed it (kernel log: \"Killed process\")".to_string())
        });
        let unknown = match (&self.events, self.kills_before) {
            (Some(_), Some(_)) => "the OOM killer's count in its cgroup did not move",
            _ => "whether the OOM killer did it is unknown (no cgroup v2 memory.events, no readable kernel log)",
        };
        format!("the target process {} {how}; {}", self.pid, oom.as_deref().unwrap_or(unknown))
    }
}
