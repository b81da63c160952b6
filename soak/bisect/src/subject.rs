//! What a bisect walks: the commits of a git repository (each checked out in a scratch worktree
//! and built there) or the releases of a server (each prepared by a setup command that prints
//! the command serving it). Both give the soak the same thing: the words to fill in its command
//! (`{worktree}`; `{serve}` and `{version}`), and `{port}` a free port.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

use plateau_shell::children::{Ended, INTERRUPTED};

use super::{git, BisectError};

/// Releases a bisect may list (a package's releases over years: a few hundred).
const MAX_RELEASES: usize = 1_000;

/// Bytes of a setup command's output kept in its log.
const MAX_SETUP_LOG_BYTES: usize = 1 << 20;

pub enum Subject {
    /// Commits of `repo` after the old end up to the new one: `--good` then `--bad` looking for
    /// a regression, `--bad` then `--good` looking for a fix (each end with its flag).
    Commits { repo: PathBuf, old: (&'static str, String), new: (&'static str, String), build: Option<String> },
    /// Releases in the order given; the ends are the first and the last unless named.
    Releases { versions: Vec<String>, first: Option<String>, last: Option<String>, setup: String },
}

/// The walk: the old end (known to be as it was), and the candidates after it, the new end last.
pub struct Plan {
    /// The repository's top level (commits only).
    pub top: Option<PathBuf>,
    pub old: String,
    pub list: Vec<String>,
}

impl Plan {
    pub fn new_end(&self) -> &str {
        self.list.last().map_or("", String::as_str)
    }
}

/// One candidate made ready to soak: the words to fill in, and its worktree (removed when this
/// is dropped).
pub struct Prepared {
    pub fill: Vec<(&'static str, String)>,
    _worktree: Option<git::Worktree>,
}

impl Subject {
    pub fn is_releases(&self) -> bool {
        matches!(self, Subject::Releases { .. })
    }

    /// The ends and the candidates, checked (bad input is exit 2 before anything runs).
    pub fn plan(&self, max_commits: usize) -> Result<Plan, BisectError> {
        match self {
            Subject::Commits { repo, old, new, .. } => commits(repo, old, new, max_commits),
            Subject::Releases { versions, first, last, .. } => releases(versions, first.as_deref(), last.as_deref()),
        }
    }

    /// The placeholder the soak must use for candidates to differ.
    pub fn placeholder(&self) -> &'static str {
        match self {
            Subject::Commits { .. } => "{worktree}",
            Subject::Releases { .. } => "{serve}",
        }
    }

    /// How people name the old end (`first`) or the new one: its flag and value (`--good
    /// abc123`), or the release.
    pub fn end(&self, first: bool, id: &str) -> String {
        match self {
            Subject::Commits { old, new, .. } => {
                let (flag, rev) = if first { old } else { new };
                format!("{flag} {rev} ({})", super::short(id))
            }
            Subject::Releases { .. } => format!("the {} release, {id},", if first { "first" } else { "last" }),
        }
    }

    /// A commit's subject line; a release has none.
    pub fn describe(&self, plan: &Plan, id: &str) -> String {
        match (&plan.top, self) {
            (Some(top), Subject::Commits { .. }) => git::subject(top, id),
            _ => String::new(),
        }
    }

    /// Makes candidate `id` ready: a worktree built with `--build`, or a release set up with
    /// `--setup` (its output in `logs`). An error skips the candidate, saying why.
    pub fn prepare(
        &self,
        plan: &Plan,
        id: &str,
        scratch: &Path,
        logs: &Path,
        git_lock: &Mutex<()>,
        stop: &AtomicBool,
    ) -> Result<Prepared, String> {
        match self {
            Subject::Commits { build, .. } => {
                let top = plan.top.as_deref().ok_or("no repository")?;
                std::fs::create_dir_all(scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
                let wt = {
                    let _g = git_lock.lock().map_err(|_| "the worktree lock".to_string())?;
                    git::Worktree::add(top, id, &scratch.join(super::short(id)))?
                };
                if let Some(build) = build {
                    let log = logs.join("build.log");
                    let file = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
                    let mut cmd = Command::new("sh");
                    cmd.arg("-c").arg(build).current_dir(&wt.path);
                    cmd.stdout(file.try_clone().map_err(|e| e.to_string())?).stderr(file);
                    let status = match plateau_shell::children::run(&mut cmd, false, stop) {
                        Ok(Ended::Exited { status, .. }) => status,
                        Ok(Ended::Stopped) => return Err(INTERRUPTED.into()),
                        Err(e) => return Err(format!("--build: {e}")),
                    };
                    if !status.success() {
                        return Err(format!("--build failed ({status}); its log: {}", log.display()));
                    }
                }
                let fill = vec![("{worktree}", wt.path.display().to_string())];
                Ok(Prepared { fill, _worktree: Some(wt) })
            }
            Subject::Releases { setup, .. } => {
                let serve = set_up(setup, id, &logs.join("setup.log"), stop)?;
                Ok(Prepared { fill: vec![("{serve}", serve), ("{version}", id.to_string())], _worktree: None })
            }
        }
    }
}

/// The commits after the old end up to the new one, checked.
fn commits(repo: &Path, old: &(&str, String), new: &(&str, String), max: usize) -> Result<Plan, BisectError> {
    let ((old_flag, old_rev), (new_flag, new_rev)) = (old, new);
    let top = git::toplevel(repo).map_err(BisectError::Input)?;
    let old_id = git::commit(&top, old_flag, old_rev).map_err(BisectError::Input)?;
    let new_id = git::commit(&top, new_flag, new_rev).map_err(BisectError::Input)?;
    if old_id == new_id {
        return Err(BisectError::Input(format!("{old_flag} {old_rev} and {new_flag} {new_rev} are the same commit")));
    }
    if !git::is_ancestor(&top, &old_id, &new_id) {
        return Err(BisectError::Input(format!(
            "{old_flag} {old_rev} is not an ancestor of {new_flag} {new_rev}: bisect looks for the first commit that changed after the older end"
        )));
    }
    let list = git::candidates(&top, &old_id, &new_id).map_err(BisectError::Harness)?;
    if list.len() > max {
        return Err(BisectError::Input(format!(
            "{} commits between --good and --bad, more than {max}: name closer ends",
            list.len()
        )));
    }
    if list.last() != Some(&new_id) {
        return Err(BisectError::Harness(format!("git rev-list did not end at {new_flag} {new_id}")));
    }
    Ok(Plan { top: Some(top), old: old_id, list })
}

/// The releases between the ends, in the order given, checked.
fn releases(versions: &[String], first: Option<&str>, last: Option<&str>) -> Result<Plan, BisectError> {
    let bad = |m: String| Err(BisectError::Input(m));
    if versions.len() > MAX_RELEASES {
        return bad(format!("--versions: {} releases, more than {MAX_RELEASES}", versions.len()));
    }
    for v in versions {
        if v.is_empty() || !v.chars().all(|c| c.is_ascii_alphanumeric() || "._+-".contains(c)) {
            return bad(format!("--versions: {v:?} is not a release (letters, digits and . _ + - only)"));
        }
        if versions.iter().filter(|w| *w == v).count() > 1 {
            return bad(format!("--versions: {v} is listed twice"));
        }
    }
    let at = |flag: &str, v: Option<&str>, default: usize| -> Result<usize, BisectError> {
        match v {
            None => Ok(default),
            Some(v) => versions.iter().position(|w| w == v).ok_or_else(|| {
                BisectError::Input(format!("{flag} {v} is not among --versions ({})", versions.join(",")))
            }),
        }
    };
    let (i, j) = (at("the first end", first, 0)?, at("the last end", last, versions.len().saturating_sub(1))?);
    if versions.len() < 2 || i >= j {
        return bad(format!(
            "--versions {}: give at least two releases, oldest first; the first end must come before the last",
            versions.join(",")
        ));
    }
    Ok(Plan { top: None, old: versions[i].clone(), list: versions[i + 1..=j].to_vec() })
}

/// Runs the setup command of release `version`; the first line it prints is the command that
/// serves the release. Everything it writes goes to `log`.
fn set_up(setup: &str, version: &str, log: &Path, stop: &AtomicBool) -> Result<String, String> {
    let line = setup.replace("{version}", version);
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(&line).stdin(std::process::Stdio::null());
    let (status, stdout, stderr) = match plateau_shell::children::run(&mut cmd, true, stop) {
        Ok(Ended::Exited { status, stdout, stderr }) => (status, stdout, stderr),
        Ok(Ended::Stopped) => return Err(INTERRUPTED.into()),
        Err(e) => return Err(format!("--setup {line:?}: {e}")),
    };
    let mut text = format!("$ {line}\n# stdout\n{}\n# stderr\n{}\n", lossy(&stdout), lossy(&stderr));
    if text.len() > MAX_SETUP_LOG_BYTES {
        let cut = (0..=MAX_SETUP_LOG_BYTES).rev().find(|i| text.is_char_boundary(*i)).unwrap_or(0);
        text.truncate(cut);
    }
    std::fs::write(log, text).map_err(|e| format!("{}: {e}", log.display()))?;
    if !status.success() {
        return Err(format!("--setup failed for {version} ({status}); its log: {}", log.display()));
    }
    let out = String::from_utf8_lossy(&stdout).into_owned();
    match out.lines().map(str::trim).find(|l| !l.is_empty()) {
        Some(serve) => Ok(serve.to_string()),
        None => Err(format!(
            "--setup printed no command for {version}: its first line of output must serve the release; its log: {}",
            log.display()
        )),
    }
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}
