//! `plateau bisect` end to end on a scratch repository: six commits of a server's start script,
//! the fourth of which starts it with a leak. Bisect names that commit, leaves the checkout as it
//! was and removes its worktrees; a good end that leaks is refused; bad input exits 2.

use crate::common;

use std::path::Path;
use std::process::Command;

use common::{plateau, tmp};

fn git(repo: &Path, args: &[&str]) -> String {
    let o = Command::new("git").arg("-C").arg(repo).args(args).output().expect("git");
    assert!(o.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// A repository whose serve.sh starts `plateau serve` on the port it is given; from the 4th of
/// six commits on, with a registry leak. Returns the commits, oldest first.
fn repo(dir: &Path) -> Vec<String> {
    std::fs::create_dir_all(dir).unwrap();
    git(dir, &["init", "-q", "."]);
    git(dir, &["config", "user.email", "t@example.invalid"]);
    git(dir, &["config", "user.name", "T"]);
    let exe = env!("CARGO_BIN_EXE_plateau");
    let mut commits = Vec::new();
    for i in 1..=6 {
        let inject = if i >= 4 { " --inject registry-retains-finished" } else { "" };
        std::fs::write(dir.join("serve.sh"), format!("exec {exe} serve --port \"$1\"{inject}\n# {i}\n")).unwrap();
        git(dir, &["add", "serve.sh"]);
        git(dir, &["commit", "-qm", &format!("c{i}")]);
        commits.push(git(dir, &["rev-parse", "HEAD"]));
    }
    commits
}

const SOAK: [&str; 10] = [
    "--",
    "run",
    "n-sampling",
    "--iterations",
    "30",
    "--warmup",
    "10",
    "--target",
    "http://127.0.0.1:{port}",
    "--spawn=sh {worktree}/serve.sh {port}",
];

fn bisect(repo: &Path, out: &Path, good: &str, bad: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["bisect", "--quiet", "--repo", repo.to_str().unwrap(), "--good", good, "--bad", bad];
    args.extend(["--out", out.to_str().unwrap()]);
    args.extend_from_slice(extra);
    args.extend_from_slice(&SOAK);
    plateau(&args)
}

#[test]
fn names_the_commit_that_leaks_and_leaves_the_checkout_as_it_was() {
    let d = tmp("bisect", "names");
    let r = d.join("repo");
    let c = repo(&r);
    let before = (git(&r, &["rev-parse", "HEAD"]), git(&r, &["status", "--porcelain"]));
    let o = bisect(&r, &d.join("out"), &c[0], &c[5], &["--jobs", "2"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("out/bisect.json")).unwrap()).unwrap();
    assert_eq!(j["first_bad"], c[3].as_str(), "{j}");
    let first = j["candidates"].as_array().unwrap().iter().find(|x| x["commit"] == c[3].as_str()).unwrap();
    assert_eq!(first["verdict"], "fail");
    assert!(first["failing"].as_array().unwrap().iter().any(|m| m == "target.registry.requests"), "{first}");
    assert_eq!((git(&r, &["rev-parse", "HEAD"]), git(&r, &["status", "--porcelain"])), before);
    assert_eq!(git(&r, &["worktree", "list"]).lines().count(), 1, "worktrees left behind");
    let story = std::fs::read_to_string(d.join("out/story.md")).unwrap();
    assert!(story.contains(&c[3]) && story.contains("c4"), "{story}");
    assert!(d.join("out/report.html").exists());
}

#[test]
fn a_good_end_that_leaks_is_refused_with_its_verdict() {
    let d = tmp("bisect", "good-leaks");
    let r = d.join("repo");
    let c = repo(&r);
    let o = bisect(&r, &d.join("out"), &c[3], &c[5], &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("did not pass its soak: fail (exit 1)"), "{err}");
    assert_eq!(git(&r, &["worktree", "list"]).lines().count(), 1, "worktrees left behind");
}

#[test]
fn bad_input_is_refused_before_anything_is_soaked() {
    let d = tmp("bisect", "bad-input");
    let r = d.join("repo");
    let c = repo(&r);
    let out = d.join("out");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--repo", d.to_str().unwrap(), "--good", &c[0], "--bad", &c[5], "--", "run", "n-sampling"],
            "not a git repository",
        ),
        (
            vec!["--repo", r.to_str().unwrap(), "--good", "nope", "--bad", &c[5], "--", "run", "n-sampling"],
            "--good nope: no such commit",
        ),
        (
            vec!["--repo", r.to_str().unwrap(), "--good", &c[5], "--bad", &c[0], "--", "run", "n-sampling"],
            "is not an ancestor of --bad",
        ),
        (vec!["--repo", r.to_str().unwrap(), "--good", &c[0], "--bad", &c[5]], "bisect needs the soak"),
        (
            vec!["--repo", r.to_str().unwrap(), "--good", &c[0], "--bad", &c[5], "--", "n-sampling"],
            "give the soak: run SCENARIO",
        ),
        (
            vec![
                "--repo",
                r.to_str().unwrap(),
                "--good",
                &c[0],
                "--bad",
                &c[5],
                "--",
                "run",
                "n-sampling",
                "--out",
                "x",
            ],
            "the soak's --out",
        ),
    ];
    for (args, want) in cases {
        let mut all = vec!["bisect", "--out", out.to_str().unwrap()];
        all.extend(args);
        let o = plateau(&all);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{want}: {err}");
        assert!(err.contains(want), "{want}: {err}");
    }
}
