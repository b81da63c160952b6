//! A run directory is data: a verdict.json edited by hand is never believed over its samples,
//! its other files are read as inputs are (a FIFO refused at once, a terminal's escapes never
//! written raw), samples that contradict themselves are no complete pass while older samples
//! plateau wrote still read; and plateau behaves at the edges of its process: a closed pipe
//! keeps the verdict's exit code, SIGTERM stops a fuzz's soaks, a bisect writes nothing into the
//! repository it bisects.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::common;
use common::{plateau, s, text};

fn tmp(name: &str) -> PathBuf {
    common::tmp("data", name)
}

/// A 60-iteration run of n-sampling into `d`, with the registry leak when `leak`.
fn run(d: &Path, leak: bool) {
    let mut args = vec!["run", "n-sampling", "--iterations", "60", "--warmup", "10", "--quiet", "--no-replay"];
    if leak {
        args.extend(["--inject", "registry-retains-finished"]);
    }
    args.extend(["--out", s(d)]);
    let o = plateau(&args);
    assert_eq!(o.status.code(), Some(if leak { 1 } else { 0 }), "{}", text(&o));
}

/// The samples file's lines, each edited by `f` (the header is line 0).
fn edit_samples(from: &Path, to: &Path, f: impl Fn(usize, &mut serde_json::Value)) {
    let text = std::fs::read_to_string(from).unwrap();
    let lines: Vec<String> = text
        .lines()
        .enumerate()
        .map(|(i, l)| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            f(i, &mut v);
            serde_json::to_string(&v).unwrap()
        })
        .collect();
    std::fs::write(to, lines.join("\n") + "\n").unwrap();
}

#[test]
fn a_verdict_edited_to_pass_is_judged_again_everywhere_and_history_keeps_the_failure() {
    let root = tmp("forged");
    let genuine = root.join("fail");
    run(&genuine, true);
    let forged = root.join("forged");
    common::copy_run(&genuine, &forged);
    let mut v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(forged.join("verdict.json")).unwrap()).unwrap();
    v["verdict"] = "pass".into();
    for m in v["metrics"].as_array_mut().unwrap() {
        m["status"] = "pass".into();
    }
    let written = serde_json::to_vec(&v).unwrap();
    std::fs::write(forged.join("verdict.json"), &written).unwrap();
    for cmd in ["report", "explain"] {
        let o = plateau(&[cmd, s(&forged)]);
        assert_eq!(o.status.code(), Some(1), "{cmd}: {}", text(&o));
        assert!(text(&o).contains("it says pass, and its samples judge fail"), "{cmd}: {}", text(&o));
    }
    assert_eq!(std::fs::read(forged.join("verdict.json")).unwrap(), written, "the file is left as it is");
    // Only the evidence's settings edited: noticed too.
    let mut v2: serde_json::Value =
        serde_json::from_slice(&std::fs::read(genuine.join("verdict.json")).unwrap()).unwrap();
    v2["evidence"]["settings"]["warmup_iterations"] = "5".into();
    let settings = root.join("settings");
    common::copy_run(&genuine, &settings);
    std::fs::write(settings.join("verdict.json"), serde_json::to_vec(&v2).unwrap()).unwrap();
    let o = plateau(&["explain", s(&settings)]);
    assert!(text(&o).contains("its `evidence` is not what its samples judge"), "{}", text(&o));

    // history stores the judgement; a night stored under another verdict (as an older plateau
    // stored a forged pass) is replaced when its samples come again.
    let db = root.join("h.db");
    let o = plateau(&["history", "add", s(&forged), "--db", s(&db)]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let c = rusqlite::Connection::open(&db).unwrap();
    let verdict = || c.query_row("select verdict from runs", [], |r| r.get::<_, String>(0)).unwrap();
    assert_eq!(verdict(), "fail");
    c.execute("update runs set verdict = 'pass'", []).unwrap();
    let o = plateau(&["history", "add", s(&genuine), "--db", s(&db)]);
    assert!(text(&o).contains("1 stored before under another verdict replaced"), "{}", text(&o));
    assert_eq!(verdict(), "fail");
    let count: i64 = c.query_row("select count(*) from runs", [], |r| r.get(0)).unwrap();
    assert_eq!(count, 1);
}

#[test]
fn samples_that_contradict_themselves_are_never_a_complete_pass_and_old_ones_still_read() {
    let root = tmp("contradict");
    let ok = root.join("ok");
    run(&ok, false);
    let samples = ok.join("samples.jsonl");
    // Planned 1,000 iterations, "completed" at 60.
    let short = root.join("short.jsonl");
    edit_samples(&samples, &short, |i, v| {
        if i == 0 {
            v["planned_iterations"] = 1000.into();
        }
    });
    let o = plateau(&["analyze", s(&short), "--out", s(&root.join("short"))]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    assert!(text(&o).contains("completed at iteration 60 of the 1000 it planned"), "{}", text(&o));
    // "decided" at 60 of 1,000 with nothing failed.
    let decided = root.join("decided.jsonl");
    edit_samples(&samples, &decided, |i, v| {
        if i == 0 {
            v["planned_iterations"] = 1000.into();
        }
        if v.get("end").is_some() {
            v["end"]["state"] = "decided".into();
        }
    });
    let o = plateau(&["analyze", s(&decided), "--out", s(&root.join("decided"))]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    // Relations in a cycle: bad input naming the metrics.
    let cycle = root.join("cycle.jsonl");
    edit_samples(&samples, &cycle, |i, v| {
        if i == 0 {
            v["metrics"]["jemalloc.allocated"]["overhead_of"] = "jemalloc.active".into();
        }
    });
    let o = plateau(&["analyze", s(&cycle), "--out", s(&root.join("cycle"))]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("relations form a cycle"), "{}", text(&o));
    // A derived gauge negative, as plateau wrote it before its base-block change: read, said.
    let old = root.join("old.jsonl");
    edit_samples(&samples, &old, |_, v| {
        if v["values"].get("proc.anon_outside_heap").is_some() {
            v["values"]["proc.anon_outside_heap"] = (-2_441_216.0).into();
        }
    });
    let o = plateau(&["analyze", s(&old), "--out", s(&root.join("old"))]);
    assert_ne!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("values.proc.anon_outside_heap: negative in"), "{}", text(&o));
    // A measured amount negative stays bad input.
    let bad = root.join("bad.jsonl");
    edit_samples(&samples, &bad, |i, v| {
        if i == 3 {
            v["values"]["jemalloc.allocated"] = (-1.0).into();
        }
    });
    let o = plateau(&["analyze", s(&bad), "--out", s(&root.join("bad"))]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

/// Samples files earlier plateaus wrote, each made by checking out that commit and running
/// `plateau run n-sampling --iterations 30` (tests/fixtures/samples-DATE-COMMIT.jsonl): today's
/// reader reads them all. The oldest holds negative `proc.anon_outside_heap` values (RssAnon less
/// jemalloc's resident bytes, as plateau measured it then), read with a warning.
#[test]
fn samples_every_earlier_plateau_wrote_are_read() {
    let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures"));
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    assert!(files.len() >= 2, "{files:?}");
    let root = tmp("fixtures");
    for f in &files {
        let name = f.file_name().unwrap().to_str().unwrap();
        let o = plateau(&["analyze", s(f), "--out", s(&root.join(name))]);
        assert!(matches!(o.status.code(), Some(0 | 1 | 4)), "{name}: {}", text(&o));
        if name.contains("8ef59b1") {
            assert!(text(&o).contains("values.proc.anon_outside_heap: negative in"), "{name}: {}", text(&o));
        }
    }
}

#[test]
fn a_run_directory_s_files_are_read_as_data() {
    let root = tmp("files");
    let ok = root.join("ok");
    run(&ok, false);
    // A FIFO as command.json: refused at once, never opened.
    let fifo = root.join("fifo");
    common::copy_run(&ok, &fifo);
    std::fs::remove_file(fifo.join("command.json")).unwrap();
    let made = Command::new("mkfifo").arg(fifo.join("command.json")).status().unwrap();
    assert!(made.success());
    let o = plateau(&["shrink", s(&fifo), "--budget", "10s", "--quiet"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("not a regular file"), "{}", text(&o));
    // A FIFO or a device given to `run` as a file it reads: refused at once, naming the flag.
    let out = root.join("fifo-run");
    for args in [
        vec!["--target", "http://127.0.0.1:1", "--metrics-map", s(&fifo.join("command.json"))],
        vec!["--topology", s(&fifo.join("command.json"))],
        vec!["--topology", "/dev/zero"],
    ] {
        let mut all = vec!["run", "n-sampling", "--quiet", "--out", s(&out)];
        all.extend(args);
        let o = plateau(&all);
        assert_eq!(o.status.code(), Some(2), "{all:?}: {}", text(&o));
        assert!(text(&o).contains("not a regular file"), "{all:?}: {}", text(&o));
    }
    // A scenario name holding a terminal's escapes is never written raw.
    let esc = root.join("esc");
    common::copy_run(&ok, &esc);
    edit_samples(&ok.join("samples.jsonl"), &esc.join("samples.jsonl"), |i, v| {
        if i == 0 {
            v["scenario"] = "x\u{1b}]0;TITLE\u{7}\u{1b}[2J".into();
        }
    });
    let o = plateau(&["explain", s(&esc)]);
    assert!(!text(&o).contains('\u{1b}'), "{}", text(&o));
    assert!(text(&o).contains("x\\u{1b}]0;TITLE"), "{}", text(&o));
    // analyze --out into a directory of the user's: refused, their file kept.
    let mine = root.join("mine");
    std::fs::create_dir_all(&mine).unwrap();
    std::fs::write(mine.join("report.html"), "mine").unwrap();
    let o = plateau(&["analyze", s(&ok.join("samples.jsonl")), "--out", s(&mine)]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert_eq!(std::fs::read_to_string(mine.join("report.html")).unwrap(), "mine");
}

/// `plateau ARGS` with its stdout (and, with `both`, its stderr) a pipe whose reader is gone.
fn closed_pipe(args: &[&str], both: bool) -> (Option<i32>, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_plateau"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(c.stdout.take());
    let mut err = String::new();
    if both {
        drop(c.stderr.take());
    } else {
        std::io::Read::read_to_string(c.stderr.as_mut().unwrap(), &mut err).unwrap();
    }
    (c.wait().unwrap().code(), err)
}

#[test]
fn a_closed_pipe_never_panics_and_the_verdict_s_code_stays() {
    let (code, err) = closed_pipe(&["list"], false);
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let d = tmp("pipe").join("fail");
    run(&d, true);
    let (code, _) = closed_pipe(&["analyze", s(&d.join("samples.jsonl")), "--out", s(&d.join("an"))], true);
    assert_eq!(code, Some(1));
}

/// A plateau this test started, stopped by SIGTERM (then SIGKILL) when the test ends, pass or
/// fail: a failed assertion must not leave its soaks running on the machine.
struct Started(std::process::Child);

impl Drop for Started {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            // SAFETY: kill(2) to the process this test started.
            unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
            let t0 = std::time::Instant::now();
            while matches!(self.0.try_wait(), Ok(None)) && t0.elapsed() < std::time::Duration::from_secs(30) {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

#[test]
fn sigterm_to_fuzz_stops_its_soaks_and_exits_undecided() {
    let d = tmp("sigterm");
    let mut fuzz = Started(
        Command::new(env!("CARGO_BIN_EXE_plateau"))
            .args(["fuzz", "n-sampling", "--cases", "4", "--iterations", "100000", "--jobs", "2", "--budget", "10m"])
            .args(["--quiet", "--out", s(&d.join("fz"))])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // A child is listed under the thread that started it: every thread's list.
    let pid = fuzz.0.id();
    let children = || -> Vec<i32> {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).map(|d| d.flatten().collect::<Vec<_>>());
        let lists = tasks.unwrap_or_default().into_iter().map(|t| t.path().join("children"));
        let text: String = lists.map(|p| std::fs::read_to_string(p).unwrap_or_default() + " ").collect();
        text.split_whitespace().filter_map(|p| p.parse().ok()).collect()
    };
    let t0 = std::time::Instant::now();
    let mut kids = Vec::new();
    while kids.is_empty() && t0.elapsed() < std::time::Duration::from_secs(60) {
        std::thread::sleep(std::time::Duration::from_millis(100));
        kids = children();
    }
    assert!(!kids.is_empty(), "fuzz started no soak within 60 s");
    std::thread::sleep(std::time::Duration::from_millis(500));
    // SAFETY: kill(2) sends a signal to the fuzz process this test started.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let mut err = String::new();
    std::io::Read::read_to_string(fuzz.0.stderr.as_mut().unwrap(), &mut err).unwrap();
    let status = fuzz.0.wait().unwrap();
    assert_eq!(status.code(), Some(4), "{err}");
    assert!(err.contains("interrupted"), "{err}");
    // SAFETY: signal 0 only asks whether each process exists.
    let left: Vec<i32> = kids.into_iter().filter(|&k| unsafe { libc::kill(k, 0) } == 0).collect();
    assert!(left.is_empty(), "soaks left running after SIGTERM: {left:?}");
}

#[test]
fn bisect_with_a_relative_out_leaves_the_repository_as_it_was() {
    let d = tmp("bisect-out");
    let repo = d.join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    let git = |args: &[&str]| {
        let o = Command::new("git").arg("-C").arg(&repo).args(args).output().unwrap();
        assert!(o.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).to_string()
    };
    git(&["init", "-q", "."]);
    for m in ["one", "two"] {
        git(&["-c", "user.email=t@example.invalid", "-c", "user.name=T", "commit", "-q", "--allow-empty", "-m", m]);
    }
    let o = Command::new(env!("CARGO_BIN_EXE_plateau"))
        .current_dir(&d)
        .args(["bisect", "--repo", s(&repo), "--good", "HEAD~1", "--bad", "HEAD", "--out", "b", "--quiet"])
        .args(["--", "run", "n-sampling", "--iterations", "30", "--warmup", "5", "--no-replay"])
        .output()
        .unwrap();
    assert!(d.join("b").is_dir(), "{}", text(&o));
    assert_eq!(git(&["status", "--porcelain", "--untracked-files=all"]), "", "{}", text(&o));
    let entries: Vec<_> = std::fs::read_dir(&repo).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(entries, vec![std::ffi::OsString::from(".git")], "{}", text(&o));
    assert_eq!(git(&["worktree", "list"]).lines().count(), 1);
}

#[test]
fn ctrl_c_to_bisect_s_group_ends_it_interrupted_and_never_soaks_longer() {
    let d = tmp("bisect-int");
    let repo = empty_repo(&d.join("repo"));
    let out = d.join("b");
    let mut b = Started(
        Command::new(env!("CARGO_BIN_EXE_plateau"))
            .args(["bisect", "--repo", s(&repo), "--good", "HEAD~1", "--bad", "HEAD", "--out", s(&out), "--quiet"])
            .args(["--", "run", "n-sampling", "--iterations", "100000", "--no-replay"])
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // Its soaks are under way once their run directories hold samples.
    let t0 = std::time::Instant::now();
    let runs = out.join("runs");
    let soaking = || {
        std::fs::read_dir(&runs).map(|d| d.flatten().any(|e| e.path().join("samples.jsonl").exists())).unwrap_or(false)
    };
    while !soaking() && t0.elapsed() < std::time::Duration::from_secs(60) {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(soaking(), "bisect started no soak within 60 s");
    // SAFETY: kill(2) to the process group this test made for bisect (Ctrl-C at a terminal).
    unsafe { libc::kill(-(b.0.id() as i32), libc::SIGINT) };
    let mut err = String::new();
    std::io::Read::read_to_string(b.0.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(b.0.wait().unwrap().code(), Some(4), "{err}");
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("bisect.json")).unwrap()).unwrap();
    assert_eq!(report["interrupted"], true, "{report}");
    let longer =
        std::fs::read_dir(&runs).unwrap().flatten().filter(|e| e.path().extension().is_some_and(|x| x == "longer"));
    assert_eq!(longer.count(), 0, "an interrupted soak was soaked again, longer");
    assert!(!out.join("worktrees").exists(), "its worktrees were left");
}

/// A repository of two empty commits at `repo`.
fn empty_repo(repo: &Path) -> PathBuf {
    std::fs::create_dir_all(repo).unwrap();
    for args in [
        &["init", "-q", "."][..],
        &["-c", "user.email=t@example.invalid", "-c", "user.name=T", "commit", "-q", "--allow-empty", "-m", "one"],
        &["-c", "user.email=t@example.invalid", "-c", "user.name=T", "commit", "-q", "--allow-empty", "-m", "two"],
    ] {
        let o = Command::new("git").arg("-C").arg(repo).args(args).output().unwrap();
        assert!(o.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    }
    repo.to_path_buf()
}

#[test]
fn smaller_inputs_that_were_taken_are_refused() {
    // --max-iterations without --until-decided caps nothing: said, exit 2.
    let o = plateau(&["run", "n-sampling", "--stop-when-decided", "--max-iterations", "50", "--iterations", "30"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--max-iterations 50 is the cap of --until-decided"), "{}", text(&o));
    // setup-vllm.sh takes one argument: `--force` is not silently dropped.
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/external/setup-vllm.sh");
    let o = Command::new("bash").args([script, "0.8.5", "--force"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("one argument at most"), "{}", text(&o));
}
