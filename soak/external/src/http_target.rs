//! An OpenAI-compatible server as a target: a phase's requests go over HTTP (at most
//! `concurrency` at once; an abort is a client closing its stream, before the first token or after
//! some chunks; an invalid request expects a 4xx); the quiescent point is every request answered
//! and the server's in-flight gauges at zero (or the settle timeout, counted); a probe scrapes its
//! /metrics, reads its process tree and GPU memory per process, and records plateau's own memory,
//! observed only. A sleep phase calls the server's control endpoints in its dialect
//! (`control.rs`): sleep, weight update and wake as an RL trainer does; what the dialect lacks is
//! counted and said in the verdict.

use std::collections::BTreeMap;
use std::time::Instant;

use futures_util::stream::{self, StreamExt};
use plateau_reports::MetricSpec;

use super::client::{Action, Client, Outcome};
use super::mapping::{self, Mapping};
use super::REQUESTS;
use super::{client_err, death, fetch_metrics, gpu, is_page_level, short_streams, target, tree, ExternalOptions, POLL};
use plateau_driver::plan::{self, Send};
use plateau_driver::sink::Sink;
use plateau_driver::target::{Finish, Probe, Shape, Target, WindowEdge};
use plateau_driver::{AbortCounts, RunError};
use plateau_scenario::{Phase, Scenario, Stage};

/// The target: its runtime (current-thread, so only `Runtime::block_on` drives its IO and
/// timers) beside the state its futures borrow.
pub(super) struct HttpTarget<'a> {
    pub runtime: tokio::runtime::Runtime,
    pub http: Http<'a>,
}

pub(super) struct Http<'a> {
    pub client: Client,
    pub mapping: Mapping,
    /// Whether the target has a /metrics.
    pub scrapes: bool,
    pub tree: Option<tree::Tree>,
    pub target: Option<target::Target>,
    /// A deployment's processes (`--topology`), each probed under its role.
    pub deployment: super::deployment::Deployment,
    /// Their roles, in start order.
    pub roles: Vec<String>,
    pub oom: Option<death::OomWatch>,
    pub gpu: Option<gpu::GpuProbe>,
    pub declared: BTreeMap<String, MetricSpec>,
    pub requests_sent: u64,
    pub settle_timeouts: u64,
    /// The server's dialect and its control calls (sleep phases).
    pub control: super::control::Control,
    pub aborts: AbortCounts,
    pub ext: &'a ExternalOptions,
    pub own: plateau_probes::probes::ProcessProbes,
    /// The target's mappings at the last quiescent point: what the end snapshot shows if the
    /// target is gone by then.
    pub last_mappings: Vec<plateau_probes::mappings::Mapping>,
    /// A deployment's processes' mappings at the last quiescent point, by role.
    pub last_role_mappings: BTreeMap<String, Vec<plateau_probes::mappings::Mapping>>,
    /// The scenario's engine section stands for the server's in phase plans: its vocabulary (for
    /// the out-of-vocabulary request) and its pool (for pressure phases).
    pub shape: Shape,
    /// Where the run writes: `server.json` (what kind of program the server is) at the end.
    pub out_dir: std::path::PathBuf,
    /// A profiled replay's window as marked so far: (edge, iteration, wall clock in ms).
    pub window: Vec<(WindowEdge, u64, u64)>,
    /// plateau's hook in the spawned server's Python processes, if the run put it there.
    pub hook: Option<super::python::Hook>,
    /// The allocation sites of the server's Python processes, recorded from halfway through the
    /// warm-up.
    pub py_sites: Option<super::python::sites::PySites>,
    /// A profiled replay's child (a native server's heap dumped at its window's edges): it
    /// records no sites of its own.
    pub window_run: bool,
}

impl Http<'_> {
    async fn scrape(&self) -> Result<Option<mapping::Scraped>, RunError> {
        if !self.scrapes {
            return Ok(None);
        }
        let url = format!("{}/metrics", self.client.base());
        let text = fetch_metrics(&url).await?;
        let text = text.ok_or_else(|| RunError::Harness(format!("GET {url}: gone mid-run")))?;
        let samples = mapping::parse_text(&text, &format!("GET {url}")).map_err(RunError::Harness)?;
        let mut s = self.mapping.apply(&samples);
        if !self.roles.is_empty() {
            s.values = s.values.into_iter().map(|(k, v)| (by_role(&k, &self.roles), v)).collect();
        }
        Ok(Some(s))
    }

    fn check_alive(&mut self, iter: u64) -> Result<(), RunError> {
        for p in &mut self.deployment.procs {
            if !p.target.alive() {
                let how = p.target.exit_status().map(|s| format!(" ({s})")).unwrap_or_default();
                return Err(RunError::Harness(format!(
                    "the {} process {} exited at iteration {}{how}",
                    p.role,
                    p.target.pid,
                    iter + 1
                )));
            }
        }
        let Some(t) = &mut self.target else { return Ok(()) };
        if t.alive() {
            return Ok(());
        }
        let how = t.exit_status().map(|s| format!(" ({s})")).unwrap_or_default();
        Err(RunError::Harness(format!("the target process {} exited at iteration {}{how}", t.pid, iter + 1)))
    }

    /// Waits for every in-flight gauge to read zero, at most the settle timeout.
    async fn settle(&mut self) -> Result<(), RunError> {
        let t0 = Instant::now();
        loop {
            match self.scrape().await? {
                Some(s) if s.in_flight.is_some_and(|n| n > 0.0) => {}
                _ => return Ok(()),
            }
            if t0.elapsed() >= self.ext.settle_timeout {
                self.settle_timeouts += 1;
                return Ok(());
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn sample(&mut self, iter: u64) -> Result<Probe, RunError> {
        self.check_alive(iter)?;
        let mut p = Probe::default();
        // The scrape first: a server that settles its allocator when scraped idle (plateau serve)
        // has done so before its process is read.
        let t0 = Instant::now();
        // A server that says whether its allocator holds freed pages (plateau serve) has its
        // page-level levels recorded only where it does not: there they mean live memory.
        let mut unsettled = false;
        if let Some(s) = self.scrape().await? {
            unsettled = s.settled == Some(false);
            p.values.extend(s.values);
        }
        let t1 = Instant::now();
        p.cost_us.insert("scrape".into(), (t1 - t0).as_secs_f64() * 1e6);
        if let Some(tree) = &mut self.tree {
            let pids = tree.sample(&mut p.values, self.hook.as_ref());
            if let Some(g) = &self.gpu {
                g.sample(&pids, &mut p.values);
            }
            self.last_mappings = procfs::process::Process::new(tree.root())
                .map(|p| plateau_probes::mappings::of_process(&p))
                .unwrap_or_default();
        }
        for d in &mut self.deployment.procs {
            let pids = d.tree.sample(&mut p.values, self.hook.as_ref());
            if let Some(g) = &self.gpu {
                g.sample_as(&format!("{}.{}", d.role, mapping::PREFIX), &pids, &mut p.values);
            }
            let maps = procfs::process::Process::new(d.tree.root())
                .map(|p| plateau_probes::mappings::of_other_process(&p))
                .unwrap_or_default();
            self.last_role_mappings.insert(d.role.clone(), maps);
        }
        p.cost_us.insert("target_proc".into(), t1.elapsed().as_secs_f64() * 1e6);
        if unsettled {
            p.values.retain(|k, _| !is_page_level(k));
        }
        let mut own = BTreeMap::new();
        self.own.sample("plateau.", plateau_probes::probes::Settle::Flush, &mut own, &mut BTreeMap::new());
        if let Some(proc) = self.own.process() {
            plateau_probes::probes::read_proc(proc, "plateau.", &mut own);
        }
        p.values.extend(own);
        p.values.insert(REQUESTS.into(), self.requests_sent as f64);
        p.values.retain(|k, _| self.declared.contains_key(k));
        Ok(p)
    }

    /// Sends a phase's requests and waits for all of them. The first failure stops the phase:
    /// requests not yet sent are never sent to a failing server, and those in flight are closed.
    async fn send_all(&mut self, sends: Vec<Send>) -> Result<(), RunError> {
        let sends: Vec<(plateau_engine::Request, Action)> =
            sends.into_iter().map(|s| (s.request, client_action(s.action))).collect();
        self.requests_sent += sends.len() as u64;
        let client = &self.client;
        let mut results =
            stream::iter(sends.iter()).map(|(r, a)| client.send(r, *a)).buffer_unordered(self.ext.concurrency.max(1));
        while let Some(r) = results.next().await {
            match r.map_err(client_err)? {
                Outcome::Completed { n, missing, .. } => {
                    self.aborts.completed += 1;
                    short_streams::count(&mut self.aborts, n, missing);
                    if let Some(why) = short_streams::ignores_n(&self.aborts, false) {
                        return Err(RunError::Harness(format!("{}: {why}", self.client.base())));
                    }
                }
                Outcome::Aborted => self.aborts.aborted += 1,
                Outcome::EndedFirst => self.aborts.missed += 1,
                Outcome::Refused => self.aborts.invalid_refused += 1,
                Outcome::Accepted => self.aborts.invalid_accepted += 1,
            }
        }
        Ok(())
    }
}

/// A planned action as a client performs it: an abort during decoding closes the stream after
/// some chunks, one before closes the connection before the first token.
pub(crate) fn client_action(a: plan::Action) -> Action {
    match a {
        plan::Action::Complete => Action::Complete,
        plan::Action::Abort { stage: Stage::Decode | Stage::Preempted | Stage::Any, delay } => {
            Action::CloseAfterChunks(1 + delay as u32)
        }
        plan::Action::Abort { delay, .. } => Action::CloseBeforeFirstToken { after_ms: 1 + delay },
        plan::Action::Refuse { what } => Action::ExpectRefusal { as_tokens: what.contains("vocabulary") },
    }
}

/// The quiescent point where a server's sites begin to be recorded: halfway through the warm-up.
/// memray sees what is allocated while it tracks, and the frees of only that: a cache that turns
/// over (its old entries freed as new ones come) would seem to grow by all of itself while its
/// entries from before the tracking leave. Half the warm-up before the judged window, a cache or
/// pool that turns over within that time is seen whole by the window, and the tracker's own start
/// in the process (its module, its tables filling as it meets new stacks) is warm-up too. The
/// tracking costs the server time, so it starts no earlier (a server's warm-up is its longest
/// stretch: 300 of n-sampling's 600 iterations).
pub fn sites_from(warmup: u64) -> u64 {
    warmup / 2
}

impl Http<'_> {
    /// A run that failed names how its target ended (`root_exit`), what of the server is gone
    /// (an engine core killed while its API server lives on), the exception the process that
    /// died raised, and the end of what the server wrote.
    fn what_ended(&self, root_exit: Option<String>) -> Option<String> {
        let root_died = root_exit.is_some();
        let mut parts: Vec<String> = root_exit.into_iter().collect();
        let gone = self.tree.as_ref().map(tree::Tree::vanished_pids).unwrap_or_default();
        if !gone.is_empty() {
            let names: Vec<String> = gone.iter().map(|(pid, what)| format!("{what} (pid {pid})")).collect();
            parts.push(format!("processes of the server that are gone: {}", names.join(", ")));
        }
        let log = self.out_dir.join("target.log");
        let mut dead: Vec<i32> = gone.iter().map(|g| g.0).collect();
        dead.extend(self.target.as_ref().filter(|_| root_died).map(|t| t.pid));
        // What the process that died raised, before the API server's own last lines.
        if let Some(t) = (!dead.is_empty()).then(|| super::traceback::from_log(&log, &dead)).flatten() {
            parts.push(format!("the first exception in the server's output ({}):\n{}", log.display(), t.quoted()));
        }
        if self.target.is_some() && log.exists() {
            let lines = target::last_lines(&log, target::LOG_LINES);
            parts.push(match lines.is_empty() {
                true => format!("the server wrote nothing ({})", log.display()),
                false => format!("the server's output ({}) ends:\n{lines}", log.display()),
            });
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

impl Target for HttpTarget<'_> {
    fn specs(&mut self) -> BTreeMap<String, MetricSpec> {
        self.http.declared.clone()
    }

    fn backend(&self) -> String {
        format!("external {} ({})", self.http.client.base(), self.http.client.model())
    }

    fn shape(&self) -> Shape {
        self.http.shape
    }

    fn run_phase(
        &mut self,
        scenario: &Scenario,
        _iter: u64,
        index: usize,
        sends: Vec<Send>,
        _sink: &mut Sink,
    ) -> Result<(), RunError> {
        if let Phase::Sleep(s) = &scenario.phases[index] {
            return self.runtime.block_on(self.http.control.sleep_phase(s));
        }
        self.runtime.block_on(self.http.send_all(sends))
    }

    fn quiesce(&mut self, _iter: u64, _sink: &mut Sink) -> Result<(), RunError> {
        self.runtime.block_on(self.http.settle())
    }

    fn probe(&mut self, iter: u64, _quiescent: bool) -> Result<Probe, RunError> {
        self.runtime.block_on(self.http.sample(iter))
    }

    /// The wall clock of the quiescent point, and, when the server runs with plateau's dump
    /// trigger preloaded, a heap dump asked of it there.
    fn mark_window(&mut self, edge: WindowEdge, iter: u64, out_dir: &std::path::Path) -> Result<(), RunError> {
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|e| RunError::Harness(format!("the clock: {e}")))?
            .as_millis() as u64;
        self.http.window.push((edge, iter, ms));
        // The process started with the dump trigger's request file: the one server, or the
        // deployment's role under the profiler.
        let request_of = |role: Option<&str>| {
            super::deployment::env_for(&self.http.ext.spawn_env, role)
                .into_iter()
                .find_map(|(k, v)| (k == super::profile::DUMP_REQUEST_ENV).then_some(v))
        };
        let profiled =
            self.http.target.as_ref().map(|t| t.pid).and_then(|pid| request_of(None).map(|r| (pid, r))).or_else(|| {
                self.http.deployment.procs.iter().find_map(|p| request_of(Some(&p.role)).map(|r| (p.target.pid, r)))
            });
        if let Some((pid, request)) = profiled {
            super::profile::native::request_dump(std::path::Path::new(&request), pid, &out_dir.join(edge.dump_file()))
                .map_err(RunError::Harness)?;
        }
        let marks: Vec<serde_json::Value> = self
            .http
            .window
            .iter()
            .map(|(e, i, t)| serde_json::json!({"edge": e.name(), "iter": i, "unix_ms": t}))
            .collect();
        plateau_driver::write_json(&out_dir.join("profile-window.json"), &marks)
    }

    fn mappings(&mut self) -> Vec<plateau_probes::mappings::Mapping> {
        self.http.last_mappings.clone()
    }

    /// The server's Python processes' sites (memray through the hook), from the quiescent point
    /// halfway through the warm-up ([`sites_from`]).
    fn sites(&mut self, iter: u64, warmup: u64, out_dir: &std::path::Path) -> Option<plateau_sites::Recorded> {
        let http = &mut self.http;
        if http.ext.sites == plateau_sites::Depth::Off || http.window_run {
            return None;
        }
        let hook = http.hook.as_ref()?;
        let mut r = plateau_sites::Recorded::default();
        if http.py_sites.is_none() {
            if iter < sites_from(warmup) {
                return None;
            }
            let mut processes: Vec<(i32, String)> = http.tree.iter().flat_map(|t| t.layered()).collect();
            processes.extend(http.deployment.procs.iter().flat_map(|p| p.tree.layered()));
            if processes.is_empty() {
                r.notes.push("no Python process of the server answered plateau's hook: no site recorded".into());
            }
            http.py_sites =
                Some(super::python::sites::PySites::start(hook, &processes, http.ext.sites, out_dir, &mut r));
        }
        http.py_sites.as_mut()?.snapshot(hook, &mut r);
        Some(r)
    }

    fn site_names(&mut self) -> Vec<plateau_sites::SiteName> {
        match (&mut self.http.py_sites, &self.http.hook) {
            (Some(s), Some(hook)) => {
                s.stop(hook);
                s.names()
            }
            _ => Vec::new(),
        }
    }

    fn role_mappings(&mut self) -> BTreeMap<String, Vec<plateau_probes::mappings::Mapping>> {
        self.http.last_role_mappings.clone()
    }

    fn status(&self) -> String {
        format!("target {}", self.http.client.base())
    }

    fn counts(&self) -> AbortCounts {
        self.http.aborts
    }

    fn finish(&mut self, scenario: &Scenario, failed: Option<&RunError>) -> Finish {
        // A target that ended before the run did: how, before anything else touches it. A
        // process killed by a signal closes its sockets before it is reaped, so a run that failed
        // on a reset connection may look at it a moment too early: it is given that moment.
        let root_exit = match (failed, self.http.target.as_mut(), &self.http.oom) {
            (Some(_), Some(t), Some(w)) => {
                target::ended_within(t, target::DEATH_GRACE).then(|| w.describe(t.exit_status()))
            }
            _ => None,
        };
        let target_exit = failed.and_then(|_| self.http.what_ended(root_exit));
        // What kind of program the server is, read while it still runs: which profiler can see
        // its heap, for a replay that names the allocating line.
        let running = self.http.target.as_mut().and_then(|t| t.alive().then_some(t.pid));
        if let Some(pid) = running {
            match super::profile::classify(pid) {
                Ok(kind) => {
                    if let Err(e) = plateau_driver::write_json(&self.http.out_dir.join("server.json"), &kind) {
                        plateau_shell::errln!("plateau: server.json: {e}");
                    }
                }
                Err(e) => plateau_shell::errln!("plateau: what kind of program the server is could not be read: {e}"),
            }
        }
        // A deployment's: each role's process, in servers.json by role.
        if !self.http.deployment.procs.is_empty() {
            let mut kinds = BTreeMap::new();
            for p in &self.http.deployment.procs {
                match super::profile::classify(p.target.pid) {
                    Ok(kind) => {
                        kinds.insert(p.role.clone(), kind);
                    }
                    Err(e) => {
                        plateau_shell::errln!(
                            "plateau: what kind of program the {} process is could not be read: {e}",
                            p.role
                        )
                    }
                }
            }
            if let Err(e) = plateau_driver::write_json(&self.http.out_dir.join(super::profile::SERVERS_FILE), &kinds) {
                plateau_shell::errln!("plateau: {}: {e}", super::profile::SERVERS_FILE);
            }
        }
        if let Some(t) = &mut self.http.target {
            t.stop();
        }
        if !self.http.deployment.procs.is_empty() {
            let pids: Vec<String> =
                self.http.deployment.procs.iter().map(|p| format!("{} (pid {})", p.role, p.target.pid)).collect();
            plateau_shell::errln!("plateau: deployment processes, each judged under its role: {}", pids.join(", "));
        }
        self.http.deployment.stop();
        if self.http.settle_timeouts > 0 {
            plateau_shell::errln!(
                "plateau: {} quiescent points were sampled with requests still in flight at the target (settle timeout {} ms)",
                self.http.settle_timeouts,
                self.http.ext.settle_timeout.as_millis()
            );
        }
        let control = self.http.control.record();
        if scenario.phases.iter().any(|p| matches!(p, Phase::Sleep(_))) {
            plateau_shell::errln!(
                "plateau: control calls over HTTP ({} dialect): {}",
                control.dialect,
                self.http.control.summary()
            );
            for l in &control.lacking {
                plateau_shell::errln!("plateau: {l}");
            }
        }
        if let Some(t) = &self.http.tree {
            let roles = t.roles();
            if !roles.is_empty() {
                plateau_shell::errln!("plateau: target processes: {}", roles.join(", "));
            }
        }
        Finish {
            target_exit,
            settle_timeouts: self.http.settle_timeouts,
            control: Some(control),
            roles: self.http.roles.clone(),
            ..Finish::default()
        }
    }
}

/// A scraped metric about one role of a deployment (a proxy's `target.decode.engine.kv_pool_bytes`)
/// under that role's prefix (`decode.target.engine.kv_pool_bytes`), so that every metric of a role
/// starts with its name; others as they are.
pub(super) fn by_role(name: &str, roles: &[String]) -> String {
    let Some(rest) = name.strip_prefix(mapping::PREFIX) else { return name.to_string() };
    for r in roles {
        if let Some(tail) = rest.strip_prefix(r.as_str()).and_then(|t| t.strip_prefix('.')) {
            return format!("{r}.{}{tail}", mapping::PREFIX);
        }
    }
    name.to_string()
}
