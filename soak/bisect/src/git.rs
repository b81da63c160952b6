//! The git a bisect needs, through the `git` command: checking the user's repository and
//! revisions, listing the candidates, and scratch worktrees that leave the user's checkout, index
//! and HEAD as they were.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `git -C repo ARGS`: its trimmed standard output, or its standard error as the error.
pub fn git(repo: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(args)
        .output()
        .map_err(|e| format!("git: {e} (is git installed?)"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// The repository's top directory, or why `repo` is not a git repository.
pub fn toplevel(repo: &Path) -> Result<PathBuf, String> {
    if !repo.is_dir() {
        return Err(format!("--repo {}: not a directory", repo.display()));
    }
    git(repo, &["rev-parse", "--show-toplevel"])
        .map(PathBuf::from)
        .map_err(|e| format!("--repo {}: not a git repository ({e})", repo.display()))
}

/// The full commit id `rev` names, or why it names none (`flag` is the option it came from).
pub fn commit(repo: &Path, flag: &str, rev: &str) -> Result<String, String> {
    if rev.starts_with('-') {
        return Err(format!("{flag} {rev}: not a revision"));
    }
    git(repo, &["rev-parse", "--verify", "--quiet", "--end-of-options", &format!("{rev}^{{commit}}")])
        .ok()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| format!("{flag} {rev}: no such commit in {}", repo.display()))
}

/// Whether `a` is an ancestor of `b`.
pub fn is_ancestor(repo: &Path, a: &str, b: &str) -> bool {
    Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(["merge-base", "--is-ancestor", a, b])
        .status()
        .is_ok_and(|s| s.success())
}

/// The commits after `good` up to and including `bad` on the paths between them, oldest first.
pub fn candidates(repo: &Path, good: &str, bad: &str) -> Result<Vec<String>, String> {
    let out = git(repo, &["rev-list", "--reverse", "--ancestry-path", &format!("{good}..{bad}")])?;
    Ok(out.lines().map(String::from).collect())
}

/// A commit's subject line.
pub fn subject(repo: &Path, sha: &str) -> String {
    git(repo, &["log", "-1", "--format=%s", sha]).unwrap_or_default()
}

/// A scratch worktree of one commit, detached, removed (and pruned) when dropped.
pub struct Worktree {
    repo: PathBuf,
    pub path: PathBuf,
}

impl Worktree {
    pub fn add(repo: &Path, sha: &str, path: &Path) -> Result<Worktree, String> {
        let p = path.to_str().ok_or_else(|| format!("{}: not UTF-8", path.display()))?;
        git(repo, &["worktree", "add", "--detach", "--quiet", p, sha])
            .map_err(|e| format!("git worktree add {} {sha}: {e}", path.display()))?;
        Ok(Worktree { repo: repo.to_path_buf(), path: path.to_path_buf() })
    }
}

impl Drop for Worktree {
    fn drop(&mut self) {
        if let Some(p) = self.path.to_str() {
            let _ = git(&self.repo, &["worktree", "remove", "--force", p]);
        }
        let _ = std::fs::remove_dir_all(&self.path);
        let _ = git(&self.repo, &["worktree", "prune"]);
    }
}
