//! Shared by the workflow tests of `plateau` (soak) and `plateau-sim` (sim): the command lines
//! that .github/workflows/ and deploy/ run, read from the YAML itself, checked against the
//! binary's own `--help`, so a workflow never calls a subcommand or flag that does not exist.

use std::path::Path;
use std::process::Command;

use yaml_rust2::{Yaml, YamlLoader};

/// The repository root (tests run in their package's directory).
pub fn root() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("a package inside the workspace").to_path_buf()
}

/// Parses every YAML document of `path` (the test fails on one that does not parse).
pub fn load(path: &Path) -> Vec<Yaml> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    YamlLoader::load_from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Shell text a file runs: `run:` steps of a workflow, `command`/`args` lists of a manifest.
pub fn shell_texts(docs: &[Yaml]) -> Vec<String> {
    fn walk(y: &Yaml, out: &mut Vec<String>) {
        match y {
            Yaml::Hash(h) => {
                for (k, v) in h {
                    match (k.as_str(), v) {
                        (Some("run"), Yaml::String(s)) => out.push(s.clone()),
                        (Some("command" | "args"), Yaml::Array(a)) => {
                            out.push(a.iter().filter_map(Yaml::as_str).collect::<Vec<_>>().join(" "))
                        }
                        _ => walk(v, out),
                    }
                }
            }
            Yaml::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    docs.iter().for_each(|d| walk(d, &mut out));
    out
}

/// The argument words of every invocation of `bin` in `text` (a path ending in `/bin` counts).
pub fn invocations(text: &str, bin: &str) -> Vec<Vec<String>> {
    let joined = text.replace("\\\n", " ");
    // GitHub expressions and quotes become plain words.
    let mut plain = String::new();
    let mut rest = joined.as_str();
    while let Some(i) = rest.find("${{") {
        plain.push_str(&rest[..i]);
        plain.push('X');
        rest = rest[i..].find("}}").map_or("", |j| &rest[i + j + 2..]);
    }
    plain.push_str(rest);
    let plain = plain.replace(['"', '\''], " ");
    let mut out = Vec::new();
    for segment in plain.split(['\n', ';', '|', '&']) {
        // The command word: past environment assignments and wrappers (`sh -c 'exec plateau-sim'`);
        // a path naming the binary elsewhere (`chmod +x ./plateau`) is not a call.
        let words: Vec<&str> = segment
            .split_whitespace()
            .skip_while(|w| w.contains('=') || ["exec", "time", "sh", "bash", "-c"].contains(w))
            .collect();
        if words.first().is_some_and(|w| *w == bin || w.ends_with(&format!("/{bin}"))) {
            out.push(words[1..].iter().take_while(|w| !w.starts_with('>')).map(|w| w.to_string()).collect());
        }
    }
    out
}

fn help(exe: &str, path: &[String]) -> String {
    let o = Command::new(exe).args(path).arg("--help").output().expect("the binary runs");
    assert!(o.status.success(), "{exe} {} --help failed", path.join(" "));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .collect()
}

/// Checks one invocation against `exe --help`: its subcommand path exists and every `--flag` is
/// one that subcommand takes. Returns the subcommand path, for the caller's coverage checks.
pub fn check(exe: &str, bin: &str, args: &[String], file: &str) -> Vec<String> {
    let mut path: Vec<String> = Vec::new();
    let mut i = 0;
    loop {
        let subs = subcommands(&help(exe, &path));
        if subs.is_empty() {
            break;
        }
        let word = args.get(i).unwrap_or_else(|| panic!("{file}: `{bin}` without a subcommand"));
        assert!(
            subs.contains(word),
            "{file}: `{bin} {}`: no subcommand `{word}` (has: {})",
            path.join(" "),
            subs.join(", ")
        );
        path.push(word.clone());
        i += 1;
    }
    let h = help(exe, &path);
    for flag in args[i..].iter().filter(|a| a.starts_with("--")) {
        let name = flag.split('=').next().unwrap_or(flag);
        assert!(
            h.contains(&format!("{name} ")) || h.contains(&format!("{name}\n")) || h.contains(&format!("{name} <")),
            "{file}: `{bin} {}` has no flag {name}",
            path.join(" ")
        );
    }
    path
}
