//! Where a leak comes from, end to end through the `plateau` command: the heap's allocation line by
//! its site's own series (verdict.json's sites, growth.txt, growth.pb.gz, `plateau explain`), the
//! insertion line of a registry's residue, a replay that records the sites and cannot run, and a
//! server's leaking function named from the run itself.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common;
use common::plateau;

fn tmp(name: &str) -> PathBuf {
    common::tmp("where", name)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn verdict(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("verdict.json")).expect("verdict.json")).expect("json")
}

fn metric<'a>(v: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    v["metrics"].as_array().unwrap().iter().find(|m| m["name"] == name).unwrap_or_else(|| panic!("no {name}"))
}

/// The line of `engine/src/output.rs` where the `untracked-heap` injection keeps what it keeps,
/// read from the source so that the test follows the code.
fn injection_line() -> u32 {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/src/output.rs");
    let text = std::fs::read_to_string(path).unwrap();
    let at = text.lines().position(|l| l.contains("self.history.push(")).expect("the injection's push");
    at as u32 + 1
}

/// A failing `untracked-heap` run at 60 iterations (detection at 40; its sites recorded by a
/// replay of all 60).
fn untracked_heap_run(name: &str) -> PathBuf {
    let d = tmp(name);
    let args = ["run", "n-sampling", "--iterations", "60", "--inject", "untracked-heap", "--quiet", "--out"];
    let o = plateau(&[&args[..], &[d.to_str().unwrap()]].concat());
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    d
}

#[test]
fn the_heap_leak_is_named_at_its_line_in_the_verdict_growth_files_and_explain() {
    let d = untracked_heap_run("heap");
    let line = injection_line();
    let here = format!("engine/src/output.rs:{line}");
    let v = verdict(&d);
    let heap = metric(&v, "jemalloc.allocated");
    assert_eq!(heap["status"], "fail");
    let top = &heap["sites"][0];
    assert_eq!(
        (top["file"].as_str(), top["line"].as_u64(), top["kind"].as_str()),
        (Some("engine/src/output.rs"), Some(line as u64), Some("leak")),
        "{top}"
    );
    assert!(top["site"].as_str().unwrap().starts_with(&here), "{top}");
    assert!(top["function"].as_str().unwrap().ends_with("finalize"), "{top}");
    // The run keeps a request's 5..10 output tokens (u32) of each of its 2 sequences, 20 requests
    // an iteration, plus the history's own doubling: 40-400 B a request.
    let per_request = top["per_request"].as_f64().unwrap();
    assert!((40.0..400.0).contains(&per_request), "{top}");
    assert!(top["share"].as_f64().unwrap() >= 0.8, "{top}");
    assert!(heap["explained_share"].as_f64().unwrap() >= 0.8, "{heap}");
    assert!(v["summary"].as_str().unwrap().contains(&here), "{}", v["summary"]);

    let txt = std::fs::read_to_string(d.join("growth.txt")).unwrap();
    let first_block = txt.split("\n\n").nth(1).unwrap();
    assert!(first_block.contains(&here), "{txt}");

    // growth.pb.gz decodes as profile.proto, with the site's function, file and line.
    let p = plateau_soak::heapprof::pprof::read(&d.join("growth.pb.gz")).unwrap();
    let s = |i: i64| p.string_table[i as usize].as_str();
    assert_eq!(p.sample_type.iter().map(|t| s(t.r#type)).collect::<Vec<_>>(), ["inuse_objects", "inuse_space"]);
    let f = p.function.iter().find(|f| s(f.filename) == "engine/src/output.rs" && s(f.name).ends_with("finalize"));
    let f = f.expect("finalize in the profile's functions");
    let at_line = p.location.iter().any(|l| l.line.iter().any(|x| x.function_id == f.id && x.line == line as i64));
    assert!(at_line, "no location at {here}");
    assert!(p.sample.iter().map(|x| x.value[1]).sum::<i64>() > 0, "the profile holds no growth");
    let svg = std::fs::read_to_string(d.join("growth.svg")).unwrap();
    assert!(svg.starts_with("<?xml") && svg.contains("finalize"), "growth.svg is not a flame graph of the site");

    // explain tells the story and exits with the verdict's code, as every subcommand does.
    let o = plateau(&["explain", d.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let story = String::from_utf8_lossy(&o.stdout);
    let leak = format!("leak at {here}");
    for want in
        ["jemalloc.allocated (gauge), growing since iteration", &leak, "replay: plateau run n-sampling --seed 0"]
    {
        assert!(story.contains(want), "explain lacks {want:?}:\n{story}");
    }
}

#[test]
#[ignore = "needs Go's pprof (apt install golang-go); run with --ignored where it is installed"]
fn go_tool_pprof_opens_the_growth_profile() {
    let d = untracked_heap_run("go-pprof");
    let o = Command::new("go")
        .args(["tool", "pprof", "-top", "-sample_index=inuse_space"])
        .arg(d.join("growth.pb.gz"))
        .output()
        .expect("go on PATH");
    let top = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(top.contains("OutputProcessor::finalize"), "{top}");
}

#[test]
fn a_registry_residue_is_named_at_its_insertion_line_with_its_count_and_age() {
    let d = tmp("residue");
    let args = ["run", "n-sampling", "--iterations", "30", "--inject", "registry-retains-finished", "--quiet", "--out"];
    let o = plateau(&[&args[..], &[d.to_str().unwrap()]].concat());
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let v = verdict(&d);
    let m = metric(&v, "registry.requests");
    let site = &m["sites"][0];
    let (file, line) = (site["file"].as_str().unwrap(), site["line"].as_u64().unwrap());
    assert!(file.starts_with("engine/src/") && line > 0, "{site}");
    // The line inserts into the registry: the engine's own source says so.
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(file)).unwrap();
    let src = text.lines().nth(line as usize - 1).unwrap();
    assert!(src.contains("requests") || src.contains("insert") || src.contains("add"), "{file}:{line}: {src}");
    // Every finished request stays: 20 an iteration, since the first.
    assert_eq!(site["count"], 600, "{site}");
    assert_eq!(site["oldest_iter"], 1, "{site}");
    assert!(site["function"].is_string(), "{site}");
    assert!(
        m["reason"].as_str().unwrap().contains(&format!("600 entries inserted at {file}:{line}")),
        "{}",
        m["reason"]
    );
    // No heap replay for a registry leak that the heap does not show as failing.
    assert!(!d.join("growth.json").exists() || metric(&v, "jemalloc.allocated")["status"] == "fail");
}

#[test]
fn a_replay_that_cannot_run_leaves_the_leak_a_failure_that_says_why_no_line_is_named() {
    let d = tmp("replay-fails");
    // The replay that records the sites writes into RUN_DIR/replay; a file there (in a directory
    // of an earlier run) makes its directory impossible.
    std::fs::write(d.join(".plateau-run"), b"").unwrap();
    std::fs::write(d.join("replay"), b"in the way").unwrap();
    let args = ["run", "n-sampling", "--iterations", "60", "--inject", "untracked-heap", "--quiet", "--out"];
    let o = plateau(&[&args[..], &[d.to_str().unwrap()]].concat());
    // The sites are evidence for the verdict, not the verdict: the leak is the finding (exit 1).
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("no allocation site recorded"), "{}", stderr(&o));
    let v = verdict(&d);
    assert_eq!(v["verdict"], "fail");
    assert_eq!(metric(&v, "jemalloc.allocated")["status"], "fail");
    let said = v["attribution"]
        .as_array()
        .unwrap()
        .iter()
        .any(|a| a.as_str().is_some_and(|a| a.contains("plateau's own heap: no site recorded: the replay")));
    assert!(said, "{v}");
}

#[test]
fn profile_on_a_clean_run_lists_the_growth_and_blames_nothing() {
    let d = tmp("profile-clean");
    let args = ["run", "n-sampling", "--iterations", "100", "--profile", "--quiet", "--out"];
    let o = plateau(&[&args[..], &[d.to_str().unwrap()]].concat());
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(d.join("sites.jsonl").is_file(), "--profile records the sites though nothing failed");
    assert!(d.join("growth.txt").is_file() && d.join("growth.pb.gz").is_file());
    let v = verdict(&d);
    assert_eq!(metric(&v, "jemalloc.allocated")["status"], "pass");
    assert!(metric(&v, "jemalloc.allocated").get("sites").is_none(), "{v}");
    assert!(!v["summary"].as_str().unwrap().contains("top site"), "{v}");
    let attribution = v["attribution"].to_string();
    assert!(attribution.contains("sites: jemalloc.allocated passed"), "{attribution}");
    assert!(attribution.contains("none blamed"), "{attribution}");
}

#[test]
fn explain_needs_a_run_directory() {
    let d = tmp("explain-empty");
    let o = plateau(&["explain", d.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("no samples.jsonl"), "{}", stderr(&o));
}

/// A small OpenAI-compatible server in Python's standard library that keeps 4 KiB of every
/// request in `remember_prompt`: a leak whose function a verdict names through memray.
pub(crate) const PYTHON_SERVER: &str = concat!(
    include_str!("common/stub_server.py"),
    r#"
SEEN = []

def remember_prompt(prompt):
    SEEN.append(bytearray(4096) + prompt.encode())

class H(Stub):
    def do_GET(self):
        if self.path in ("/v1/models", "/health"):
            self.reply(200, b'{"object":"list","data":[{"id":"tiny"}]}')
        else:
            self.reply(404, b'{}')
    def do_POST(self):
        req = json.loads(self.body())
        n, max_tokens = req.get("n", 1), req.get("max_tokens", 4)
        if not isinstance(n, int) or n < 1 or not isinstance(max_tokens, int) or max_tokens < 1:
            return self.reply(400, b'{"error":{"message":"invalid"}}')
        remember_prompt(str(req.get("prompt") or req.get("messages")))
        self.stream(n, max_tokens)

serve(H)
"#
);

/// The same server in C on the C library's malloc, one connection at a time: `keep_request`
/// keeps 4 KiB of every request.
const C_SERVER: &str = r#"
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char **kept; static size_t n_kept, cap_kept;

__attribute__((noinline)) void keep_request(const char *body, size_t len) {
    char *copy = malloc(4096 + len);
    memcpy(copy, body, len);
    if (n_kept == cap_kept) { cap_kept = cap_kept ? 2 * cap_kept : 64; kept = realloc(kept, cap_kept * sizeof *kept); }
    kept[n_kept++] = copy;
}

static int num_after(const char *s, const char *key, int dflt) {
    const char *p = strstr(s, key);
    return p ? atoi(p + strlen(key)) : dflt;
}

static void send_all(int fd, const char *p, size_t n) {
    while (n > 0) { ssize_t w = write(fd, p, n); if (w <= 0) return; p += w; n -= (size_t)w; }
}

int main(int argc, char **argv) {
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET; a.sin_port = htons(atoi(argv[1])); a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 128)) { perror("bind"); return 1; }
    for (;;) {
        int c = accept(s, NULL, NULL);
        if (c < 0) continue;
        char *req = malloc(1 << 16); size_t got = 0; long want = -1;
        while (got < (1 << 16) - 1) {
            ssize_t r = read(c, req + got, (1 << 16) - 1 - got);
            if (r <= 0) break;
            got += (size_t)r; req[got] = 0;
            char *end = strstr(req, "\r\n\r\n");
            if (end) {
                long body = num_after(req, "Content-Length: ", 0);
                if (got >= (size_t)(end + 4 - req) + body) { want = body; break; }
            }
        }
        char head[256];
        if (want < 0) { close(c); free(req); continue; }
        if (strncmp(req, "GET ", 4) == 0 && strncmp(req, "GET /v1/models", 14) != 0 && strncmp(req, "GET /health", 11) != 0) {
            const char *nf = "HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}";
            send_all(c, nf, strlen(nf));
        } else if (strncmp(req, "GET ", 4) == 0) {
            const char *ok = "{\"object\":\"list\",\"data\":[{\"id\":\"tiny\"}]}";
            int n = snprintf(head, sizeof head, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n", strlen(ok));
            send_all(c, head, (size_t)n); send_all(c, ok, strlen(ok));
        } else {
            const char *body = strstr(req, "\r\n\r\n") + 4;
            int n_choices = num_after(body, "\"n\":", 1), max_tokens = num_after(body, "\"max_tokens\":", 4);
            if (n_choices < 1 || max_tokens < 1) {
                const char *bad = "{\"error\":{\"message\":\"invalid\"}}";
                int n = snprintf(head, sizeof head, "HTTP/1.1 400 Bad Request\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n", strlen(bad));
                send_all(c, head, (size_t)n); send_all(c, bad, strlen(bad));
            } else {
                keep_request(body, (size_t)want);
                size_t cap = (size_t)(n_choices * max_tokens + 1) * 96, len = 0;
                char *ev = malloc(cap);
                for (int t = 0; t < max_tokens; t++)
                    for (int k = 0; k < n_choices; k++)
                        len += (size_t)snprintf(ev + len, cap - len, "data: {\"choices\":[{\"index\":%d,\"text\":\" a\",\"finish_reason\":null}]}\n\n", k);
                len += (size_t)snprintf(ev + len, cap - len, "data: [DONE]\n\n");
                int n = snprintf(head, sizeof head, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n", len);
                send_all(c, head, (size_t)n); send_all(c, ev, len);
                free(ev);
            }
        }
        free(req);
        close(c);
    }
}
"#;

/// Soaks n-sampling for 60 iterations against a server plateau starts with `spawn` (a command
/// with `{port}` in it); the run's output and directory.
fn soak_server(name: &str, spawn: &str) -> (Output, PathBuf) {
    let d = tmp(name);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}");
    let spawn = spawn.replace("{port}", &port.to_string());
    let o = plateau(&[
        "run",
        "n-sampling",
        "--iterations",
        "60",
        "--target",
        &url,
        "--spawn",
        &spawn,
        "--concurrency",
        "4",
        "--quiet",
        "--out",
        d.to_str().unwrap(),
    ]);
    (o, d)
}

/// The verdict of a server's leak names the leaking function on the failing memory gauge, and
/// growth.txt has it first.
fn assert_names(o: &Output, d: &Path, function: &str) {
    assert_eq!(o.status.code(), Some(1), "{}", stderr(o));
    let v = verdict(d);
    let named: Vec<&serde_json::Value> = v["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["name"].as_str().is_some_and(|n| n.starts_with("target.proc.")))
        .flat_map(|m| m["sites"].as_array().into_iter().flatten())
        .collect();
    assert!(named.iter().any(|s| s["function"] == function), "no site names {function}: {named:?}\n{}", stderr(o));
    let growth = std::fs::read_to_string(d.join("growth.txt")).unwrap();
    let first = growth.lines().find(|l| l.contains("/iteration, ") && l.contains("objects/iteration")).unwrap_or("");
    assert!(first.contains(function), "growth.txt's top stack is not {function}:\n{growth}");
    assert!(d.join("growth.pb.gz").exists() && d.join("growth.svg").exists());
}

/// A deployment of two Python servers, requests going to the decode one: the decode role's
/// process memory fails, and the sites the run itself recorded in that process (memray through
/// plateau's hook) name its leaking function; no second run of the deployment is made.
#[test]
#[cfg_attr(not(plateau_memray), ignore = "memray is not installed for python3 (python3 -m pip install memray)")]
fn a_deployments_role_that_grew_is_named_from_the_run_itself() {
    let dir = tmp("deployment-src");
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("server.py");
    std::fs::write(&script, PYTHON_SERVER).unwrap();
    let topology = dir.join("pd.toml");
    let process = |role: &str| {
        format!(
            "[[process]]\nrole = \"{role}\"\nport = \"{role}\"\nspawn = \"python3 {} {{port:{role}}}\"\nhealth = \"http://127.0.0.1:{{port:{role}}}/health\"\n",
            script.display()
        )
    };
    let text = format!("url = \"http://127.0.0.1:{{port:decode}}\"\n{}{}", process("prefill"), process("decode"));
    std::fs::write(&topology, text).unwrap();
    let d = tmp("deployment");
    let args = ["run", "n-sampling", "--iterations", "60", "--concurrency", "4", "--quiet", "--topology"];
    let o = plateau(&[&args[..], &[topology.to_str().unwrap(), "--out", d.to_str().unwrap()]].concat());
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let v = verdict(&d);
    let named: Vec<(&str, &serde_json::Value)> = v["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["sites"].as_array().into_iter().flatten().map(move |s| (m["name"].as_str().unwrap(), s)))
        .collect();
    assert!(
        named
            .iter()
            .any(|(m, s)| m.starts_with("decode.target.") && s["function"] == "remember_prompt" && s["kind"] == "leak"),
        "the decode role's gauges name no remember_prompt leak: {named:?}\n{}",
        stderr(&o)
    );
    assert!(named.iter().all(|(m, _)| !m.starts_with("prefill.")), "{named:?}");
    let kinds: serde_json::Value = serde_json::from_slice(&std::fs::read(d.join("servers.json")).unwrap()).unwrap();
    assert_eq!((kinds["prefill"]["kind"].as_str(), kinds["decode"]["kind"].as_str()), (Some("python"), Some("python")));
    // Both roles' processes were recorded, and nothing was replayed.
    let log = std::fs::read_to_string(d.join("sites.jsonl")).unwrap();
    assert!(
        log.contains("\"prefix\":\"decode.target.\"") && log.contains("\"prefix\":\"prefill.target.\""),
        "{log:.400}"
    );
    assert!(!d.join("replay").exists() && !d.join("growth.json").exists());
}

#[test]
#[cfg_attr(
    not(all(plateau_cc, plateau_libjemalloc)),
    ignore = "needs a C compiler (cc) and Debian's libjemalloc2 (apt-get install libjemalloc2)"
)]
fn a_c_servers_leaking_function_is_named_through_a_preloaded_jemalloc() {
    let dir = tmp("c-server-src");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("server.c"), C_SERVER).unwrap();
    let exe = dir.join("server");
    let cc = Command::new("cc").args(["-g", "-O1", "-o"]).arg(&exe).arg(dir.join("server.c")).output().unwrap();
    assert!(cc.status.success(), "{}", String::from_utf8_lossy(&cc.stderr));
    let (o, d) = soak_server("c-server", &format!("{} {{port}}", exe.display()));
    assert_names(&o, &d, "keep_request");
    let server: serde_json::Value = serde_json::from_slice(&std::fs::read(d.join("server.json")).unwrap()).unwrap();
    assert_eq!(server["kind"], "native");
}

#[test]
fn a_server_with_its_own_allocator_is_named_as_such() {
    // plateau serve brings its own jemalloc: no preloaded profiler sees its heap.
    let serve = format!("{} serve --port {{port}} --inject registry-retains-finished", env!("CARGO_BIN_EXE_plateau"));
    let (o, d) = soak_server("own-allocator", &serve);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let v = verdict(&d);
    let attribution = v["attribution"].to_string();
    assert!(attribution.contains("its own allocator"), "{attribution}");
}
