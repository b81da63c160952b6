//! A deployment of separate server processes soaked as one target (`plateau run SCENARIO
//! --topology FILE`): a prefill/decode pair and its proxy, as vLLM and SGLang deploy P/D.
//!
//! The file lists the processes in the order they start, each with a role, a spawn command, the
//! name of the port it listens on and a health URL, and the URL requests go to:
//!
//! ```toml
//! url = "http://127.0.0.1:{port:proxy}"
//! [[process]]
//! role = "prefill"
//! port = "prefill"
//! spawn = "{plateau} serve {scenario} --role prefill --port {port:prefill} {inject}"
//! health = "tcp://127.0.0.1:{port:prefill}"
//! ```
//!
//! An optional `[soak]` table (`iterations`, `warmup_iterations`, both) is how long a soak over
//! the deployment runs where the command line gives no length: it replaces the scenario's target
//! length, since a deployment of real servers can take seconds an iteration.
//!
//! Placeholders: `{port:NAME}` a free loopback port, the same wherever NAME appears (in `url` and
//! `health`, NAME must be some process's `port`: else a role is missing); `{inject}` the run's `--inject` flags; `{scenario}` the scenario as
//! given; `{plateau}` this program; `{{` and `}}` are braces. Lifecycle in a run: [`load`] reads and checks the file and
//! fills the placeholders (bad input names the file and the field); the external mode starts the
//! processes one by one, each only once the one before answers its health URL, probes each
//! process tree under its role (`decode.target.proc.rss_anon`), and stops every one at the end,
//! whatever the outcome.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

/// Processes a topology may list: far more than any P/D deployment (a proxy and a few nodes),
/// and a bound on what one run starts.
const MAX_PROCESSES: usize = 16;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    url: String,
    #[serde(default, rename = "process")]
    processes: Vec<RawProcess>,
    soak: Option<Length>,
}

/// `[soak]`: how long a soak over this deployment runs where the command line gives no length
/// (`--iterations`, `--duration`) or warm-up (`--warmup`), in place of the scenario's target
/// length. A deployment of real servers (vLLM's P/D pair: seconds an iteration on a small machine)
/// sets the length that fits it; the scenario is shared with faster ones.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Length {
    pub iterations: u64,
    pub warmup_iterations: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProcess {
    role: String,
    spawn: String,
    health: String,
    /// The name of the port this process listens on (`{port:NAME}`).
    port: Option<String>,
}

/// One process of a deployment, its placeholders filled.
#[derive(Debug, Clone, PartialEq)]
pub struct Process {
    pub role: String,
    pub spawn: String,
    /// `http://...` (a 2xx answers) or `tcp://HOST:PORT` (a connection is accepted).
    pub health: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Topology {
    pub url: String,
    pub processes: Vec<Process>,
    /// The ports given to each name, for the run's output.
    pub ports: BTreeMap<String, u16>,
    /// The deployment's own soak length, if it sets one.
    pub soak: Option<Length>,
}

/// What fills a topology's placeholders besides its ports.
pub struct Fill<'a> {
    pub plateau: &'a str,
    pub scenario: &'a str,
    pub injections: &'a [String],
}

/// A deployment's file lists a few processes: far under this.
const MAX_TOPOLOGY_BYTES: u64 = 1 << 20;

/// Reads and checks `path`, filling its placeholders (free ports taken now).
pub fn load(path: &Path, fill: &Fill) -> Result<Topology, String> {
    let where_ = path.display();
    let text =
        plateau_reports::fsutil::read_input_text(path, MAX_TOPOLOGY_BYTES).map_err(|e| format!("--topology {e}"))?;
    let raw: Raw = toml::from_str(&text).map_err(|e| format!("--topology {where_}: {e}"))?;
    parse(raw, &where_.to_string(), fill, &mut free_port)
}

fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("a free port: {e}"))?;
    l.local_addr().map(|a| a.port()).map_err(|e| format!("a free port: {e}"))
}

fn parse(raw: Raw, file: &str, fill: &Fill, port: &mut dyn FnMut() -> Result<u16, String>) -> Result<Topology, String> {
    if raw.processes.is_empty() {
        return Err(format!("{file}: no [[process]]: a topology lists the processes it starts"));
    }
    if raw.processes.len() > MAX_PROCESSES {
        return Err(format!("{file}: {} processes, more than {MAX_PROCESSES}", raw.processes.len()));
    }
    if let Some(l) = raw.soak {
        if l.iterations == 0 || l.iterations > plateau_scenario::MAX_ITERATIONS {
            return Err(format!(
                "{file}: soak.iterations: {} is not between 1 and {}",
                l.iterations,
                plateau_scenario::MAX_ITERATIONS
            ));
        }
        if l.warmup_iterations >= l.iterations {
            return Err(format!(
                "{file}: soak.warmup_iterations: {} is at or past soak.iterations ({}): nothing would be judged",
                l.warmup_iterations, l.iterations
            ));
        }
    }
    let mut declared: BTreeMap<String, String> = BTreeMap::new();
    for (i, p) in raw.processes.iter().enumerate() {
        let at = format!("{file}: process {} ", i + 1);
        if p.role.is_empty()
            || !p.role.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
        {
            return Err(format!(
                "{at}role {:?}: a role is a name of a-z, 0-9, _ and - (it prefixes the role's metrics)",
                p.role
            ));
        }
        if let Some(other) = raw.processes[..i].iter().find(|q| q.role == p.role) {
            return Err(format!(
                "{at}role {:?}: already the role of process {}",
                p.role,
                1 + raw.processes.iter().position(|q| std::ptr::eq(q, other)).unwrap_or(0)
            ));
        }
        if let Some(name) = &p.port {
            if let Some(owner) = declared.insert(name.clone(), p.role.clone()) {
                return Err(format!(
                    "{at}({}) port = {name:?}: a duplicate port name, already the port of {owner}",
                    p.role
                ));
            }
        }
    }
    let mut ports: BTreeMap<String, u16> = BTreeMap::new();
    let mut expand = |field: &str, text: &str, role: &str| -> Result<String, String> {
        expand(text, fill, |name| {
            // What requests and health checks go to must be some process's; a spawn may also
            // take ports of its own (a KV side channel).
            if field != "spawn" && !declared.contains_key(name) {
                return Err(format!(
                    "{file}: {role}{field}: {{port:{name}}} names no process's port (a missing role? give that process port = {name:?})"
                ));
            }
            if let Some(p) = ports.get(name) {
                return Ok(*p);
            }
            let p = port()?;
            ports.insert(name.to_string(), p);
            Ok(p)
        })
        .map_err(|e| if e.starts_with(file) { e } else { format!("{file}: {role}{field}: {e}") })
    };
    let url = expand("url", &raw.url, "")?;
    if !url.starts_with("http://") {
        return Err(format!("{file}: url {url:?}: requests go to an http:// URL"));
    }
    let mut processes = Vec::new();
    for p in &raw.processes {
        let role = format!("process {:?}: ", p.role);
        let spawn = expand("spawn", &p.spawn, &role)?;
        let health = expand("health", &p.health, &role)?;
        if !(health.starts_with("http://") || health.starts_with("tcp://")) {
            return Err(format!(
                "{file}: {role}health {health:?}: an http:// URL (answers 2xx) or tcp://HOST:PORT (accepts)"
            ));
        }
        processes.push(Process { role: p.role.clone(), spawn, health });
    }
    Ok(Topology { url, processes, ports, soak: raw.soak })
}

/// `text` with its placeholders filled (`port` gives a name's port).
fn expand(text: &str, fill: &Fill, mut port: impl FnMut(&str) -> Result<u16, String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find(['{', '}']) {
        out.push_str(&rest[..open]);
        // `{{` and `}}` are literal braces (a JSON argument); a lone `}` is itself.
        if rest[open..].starts_with("{{") || rest[open..].starts_with("}}") || rest[open..].starts_with('}') {
            out.push_str(&rest[open..open + 1]);
            let doubled = rest[open + 1..].starts_with(&rest[open..open + 1]);
            rest = &rest[open + 1 + usize::from(doubled)..];
            continue;
        }
        let close = rest[open..].find('}').ok_or_else(|| format!("an unclosed {{ in {text:?}"))? + open;
        let key = &rest[open + 1..close];
        match key.split_once(':') {
            Some(("port", name)) if !name.is_empty() => out.push_str(&port(name)?.to_string()),
            _ => match key {
                "plateau" => out.push_str(&plateau_reports::shell_word(fill.plateau)),
                "scenario" => out.push_str(&plateau_reports::shell_word(fill.scenario)),
                "inject" => {
                    let flags: Vec<String> = fill.injections.iter().map(|i| format!("--inject {i}")).collect();
                    out.push_str(&flags.join(" "));
                }
                other => {
                    return Err(format!(
                        "{{{other}}} is not a placeholder; {{port:NAME}}, {{inject}}, {{scenario}} or {{plateau}}"
                    ))
                }
            },
        }
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PD: &str = r#"
url = "http://127.0.0.1:{port:proxy}/"
[[process]]
role = "prefill"
port = "prefill"
spawn = "{plateau} serve {scenario} --role prefill --port {port:prefill} {inject}"
health = "tcp://127.0.0.1:{port:prefill}"
[[process]]
role = "proxy"
port = "proxy"
spawn = "{plateau} serve {scenario} --role proxy --port {port:proxy} --prefill 127.0.0.1:{port:prefill}"
health = "http://127.0.0.1:{port:proxy}/health"
"#;

    fn load_str(text: &str) -> Result<Topology, String> {
        let raw: Raw = toml::from_str(text).map_err(|e| format!("t.toml: {e}"))?;
        let inj = vec!["pd-mmap-hook".to_string()];
        let fill = Fill { plateau: "/bin/plateau", scenario: "pd-transfer", injections: &inj };
        let mut next = 30000;
        parse(raw, "t.toml", &fill, &mut || {
            next += 1;
            Ok(next)
        })
    }

    #[test]
    fn placeholders_are_filled_and_a_port_is_the_same_wherever_its_name_appears() {
        let t = load_str(PD).unwrap();
        assert_eq!(t.url, "http://127.0.0.1:30001/");
        assert_eq!(
            t.processes[0].spawn,
            "/bin/plateau serve pd-transfer --role prefill --port 30002 --inject pd-mmap-hook"
        );
        assert_eq!(t.processes[0].health, "tcp://127.0.0.1:30002");
        assert_eq!(
            t.processes[1].spawn,
            "/bin/plateau serve pd-transfer --role proxy --port 30001 --prefill 127.0.0.1:30002"
        );
        assert_eq!(t.ports, BTreeMap::from([("prefill".into(), 30002), ("proxy".into(), 30001)]));
    }

    #[test]
    fn a_deployment_s_soak_length_is_checked() {
        let t = load_str(&format!("{PD}[soak]\niterations = 80\nwarmup_iterations = 40\n")).unwrap();
        assert_eq!(t.soak, Some(Length { iterations: 80, warmup_iterations: 40 }));
        assert_eq!(load_str(PD).unwrap().soak, None);
        let e = load_str(&format!("{PD}[soak]\niterations = 40\nwarmup_iterations = 40\n")).unwrap_err();
        assert!(e.contains("t.toml: soak.warmup_iterations: 40 is at or past soak.iterations (40)"), "{e}");
        let e = load_str(&format!("{PD}[soak]\niterations = 0\nwarmup_iterations = 0\n")).unwrap_err();
        assert!(e.contains("soak.iterations: 0 is not between 1 and"), "{e}");
        let e = load_str(&format!("{PD}[soak]\niterations = 80\n")).unwrap_err();
        assert!(e.contains("warmup_iterations"), "a length without its warm-up: {e}");
    }

    #[test]
    fn doubled_braces_are_braces() {
        let fill = Fill { plateau: "p", scenario: "s", injections: &[] };
        let got = expand(r#"--kv '{{"a":{port:x}}}' }"#, &fill, |_| Ok(7)).unwrap();
        assert_eq!(got, r#"--kv '{"a":7}' }"#);
    }

    #[test]
    fn the_shipped_topologies_load() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/topologies");
        let mut names = Vec::new();
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let fill = Fill { plateau: "plateau", scenario: "pd-transfer", injections: &[] };
            let t = load(&p, &fill).unwrap_or_else(|e| panic!("{e}"));
            assert!(t.processes.len() >= 3 && t.url.starts_with("http://127.0.0.1:"), "{t:?}");
            names.push(p.file_name().unwrap().to_string_lossy().into_owned());
        }
        names.sort();
        assert_eq!(names, ["plateau-pd.toml", "sglang-pd.example.toml", "vllm-nixl-pd.example.toml"]);
    }

    #[test]
    fn bad_topologies_name_the_file_and_the_field() {
        let cases = [
            (PD.replace("role = \"proxy\"\n", ""), "missing field `role`"),
            (PD.replace("role = \"proxy\"", "role = \"prefill\""), "already the role of process 1"),
            (
                PD.replace("port = \"proxy\"", "port = \"prefill\""),
                "a duplicate port name, already the port of prefill",
            ),
            (PD.replace("{port:proxy}/health", "{port:router}/health"), "{port:router} names no process's port"),
            (PD.replace("{inject}", "{injections}"), "{injections} is not a placeholder"),
            (PD.replace("tcp://", "udp://"), "health \"udp://"),
            (PD.replace("spawn =", "command ="), "unknown field `command`"),
            ("url = \"http://x\"\n".to_string(), "no [[process]]"),
        ];
        for (text, want) in cases {
            let e = load_str(&text).unwrap_err();
            assert!(e.starts_with("t.toml: ") && e.contains(want), "{e} (want {want})");
        }
    }
}
