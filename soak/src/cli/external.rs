//! `plateau run`'s flags for a server plateau does not run in-process (`--target`, `--pid`,
//! `--spawn`, `--topology`...), what a profiled replay of such a run passes on, and what a shrink
//! or a fuzz repeats of it; which of them go together, checked before a run starts.

use std::path::PathBuf;

use plateau_engine::Injection;
use plateau_soak::driver::RunOptions;

use super::USAGE;

/// Soak a server plateau did not start in-process: see README, "Soak your own server".
#[derive(clap::Args)]
pub struct ExternalArgs {
    /// Send the scenario's requests to this OpenAI-compatible server (http://HOST:PORT) instead of
    /// plateau's own engine; its /metrics is scraped and its processes probed (--pid, --spawn).
    #[arg(long, value_name = "URL", help_heading = "External target")]
    pub(super) target: Option<String>,
    /// The server's process id: it and its descendants are probed (memory, mappings, fds,
    /// threads, GPU memory).
    #[arg(long, requires = "target", conflicts_with = "spawn", help_heading = "External target")]
    pub(super) pid: Option<i32>,
    /// Start the server with this shell command, wait until it answers, stop it at the end (and
    /// on Ctrl-C); its output goes to target.log in the run directory.
    #[arg(long, value_name = "CMD", requires = "target", help_heading = "External target")]
    pub(super) spawn: Option<String>,
    /// A TOML file mapping the server's Prometheus metrics to kinds (added to the built-in
    /// rules for vLLM, SGLang, llama.cpp and plateau serve).
    #[arg(long, value_name = "FILE", requires = "target", help_heading = "External target")]
    pub(super) metrics_map: Option<PathBuf>,
    /// Requests in flight at most.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=4096), help_heading = "External target")]
    pub(super) concurrency: u64,
    /// Seconds the server may take to answer `GET /v1/models` (a spawned one: to start and
    /// answer); past it the run stops with exit 3. Default: 600 with --spawn or --topology (a
    /// server loading its model; each process of a deployment), 60 for a server already running
    /// (--pid, or none), which should answer at once.
    #[arg(long, help_heading = "External target")]
    pub(super) ready_timeout_s: Option<u64>,
    /// Milliseconds to wait, after the last request, for the server's in-flight gauges to read zero.
    #[arg(long, default_value_t = 10_000, help_heading = "External target")]
    pub(super) settle_timeout_ms: u64,
    /// Seconds one request may take.
    #[arg(long, default_value_t = 300, help_heading = "External target")]
    pub(super) request_timeout_s: u64,
    /// Environment for the spawned server only, KEY=VALUE (repeatable): what a profiled replay
    /// preloads into it, or your own settings. With --topology, KEY=VALUE is for every process
    /// and ROLE:KEY=VALUE for that role's process alone.
    #[arg(long, value_name = "KEY=VALUE", value_parser = parse_env, help_heading = "External target")]
    pub(super) spawn_env: Vec<(String, String)>,
    /// The server's dialect for sleep phases: vllm, sglang, llamacpp or openai. Default: found
    /// from what it answers (GET /is_sleeping: vLLM in dev mode; GET /get_server_info: SGLang;
    /// GET /props: llama.cpp; else /v1/models' owned_by). A sleep phase then calls the dialect's
    /// sleep, weight update and wake endpoints; what it lacks is said in the verdict.
    #[arg(long, value_name = "NAME", value_parser = plateau_soak::external::dialect::Dialect::parse, help_heading = "External target")]
    pub(super) dialect: Option<plateau_soak::external::dialect::Dialect>,
    /// A deployment of separate processes to soak as one target (a P/D pair and its proxy): a
    /// TOML file listing each process's role, spawn command, port name and health URL, and the
    /// URL requests go to (see scenarios/topologies/). Each process is started in order and
    /// stopped at the end; its process tree is judged under its role
    /// (`decode.target.proc.rss_anon`), and the verdict names the role that grew. `--inject`
    /// fills the file's `{inject}`.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["target", "pid", "spawn"], help_heading = "External target")]
    pub(super) topology: Option<PathBuf>,
    /// Do not put plateau's hook into the spawned server's Python processes. By default the
    /// hook (a `sitecustomize` module first on their PYTHONPATH, which runs the environment's own
    /// after it) reports each Python process's objects, its allocators' holdings and malloc's
    /// (`target.ROLE.py.*`, `target.ROLE.malloc.*`) at every quiescent point, and records each
    /// process's allocation sites with memray (`--sites`). With the hook, the server starts with
    /// glibc's per-thread caches of freed chunks off (GLIBC_TUNABLES=glibc.malloc.tcache_count=0,
    /// added to the user's own unless it sets that itself), so malloc's in-use figure is what the
    /// program holds, not what its threads keep for reuse.
    #[arg(long, help_heading = "External target")]
    pub(super) no_python_hook: bool,
}

/// Seconds a spawned server may take to start and answer: vLLM and SGLang load a model first.
const SPAWN_READY_S: u64 = 600;

/// Seconds a running server (given by --pid, or by its URL alone) may take to answer its first
/// request: it is up already, and one that accepts connections and never answers (a hung
/// process, a port another program holds) is found within a minute.
const RUNNING_READY_S: u64 = 60;

impl ExternalArgs {
    /// `--ready-timeout-s`, or its default for a spawned or a running server.
    pub(super) fn ready_timeout_s(&self) -> u64 {
        let starts = self.spawn.is_some() || self.topology.is_some();
        self.ready_timeout_s.unwrap_or(if starts { SPAWN_READY_S } else { RUNNING_READY_S })
    }

    /// The limits a run against a server sets (requests in flight, its timeouts), as flags: what
    /// a replay, a shrink and a fuzz of the run pass on as given.
    fn limit_flags(&self) -> [(&'static str, String); 4] {
        [
            ("--concurrency", self.concurrency.to_string()),
            ("--ready-timeout-s", self.ready_timeout_s().to_string()),
            ("--settle-timeout-ms", self.settle_timeout_ms.to_string()),
            ("--request-timeout-s", self.request_timeout_s.to_string()),
        ]
    }

    /// What a profiled replay of this run needs: what it started (a server from its command, a
    /// deployment with `roles` and the run's `injections`) and the flags to pass on as given.
    pub(super) fn replay_of<'a>(
        &'a self,
        url: &'a str,
        roles: Vec<String>,
        injections: Vec<String>,
    ) -> super::replay::ServerRun<'a> {
        let mut args: Vec<String> = self.limit_flags().into_iter().flat_map(|(f, v)| [f.to_string(), v]).collect();
        if let Some(m) = &self.metrics_map {
            args.extend(["--metrics-map".to_string(), m.display().to_string()]);
        }
        if let Some(d) = self.dialect {
            args.extend(["--dialect".to_string(), d.name().to_string()]);
        }
        if self.no_python_hook {
            args.push("--no-python-hook".into());
        }
        use super::replay::Started;
        let started = match (&self.topology, &self.spawn) {
            (Some(topology), _) => Started::Deployment { topology, injections, roles },
            (None, Some(spawn)) => Started::Server { url, spawn },
            (None, None) => Started::Nothing,
        };
        super::replay::ServerRun { started, target_args: args }
    }

    /// A shrink's or a fuzz's origin: `flags`, then this target's settings (without the target
    /// and its command, which each candidate gets on its own port).
    pub fn origin(&self, scenario: &str, inject: &[Injection], mut flags: Vec<String>) -> plateau_soak::shrink::Origin {
        let mut flag = |name: &str, value: Option<String>| {
            if let Some(v) = value {
                flags.extend([name.to_string(), v]);
            }
        };
        flag("--topology", self.topology.as_ref().map(|t| t.display().to_string()));
        if self.target.is_some() || self.topology.is_some() {
            flag("--pid", self.pid.map(|p| p.to_string()));
            flag("--metrics-map", self.metrics_map.as_ref().map(|m| m.display().to_string()));
            for (name, value) in self.limit_flags() {
                flag(name, Some(value));
            }
            for (k, v) in &self.spawn_env {
                flag("--spawn-env", Some(format!("{k}={v}")));
            }
        }
        plateau_soak::shrink::Origin {
            scenario: scenario.to_string(),
            injections: inject.iter().map(|i| i.name().to_string()).collect(),
            flags,
            target: self.target.clone(),
            spawn: self.spawn.clone(),
        }
    }
}

/// KEY=VALUE, with a key a shell would take, or ROLE:KEY=VALUE (one process of a deployment).
fn parse_env(s: &str) -> Result<(String, String), String> {
    let (k, v) = s.split_once('=').ok_or_else(|| format!("`{s}`: write KEY=VALUE or ROLE:KEY=VALUE"))?;
    let (role, key) = match k.split_once(':') {
        Some((r, key)) => (Some(r), key),
        None => (None, k),
    };
    if role.is_some_and(|r| r.is_empty()) {
        return Err(format!("`{k}`: ROLE:KEY names a role before the colon"));
    }
    if key.is_empty()
        || !key.chars().all(|c| c == '_' || c.is_ascii_alphanumeric())
        || key.starts_with(|c: char| c.is_ascii_digit())
    {
        return Err(format!("`{key}` is not an environment variable's name"));
    }
    Ok((k.to_string(), v.to_string()))
}

impl ExternalArgs {
    /// Flags that only mean something with a server plateau starts or reads: said, and exit 2.
    pub(super) fn check(&self) -> Result<(), u8> {
        if !self.spawn_env.is_empty() && self.spawn.is_none() && self.topology.is_none() {
            plateau_shell::errln!("plateau: --spawn-env is the environment of a server plateau starts: give --spawn \"CMD\" or --topology FILE");
            return Err(USAGE);
        }
        if self.dialect.is_some() && self.target.is_none() && self.topology.is_none() {
            plateau_shell::errln!(
                "plateau: --dialect names an external server's dialect: give --target URL or --topology FILE"
            );
            return Err(USAGE);
        }
        Ok(())
    }

    /// The options of a run against the server at `url`; flags that apply to plateau's own engine
    /// only, or that a server cannot take, are said, and exit 2.
    pub(super) fn options(
        &self,
        url: &str,
        topology: Option<&plateau_soak::external::topology::Topology>,
        opts: &RunOptions,
        profile: bool,
    ) -> Result<plateau_soak::external::ExternalOptions, u8> {
        if opts.pd_processes || opts.backend.is_some() {
            plateau_shell::errln!("plateau: --target: --pd-processes and --backend apply to plateau's own engine only");
            return Err(USAGE);
        }
        if profile && self.spawn.is_none() && topology.is_none() {
            plateau_shell::errln!("plateau: --target --profile: the profiled replay starts a fresh server under a profiler; give the command with --spawn \"CMD\"");
            return Err(USAGE);
        }
        if opts.sample_interval_ms.is_some_and(|ms| ms > 0) {
            plateau_shell::errln!("plateau: --target: a server is sampled at quiescent points only (no timer samples); drop --sample-interval-ms");
            return Err(USAGE);
        }
        let ext = plateau_soak::external::ExternalOptions {
            url: url.to_string(),
            pid: self.pid,
            spawn: self.spawn.clone(),
            metrics_map: self.metrics_map.clone(),
            concurrency: self.concurrency as usize,
            ready_timeout: std::time::Duration::from_secs(self.ready_timeout_s()),
            settle_timeout: std::time::Duration::from_millis(self.settle_timeout_ms),
            request_timeout: std::time::Duration::from_secs(self.request_timeout_s),
            spawn_env: self.spawn_env.clone(),
            dialect: self.dialect,
            topology: topology.cloned(),
            python_hook: !self.no_python_hook,
            sites: opts.sites,
        };
        Ok(ext)
    }
}
