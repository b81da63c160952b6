//! A Python server's replay under memray: a `sitecustomize` module put first on the server's
//! `PYTHONPATH` starts memray's tracker in every Python process of the server (one capture each,
//! `replay/memray.<pid>.bin`), and after the replay a small reader run by the server's own
//! interpreter (`memray_window.py`, through memray's API) sums, by Python stack, what was
//! allocated inside the window and still held at its end, half by half.
//!
//! memray must be installed in the server's environment (`python -m pip install memray`); without
//! it the module leaves a marker and plateau says how to install it.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::Window;
use crate::heapprof::symbolize::Frame;
use crate::heapprof::{Growth, StackGrowth};

const SITECUSTOMIZE: &str = include_str!("memray_site.py");
const READER: &str = include_str!("memray_window.py");

/// Writes the start-up module and the reader into the replay's directory; the environment the
/// server starts with.
pub fn prepare(out: &Path) -> Result<Vec<(String, String)>, String> {
    let py = out.join("py");
    let write = |p: PathBuf, text: &str| std::fs::write(&p, text).map_err(|e| format!("{}: {e}", p.display()));
    std::fs::create_dir_all(&py).map_err(|e| format!("{}: {e}", py.display()))?;
    write(py.join("sitecustomize.py"), SITECUSTOMIZE)?;
    write(out.join("memray_window.py"), READER)?;
    let path = match std::env::var("PYTHONPATH") {
        Ok(p) if !p.is_empty() => format!("{}:{p}", py.display()),
        _ => py.display().to_string(),
    };
    Ok(vec![("PYTHONPATH".into(), path), ("PLATEAU_MEMRAY_OUT".into(), out.join("memray").display().to_string())])
}

/// The growth inside `window` from the replay's captures, read by the server's interpreter `exe`.
pub fn growth(exe: &Path, out: &Path, window: &Window) -> Result<Growth, String> {
    let marker = out.join("memray.no-memray");
    if marker.exists() {
        let python = std::fs::read_to_string(&marker).unwrap_or_default();
        let python = if python.trim().is_empty() { exe.display().to_string() } else { python.trim().to_string() };
        return Err(format!(
            "memray is not installed in the server's Python ({python}): install it there (`{python} -m pip install memray`) and run again with --profile to name the allocating line"
        ));
    }
    let mut captures: Vec<PathBuf> = std::fs::read_dir(out)
        .map_err(|e| format!("{}: {e}", out.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("memray.") && n.ends_with(".bin"))
        })
        .collect();
    captures.sort();
    if captures.is_empty() {
        return Err(format!(
            "the replay's server wrote no memray capture into {} (a wrapper that cleared PYTHONPATH, or Python in a container?)",
            out.display()
        ));
    }
    let o = Command::new(exe)
        .arg(out.join("memray_window.py"))
        .args(window.unix_ms.iter().map(u64::to_string))
        .args(&captures)
        .output()
        .map_err(|e| format!("{}: {e}", exe.display()))?;
    if !o.status.success() {
        let err = String::from_utf8_lossy(&o.stderr);
        return Err(format!("reading the memray captures failed: {}", err.lines().last().unwrap_or("")));
    }
    let v: serde_json::Value =
        serde_json::from_slice(&o.stdout).map_err(|e| format!("the memray reader's output: {e}"))?;
    from_reader(&v, exe, window)
}

/// The reader's JSON as a growth: stacks counted where they grew in both halves of the window.
fn from_reader(v: &serde_json::Value, exe: &Path, window: &Window) -> Result<Growth, String> {
    let stdlib = v["stdlib"].as_str().unwrap_or("");
    let stacks = v["stacks"].as_array().ok_or("the memray reader's output has no `stacks`")?;
    let mut g = Growth {
        binary: exe.display().to_string(),
        start_iter: window.iters[0],
        end_iter: window.iters[2],
        stacks: Vec::new(),
        one_half_only: (0, 0),
        once: Vec::new(),
    };
    for s in stacks {
        let n = |k: &str| s[k].as_i64().unwrap_or(0);
        let (b1, b2) = (n("bytes_first_half"), n("bytes_second_half"));
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
                let own = !(file.starts_with('<')
                    || (!stdlib.is_empty() && file.starts_with(stdlib) && !file.contains("-packages/"))
                    || file.contains("/memray/")
                    || file.ends_with("sitecustomize.py"));
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
        let g = from_reader(&v, Path::new("/usr/bin/python3"), &w).unwrap();
        assert_eq!(g.stacks.len(), 1);
        assert_eq!(g.one_half_only, (1, 1_048_576));
        let site = g.stacks[0].site().unwrap();
        assert_eq!((site.function.as_str(), site.line), ("keep_forever", Some(12)));
        assert_eq!(g.bytes_per_iter(), 15_000.0 / 40.0);
    }
}
