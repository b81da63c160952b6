//! The server under test: started by plateau (`--spawn`) or already running (`--pid`), and the URL
//! it answers on.
//!
//! A spawned server runs `sh -c "exec CMD"` in a process group of its own (leading `VAR=value`
//! words stay before the `exec`; a compound command, `cd dir && srv`, runs through the shell as
//! written, the shell then the root of the server's process tree), with its output in
//! `target.log` in the run's directory and the kernel told to stop it if plateau dies
//! (PR_SET_PDEATHSIG). plateau waits for it to answer (`/health`, else `/v1/models`), and stops it
//! at the end of the run, on Ctrl-C and on any error: SIGTERM to its group, then SIGKILL after
//! [`STOP_GRACE`]. A server given by `--pid` is only watched, never stopped.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The line the shell runs for `cmd`: `exec CMD`, so that the server is the process plateau
/// started (its pid is the server's), with leading assignments (`VAR=1 srv`) kept before the
/// `exec` (after it the shell would look for a program named `VAR=1`); a compound command (an
/// unquoted `;`, `&`, `|`, parenthesis or newline: `cd dir && srv`) as written, since `exec`
/// would apply to its first part only.
pub fn shell_line(cmd: &str) -> String {
    if compound(cmd) {
        return cmd.to_string();
    }
    let Some(words) = shlex::split(cmd) else { return format!("exec {cmd}") };
    let assigns = words.iter().take_while(|w| is_assignment(w)).count();
    if assigns == 0 || assigns == words.len() {
        return format!("exec {cmd}");
    }
    // An assignment stays one only with its name unquoted: the value alone is quoted.
    let assignment = |w: &String| {
        let (name, value) = w.split_once('=')?;
        Some(format!("{name}={}", shlex::try_quote(value).ok()?))
    };
    let a: Option<Vec<String>> = words[..assigns].iter().map(assignment).collect();
    match (a, shlex::try_join(words[assigns..].iter().map(String::as_str)).ok()) {
        (Some(a), Some(rest)) => format!("{} exec {rest}", a.join(" ")),
        _ => format!("exec {cmd}"),
    }
}

/// `NAME=value`, a shell variable assignment.
fn is_assignment(word: &str) -> bool {
    let Some((name, _)) = word.split_once('=') else { return false };
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Whether `cmd` holds a shell operator outside quotes (`;`, `&`, `|`, `(`, `)`, a newline).
fn compound(cmd: &str) -> bool {
    let (mut single, mut double, mut escaped) = (false, false, false);
    for c in cmd.chars() {
        match c {
            _ if escaped => escaped = false,
            '\\' if !single => escaped = true,
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            ';' | '&' | '|' | '(' | ')' | '\n' if !single && !double => return true,
            _ => {}
        }
    }
    false
}

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
        c.arg("-c").arg(shell_line(cmd)).stdin(Stdio::null()).stdout(out).stderr(err).process_group(0);
        c.envs(env.iter().map(|(k, v)| (k, v)));
        // The server runs with the address-space layout the kernel gives it: plateau fixes its
        // own (plateau_probes::layout), not the target's.
        let persona = plateau_probes::layout::child_persona();
        // SAFETY: prctl and personality are async-signal-safe; nothing else runs between fork
        // and exec.
        unsafe {
            c.pre_exec(move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                plateau_probes::layout::restore_in_child(persona);
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

/// Lines of a spawned server's output a failed run quotes.
pub(crate) const LOG_LINES: usize = 12;

/// The last `n` lines of a file (at most 4 KiB of them), for a message.
pub(crate) fn last_lines(path: &std::path::Path, n: usize) -> String {
    let text = tail(path, 4096);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].iter().map(|l| format!("  | {l}")).collect::<Vec<_>>().join("\n")
}

/// How long a run that failed waits for its target process to be seen dead: the time between a
/// killed process closing its sockets and becoming a zombie, generously, on a loaded machine.
pub(crate) const DEATH_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// Whether `t` has ended, or ends within `grace` (polled every 10 ms).
pub(crate) fn ended_within(t: &mut Target, grace: std::time::Duration) -> bool {
    let t0 = std::time::Instant::now();
    loop {
        if !t.alive() {
            return true;
        }
        if t0.elapsed() >= grace {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::shell_line;

    #[test]
    fn a_spawned_command_execs_the_server_with_its_assignments_and_a_compound_one_runs_as_written() {
        assert_eq!(shell_line("python3 srv.py 8000"), "exec python3 srv.py 8000");
        assert_eq!(shell_line("VAR=1 OTHER='a b' srv --port 1"), "VAR=1 OTHER='a b' exec srv --port 1");
        assert_eq!(shell_line("cd /tmp && srv"), "cd /tmp && srv");
        assert_eq!(shell_line("srv --arg 'a;b'"), "exec srv --arg 'a;b'");
        assert_eq!(shell_line("srv \\; x"), "exec srv \\; x");
        // Each runs in a real shell as the line says.
        let run = |line: &str| {
            let o = std::process::Command::new("sh").arg("-c").arg(shell_line(line)).output().expect("sh");
            String::from_utf8_lossy(&o.stdout).trim().to_string()
        };
        assert_eq!(run("FOO=bar sh -c 'echo $FOO'"), "bar");
        assert_eq!(run("cd / && pwd"), "/");
    }
}
