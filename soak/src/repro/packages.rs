//! The server's versions, from its own environment: its Python and every installed
//! distribution, asked of the interpreter that ran it (server.json's `exe`).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long the server's interpreter may take to list its distributions (a venv of vLLM's
/// hundreds takes about a second).
const LIST_TIMEOUT_MS: u64 = 30_000;

const LIST: &str = "import importlib.metadata as m, json, sys\nprint(json.dumps({'python': sys.version.split()[0], 'packages': sorted({(d.metadata['Name'] or '?'): d.version for d in m.distributions()}.items())}))";

/// What the server ran on.
pub struct Packages {
    pub kind: String,
    pub python: Option<String>,
    pub list: Vec<(String, String)>,
}

/// The server's kind and, for a Python server, its interpreter's version and distributions;
/// None when the run recorded no server. The interpreter is the one of the virtual environment
/// the command starts (`VENV/bin/vllm serve` runs `VENV/bin/python`, whose packages are the
/// venv's, while the process's own executable is the base interpreter it links to), else the
/// one the server ran.
pub fn of_server(run_dir: &Path, command: Option<&str>) -> Option<Packages> {
    let server: serde_json::Value = plateau_reports::fsutil::read_run_json(&run_dir.join("server.json"))?;
    let kind = server["kind"].as_str().unwrap_or("unknown").to_string();
    let exe = server["exe"].as_str().filter(|_| kind == "python");
    let venv = command.and_then(venv_python);
    let listed = exe.and_then(|exe| list(venv.as_deref().unwrap_or(exe)));
    Some(Packages {
        kind,
        python: listed.as_ref().and_then(|v| v["python"].as_str().map(str::to_string)),
        list: listed
            .as_ref()
            .and_then(|v| v["packages"].as_array().cloned())
            .into_iter()
            .flatten()
            .filter_map(|p| Some((p[0].as_str()?.to_string(), p[1].as_str()?.to_string())))
            .collect(),
    })
}

/// The python beside the first program the command runs from a `bin` folder that has one.
fn venv_python(command: &str) -> Option<String> {
    let words = shlex::split(command)?;
    words.iter().filter(|w| w.starts_with('/')).find_map(|w| {
        let bin = Path::new(w).parent().filter(|b| b.ends_with("bin"))?;
        ["python", "python3"].iter().map(|p| bin.join(p)).find(|p| p.is_file()).map(|p| p.display().to_string())
    })
}

/// The interpreter's answer to [`LIST`], or None when it does not answer in time.
fn list(exe: &str) -> Option<serde_json::Value> {
    let mut child = Command::new(exe)
        .args(["-I", "-c", LIST])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let t0 = Instant::now();
    while child.try_wait().ok()?.is_none() {
        if t0.elapsed() > Duration::from_millis(LIST_TIMEOUT_MS) {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().ok()?;
    serde_json::from_slice(&out.stdout).ok()
}
