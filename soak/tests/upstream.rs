//! From a finding to a fix upstream: known growth accepted only as written (its rate, its date,
//! and nothing beside it), the release of a server that began a leak found by bisecting its
//! releases, and a reproduction with an issue body that runs without plateau.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::common;
use common::{plateau, s, text};

fn tmp(name: &str) -> PathBuf {
    common::tmp("upstream", name)
}

fn verdict(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("verdict.json")).unwrap()).unwrap()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A known-growth file of one entry for `site`.
fn known(dir: &Path, name: &str, site: &str, max: &str, until: &str) -> PathBuf {
    let p = dir.join(name);
    let text = format!(
        "[[known]]\nprocess = \"*\"\nsite = '{site}'\nmax_per_request = \"{max}\"\nreason = \"upstream issue 77: prompts are kept\"\nuntil = \"{until}\"\n"
    );
    std::fs::write(&p, text).unwrap();
    p
}

/// 200 iterations of n-sampling (60 of warm-up) against the Python server that keeps 4 KiB of
/// every prompt: at 60 iterations malloc's free bytes beside the growing heap are still undecided.
fn soak_leaking_server(dir: &Path, extra: &[&str]) -> Output {
    std::fs::create_dir_all(dir).unwrap();
    let script = dir.join("server.py");
    std::fs::write(&script, crate::where_::PYTHON_SERVER).unwrap();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let spawn = format!("python3 {} {port}", script.display());
    let out = dir.join("run");
    let mut args = vec!["run", "n-sampling", "--iterations", "200", "--warmup", "60", "--concurrency", "4", "--quiet"];
    args.extend(["--target", &url, "--spawn", &spawn, "--out", s(&out)]);
    args.extend_from_slice(extra);
    plateau(&args)
}

#[test]
#[cfg_attr(not(plateau_memray), ignore = "memray is not installed for python3 (python3 -m pip install memray)")]
fn known_growth_passes_only_at_its_rate_before_its_date_and_repro_writes_what_upstream_needs() {
    let d = tmp("known");
    let ok = known(&d, "ok.toml", "remember_prompt", "64KiB", "2999-01-01");
    let o = soak_leaking_server(&d.join("ok"), &["--known", s(&ok)]);
    let first = String::from_utf8_lossy(&o.stderr).lines().next().unwrap_or_default().to_string();
    assert!(
        first.contains("judged with known growth") && first.contains("ok.toml"),
        "first line: {first}\n{}",
        text(&o)
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let run = d.join("ok").join("run");
    let v = verdict(&run);
    assert_eq!(v["known"][0]["state"], "accepted", "{}", v["known"]);
    assert!(v["known"][0]["reason"].as_str().unwrap().contains("upstream issue 77"));
    assert!(v["summary"].as_str().unwrap().contains("known growth"), "{}", v["summary"]);
    assert!(v["evidence"]["files"]["known.json"].is_string(), "the known entries are not part of the evidence");
    // The same samples, judged with a lower rate or an expired entry, fail, saying which.
    for (file, want) in [
        (known(&d, "low.toml", "remember_prompt", "100B", "2999-01-01"), "above known entry 1"),
        (known(&d, "old.toml", "remember_prompt", "64KiB", "2000-01-01"), "expired: until 2000-01-01"),
    ] {
        let out = d.join(format!("analyze-{}", file.file_stem().unwrap().to_str().unwrap()));
        let o = plateau(&["analyze", s(&run.join("samples.jsonl")), "--known", s(&file), "--out", s(&out)]);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        assert!(text(&o).contains(want), "{want}: {}", text(&o));
    }
    // Without its known.json the run is judged as the leak it is: every reader says so, and a
    // reproduction is written for it.
    let bare = d.join("bare");
    common::copy_run(&run, &bare);
    std::fs::remove_file(bare.join("known.json")).unwrap();
    let o = plateau(&["report", s(&bare)]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let repro = d.join("repro");
    let o = plateau(&["repro", s(&bare), "--out", s(&repro)]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let issue = std::fs::read_to_string(repro.join("ISSUE.md")).unwrap();
    assert!(issue.contains("remember_prompt") && issue.contains("/request"), "{issue}");
    assert!(issue.contains("](memory.png)") && repro.join("memory.png").is_file(), "{issue}");
    let tmp_dir = std::env::temp_dir().display().to_string();
    assert!(!issue.contains(&tmp_dir) && !issue.contains("/root/") && !issue.contains("/home/"), "{issue}");
    let help = std::process::Command::new("python3").arg(repro.join("repro.py")).arg("--help").output().unwrap();
    assert!(help.status.success() && String::from_utf8_lossy(&help.stdout).contains("--pid"), "{help:?}");
}

#[test]
fn a_bad_known_file_and_known_growth_for_plateaus_own_engine_are_refused() {
    let d = tmp("refused");
    std::fs::write(d.join("bad.toml"), "[[known]]\nsite = \"(unclosed\"\n").unwrap();
    let o = plateau(&[
        "run",
        "n-sampling",
        "--iterations",
        "5",
        "--known",
        s(&d.join("bad.toml")),
        "--out",
        s(&d.join("r1")),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    for want in ["bad.toml: entry 1: `site`", "`reason` is required", "`until` is required"] {
        assert!(text(&o).contains(want), "{want}: {}", text(&o));
    }
    assert!(!d.join("r1").exists(), "a refused run left its directory");
    let good = known(&d, "good.toml", "x", "1KiB", "2999-01-01");
    let o = plateau(&["run", "n-sampling", "--iterations", "5", "--known", s(&good), "--out", s(&d.join("r2"))]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("known growth is a server's"), "{}", text(&o));
    // repro reproduces a server's growth: a run of plateau's own engine is refused.
    let own = d.join("own");
    let o = plateau(&[
        "run",
        "n-sampling",
        "--iterations",
        "30",
        "--warmup",
        "10",
        "--inject",
        "registry-retains-finished",
        "--quiet",
        "--no-replay",
        "--out",
        s(&own),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let o = plateau(&["repro", s(&own), "--out", s(&d.join("repro"))]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("plateau's own engine"), "{}", text(&o));
}

/// A setup script for releases 1 to 5 of a "server" (plateau serve): from release 3 on it keeps
/// finished requests; it prints the command that serves a release.
fn releases(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let exe = env!("CARGO_BIN_EXE_plateau");
    let setup = dir.join("setup.sh");
    let text = format!(
        "#!/bin/sh\necho \"setting up $1\" >&2\ncase $1 in 3|4|5) echo \"{exe} serve --inject registry-retains-finished\";; *) echo \"{exe} serve\";; esac\n"
    );
    std::fs::write(&setup, text).unwrap();
    setup
}

fn bisect_releases(d: &Path, setup: &Path, extra: &[&str]) -> Output {
    let setup = format!("sh {} {{version}}", setup.display());
    let mut args = vec!["bisect", "--quiet", "--versions", "1.0,1.1,3,4,5", "--setup", &setup, "--out"];
    let out = d.join("out");
    args.push(s(&out));
    args.extend_from_slice(extra);
    let soak = ["--", "run", "n-sampling", "--iterations", "30", "--warmup", "10"];
    args.extend_from_slice(&soak);
    args.extend(["--target", "http://127.0.0.1:{port}", "--spawn", "{serve} --port {port}"]);
    plateau(&args)
}

#[test]
fn bisect_names_the_release_that_began_a_leak_and_the_one_that_fixed_it() {
    let d = tmp("releases");
    let setup = releases(&d);
    let o = bisect_releases(&d.join("regression"), &setup, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let j: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("regression/out/bisect.json")).unwrap()).unwrap();
    assert_eq!(j["first_bad"], "3", "{j}");
    let bad = j["candidates"].as_array().unwrap().iter().find(|c| c["version"] == "3").unwrap();
    assert!(bad["failing"].as_array().is_some_and(|f| !f.is_empty()), "{bad}");
    let log = std::fs::read_to_string(d.join("regression/out/runs/3.logs/setup.log")).unwrap();
    assert!(log.contains("setting up 3"), "{log}");
    // A release's dots are no extension: 1.0's and 1.1's logs are their own.
    for v in ["1.0", "1.1"] {
        let log = std::fs::read_to_string(d.join(format!("regression/out/runs/{v}.logs/setup.log"))).unwrap();
        assert!(log.contains(&format!("setting up {v}")), "{log}");
    }
    // Releases 3 to 5 fail, so looking for a fix from 3 to 5 finds none: the ends are refused.
    let o = bisect_releases(&d.join("no-fix"), &setup, &["--find", "fix", "--bad", "3"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("did not pass its soak"), "{}", text(&o));
    // Bad input: a setup without {version}, a soak without {serve}, a release not listed.
    let cases: [(&[&str], &str); 3] = [
        (&["--versions", "1,2", "--setup", "true", "--", "run", "n-sampling"], "never uses {version}"),
        (&["--versions", "1,2", "--setup", "echo {version}", "--", "run", "n-sampling"], "never uses {serve}"),
        (
            &[
                "--versions",
                "1,2",
                "--setup",
                "echo {version}",
                "--good",
                "9",
                "--",
                "run",
                "n-sampling",
                "--spawn",
                "{serve}",
            ],
            "9 is not among --versions",
        ),
    ];
    for (args, want) in cases {
        let o = plateau(&[&["bisect", "--out", s(&d.join("bad"))][..], args].concat());
        assert_eq!(o.status.code(), Some(2), "{want}: {}", text(&o));
        assert!(text(&o).contains(want), "{want}: {}", text(&o));
    }
}
