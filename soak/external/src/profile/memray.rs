//! A Python server's replay under memray: plateau's hook ([`crate::python`]) is in every
//! Python process of the server the replay starts; at the window's start the replay asks the
//! processes that grew to start memray's tracker (one capture each, `replay/memray.<pid>.bin`,
//! named with their interpreters in `replay/memray-processes.json`), and at its end to stop it, so
//! the server runs at its own pace outside the window. After the replay, a small reader run by the
//! server's own interpreter (`memray_window.py`, through memray's API; a virtual environment's
//! python, where the server lives) sums, by Python stack, what was allocated inside the window and
//! still held at its end, half by half.
//!
//! memray must be installed in the server's environment (`python -m pip install memray`); without
//! it the replay leaves a marker and plateau says how to install it.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::Window;
use plateau_profile::symbolize::Frame;
use plateau_profile::{Growth, StackGrowth};

const READER: &str = include_str!("memray_window.py");

/// Writes the reader into the replay's directory; the environment the server starts with (none:
/// the hook is in every server plateau starts).
pub fn prepare(out: &Path) -> Result<Vec<(String, String)>, String> {
    let p = out.join("memray_window.py");
    std::fs::write(&p, READER).map_err(|e| format!("{}: {e}", p.display()))?;
    Ok(Vec::new())
}

/// The processes the replay recorded, from `memray-processes.json`: (pid, interpreter).
fn recorded(out: &Path) -> Result<Vec<(i64, Option<String>)>, String> {
    let p = out.join("memray-processes.json");
    let text =
        std::fs::read_to_string(&p).map_err(|e| format!("{}: {e} (did the replay reach its window?)", p.display()))?;
    let v: Vec<serde_json::Value> = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))?;
    Ok(v.iter().filter_map(|t| Some((t["pid"].as_i64()?, t["executable"].as_str().map(str::to_string)))).collect())
}

/// The growth inside `window` from the replay's captures, read by the recorded processes' own
/// interpreter (else `exe`, the server's as the run saw it).
pub fn growth(exe: &Path, out: &Path, window: &Window, package: Option<&str>) -> Result<Growth, String> {
    let marker = out.join("memray.no-memray");
    if marker.exists() {
        let python = std::fs::read_to_string(&marker).unwrap_or_default();
        let python = if python.trim().is_empty() { exe.display().to_string() } else { python.trim().to_string() };
        return Err(format!(
            "memray is not installed in the server's Python ({python}): install it there (`{python} -m pip install memray`) and run again with --profile to name the allocating line"
        ));
    }
    let tracked = recorded(out)?;
    if tracked.is_empty() {
        return Err(format!(
            "no Python process of the replay's server answered plateau's hook (see {}): a wrapper that clears PYTHONPATH, or Python in a container?",
            out.join("memray-processes.json").display()
        ));
    }
    let captures: Vec<PathBuf> =
        tracked.iter().map(|(pid, _)| out.join(format!("memray.{pid}.bin"))).filter(|p| p.exists()).collect();
    if captures.is_empty() {
        return Err(format!("the replay's server wrote no memray capture into {}", out.display()));
    }
    let python = tracked.iter().find_map(|(_, e)| e.clone()).map(PathBuf::from).unwrap_or_else(|| exe.to_path_buf());
    let o = Command::new(&python)
        .arg(out.join("memray_window.py"))
        .args(window.unix_ms.iter().map(u64::to_string))
        .args(&captures)
        .output()
        .map_err(|e| format!("{}: {e}", python.display()))?;
    if !o.status.success() {
        let err = String::from_utf8_lossy(&o.stderr);
        return Err(format!(
            "reading the memray captures with {} failed: {}",
            python.display(),
            err.lines().last().unwrap_or("")
        ));
    }
    let v: serde_json::Value =
        serde_json::from_slice(&o.stdout).map_err(|e| format!("the memray reader's output: {e}"))?;
    from_reader(&v, &python, window, package)
}

/// The top-level package a Python server's command runs, whose frames are the server's own code
/// (a site names its innermost one, not the library it called into): `python -m vllm.entrypoints
/// ...` runs `vllm`; a console script such as `.../bin/vllm` imports its entry point (`from
/// vllm.entrypoints.cli.main import main`). None for a script outside any package (then every
/// frame outside the standard library is the server's own) or a command that is not Python.
pub fn server_package(spawn: &str) -> Option<String> {
    let words = shlex::split(spawn)?;
    let mut rest =
        words.iter().skip_while(|w| *w == "env" || w.ends_with("/env") || w.starts_with('-') || w.contains('='));
    let program = rest.next()?;
    let name = Path::new(program).file_name()?.to_string_lossy().into_owned();
    let top = |module: &str| module.split('.').next().filter(|m| !m.is_empty()).map(str::to_string);
    if name.starts_with("python") {
        let args: Vec<&String> = rest.collect();
        return args.iter().position(|a| *a == "-m").and_then(|i| args.get(i + 1)).and_then(|m| top(m));
    }
    let path = if program.contains('/') {
        PathBuf::from(program)
    } else {
        std::env::var_os("PATH")
            .and_then(|p| std::env::split_paths(&p).map(|d| d.join(program)).find(|c| c.is_file()))?
    };
    let head = std::fs::read(&path).ok()?;
    let head = String::from_utf8_lossy(&head[..head.len().min(4096)]).into_owned();
    if !head.starts_with("#!") || !head.lines().next()?.contains("python") {
        return None;
    }
    // pip's console scripts import `re` and `sys`, then their entry point with `from`.
    head.lines().find_map(|l| {
        let module = l.trim().strip_prefix("from ")?.split_whitespace().next()?;
        top(module).filter(|m| m != "__future__")
    })
}

/// The package a file of a Python stack belongs to: the first folder after `site-packages/` or
/// `dist-packages/`; None for a file outside them.
fn package_of(file: &str) -> Option<&str> {
    let i = file.find("-packages/")?;
    file[i + "-packages/".len()..].split('/').next()
}

/// The reader's JSON as a growth: stacks counted where they grew in both halves of the window.
fn from_reader(v: &serde_json::Value, exe: &Path, window: &Window, package: Option<&str>) -> Result<Growth, String> {
    let stdlib = v["stdlib"].as_str().unwrap_or("");
    let stacks = v["stacks"].as_array().ok_or("the memray reader's output has no `stacks`")?;
    let mut g = Growth {
        binary: exe.display().to_string(),
        source: "a profiled replay under memray, by stacks that grew in both halves".into(),
        start_iter: window.iters[0],
        end_iter: window.iters[2],
        stacks: Vec::new(),
        one_half_only: (0, 0),
        shrank: (0, 0),
        once: Vec::new(),
    };
    for s in stacks {
        let n = |k: &str| s[k].as_i64().unwrap_or(0);
        let (b1, b2) = (n("bytes_first_half"), n("bytes_second_half"));
        if b1 < 0 && b2 < 0 {
            g.shrank.0 += 1;
            g.shrank.1 += b1 + b2;
            continue;
        }
        if !(b1 > 0 && b2 > 0) {
            g.one_half_only.0 += 1;
            g.one_half_only.1 += b1 + b2;
            continue;
        }
        let frames: Vec<Vec<Frame>> = s["frames"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|f| {
                let file = f["file"].as_str().unwrap_or("?").to_string();
                let tooling = file.starts_with('<')
                    || (!stdlib.is_empty() && file.starts_with(stdlib) && !file.contains("-packages/"))
                    || file.contains("/memray/")
                    || file.ends_with("sitecustomize.py");
                // The server's own package where its command names one; else whatever is not the
                // standard library's.
                let own = !tooling && package.is_none_or(|p| package_of(&file) == Some(p));
                vec![Frame {
                    function: f["function"].as_str().unwrap_or("?").to_string(),
                    file: Some(file),
                    line: f["line"].as_u64().map(|l| l as u32),
                    own,
                }]
            })
            .collect();
        // Python frames have no addresses: a stable one per frame, for the pprof profile.
        let addrs = frames
            .iter()
            .map(|f| {
                let f = &f[0];
                plateau_engine::stable_hash::StableHasher::new()
                    .bytes(f.function.as_bytes())
                    .bytes(f.file.as_deref().unwrap_or("").as_bytes())
                    .u32(f.line.unwrap_or(0))
                    .finish()
            })
            .collect();
        g.stacks.push(StackGrowth {
            addrs,
            frames,
            objects: n("objects_first_half") + n("objects_second_half"),
            bytes: b1 + b2,
        });
    }
    g.stacks.sort_by(|x, y| y.bytes.cmp(&x.bytes).then(x.addrs.cmp(&y.addrs)));
    // The reader lists the top stacks; its total covers them all: what the counted stacks do not
    // hold is the rest's net change.
    if let Some(net) = v["net_bytes"].as_i64() {
        let counted: i64 = g.stacks.iter().map(|s| s.bytes).sum();
        g.one_half_only.1 = net - counted;
    }
    Ok(g)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stacks_that_grew_in_both_halves_count_and_the_stdlib_is_not_the_site() {
        let v = serde_json::json!({
            "stdlib": "/usr/lib/python3.11",
            "stacks": [
                {"frames": [{"function": "append", "file": "/usr/lib/python3.11/json/x.py", "line": 3},
                            {"function": "keep_forever", "file": "/srv/app.py", "line": 12}],
                 "bytes_first_half": 6000, "objects_first_half": 2, "bytes_second_half": 9000, "objects_second_half": 3},
                {"frames": [{"function": "scratch", "file": "/srv/app.py", "line": 40}],
                 "bytes_first_half": 0, "objects_first_half": 0, "bytes_second_half": 1048576, "objects_second_half": 1}
            ]
        });
        let w = Window { iters: [20, 40, 60], unix_ms: [1, 2, 3] };
        let g = from_reader(&v, Path::new("/usr/bin/python3"), &w, None).unwrap();
        assert_eq!(g.stacks.len(), 1);
        assert_eq!(g.one_half_only, (1, 1_048_576));
        let site = g.stacks[0].site().unwrap();
        assert_eq!((site.function.as_str(), site.line), ("keep_forever", Some(12)));
        assert_eq!(g.bytes_per_iter(), 15_000.0 / 40.0);
    }

    #[test]
    fn a_server_s_own_package_holds_its_site_not_the_library_it_called() {
        let v = serde_json::json!({
            "stdlib": "/usr/lib/python3.11",
            "stacks": [{"frames": [
                {"function": "__call__", "file": "/v/lib/python3.11/site-packages/torch/_ops.py", "line": 875},
                {"function": "forward", "file": "/v/lib/python3.11/site-packages/vllm/model_executor/models/llama.py", "line": 406},
                {"function": "run", "file": "/usr/lib/python3.11/threading.py", "line": 9}],
                "bytes_first_half": 10, "objects_first_half": 1, "bytes_second_half": 10, "objects_second_half": 1}]
        });
        let w = Window { iters: [20, 40, 60], unix_ms: [1, 2, 3] };
        let g = from_reader(&v, Path::new("/v/bin/python"), &w, Some("vllm")).unwrap();
        assert_eq!(g.stacks[0].site().unwrap().function, "forward");
        let g = from_reader(&v, Path::new("/v/bin/python"), &w, None).unwrap();
        assert_eq!(g.stacks[0].site().unwrap().function, "__call__");
    }

    #[test]
    fn the_package_a_command_runs() {
        assert_eq!(
            server_package("env A=1 python3 -m vllm.entrypoints.openai.api_server --model m").as_deref(),
            Some("vllm")
        );
        assert_eq!(server_package("python3 server.py --port 1"), None);
        let dir = std::env::temp_dir().join(format!("plateau-pkg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join("vllm");
        std::fs::write(&script, "#!/v/bin/python\n# -*- coding: utf-8 -*-\nimport re\nimport sys\nfrom vllm.entrypoints.cli.main import main\n").unwrap();
        let cmd = format!("env X=1 {} serve /m --port 8", script.display());
        assert_eq!(server_package(&cmd).as_deref(), Some("vllm"));
        std::fs::write(&script, "\x7fELF").unwrap();
        assert_eq!(server_package(&cmd), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
