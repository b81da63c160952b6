//! After a run against a native server whose process memory failed (or with --profile): the
//! profiled replay that names where it grew, a preloaded jemalloc dumping the server's live heap
//! at the replay's quiescent points, their net change per stack named; then the verdict is drawn
//! again with the sites. plateau's own engine and a Python server record their allocation sites
//! as the run goes (sites.jsonl): they are never replayed.

use plateau_reports::Status;
use plateau_soak::driver::{self, RunOptions};
use plateau_soak::external::profile::{ExternalReplay, Launch, ServerKind};
use plateau_soak::heapprof::replay::Explains;

use super::HARNESS;

/// Iterations of a profiled replay's window: enough for a per-iteration figure at the byte, while
/// sampling every allocation costs the replay several times a plain run.
const REPLAY_ITERATIONS: u64 = 40;

/// The replay's window, where the run grew: it ends where the growth became conclusive (at least
/// `REPLAY_ITERATIONS` past warm-up, at most the run's length) and spans the `REPLAY_ITERATIONS`
/// before, never into warm-up.
fn replay_window(warmup: u64, iterations: u64, first_iter: Option<u64>) -> (u64, u64) {
    let start = warmup.max(1);
    let end = iterations.min((start + REPLAY_ITERATIONS).max(first_iter.unwrap_or(0)));
    (start.max(end.saturating_sub(REPLAY_ITERATIONS)), end)
}

/// A gauge's rate over the quiescent points of [start, end] in the run's samples.
fn window_rate(dir: &std::path::Path, metric: &str, start: u64, end: u64) -> Option<f64> {
    let s = plateau_reports::Samples::read(&dir.join("samples.jsonl")).ok()?;
    plateau_soak::detector::window_rate(&s, metric, start, end)
}

/// The external target of a run, as a profiled replay needs it.
pub struct ServerRun<'a> {
    pub started: Started<'a>,
    /// The run's other target flags, passed on to the replay as given.
    pub target_args: Vec<String>,
}

/// What an external run started.
pub enum Started<'a> {
    /// Nothing: the server was given by --pid (or by its URL alone).
    Nothing,
    /// One server, from its command (`--spawn`).
    Server { url: &'a str, spawn: &'a str },
    /// A deployment (`--topology`): its file, the run's injections (its `{inject}`), its roles in
    /// start order.
    Deployment { topology: &'a std::path::Path, injections: Vec<String>, roles: Vec<String> },
}

/// The gauges of a process's memory a profiled replay explains, the most telling first: objects a
/// Python program keeps (plateau's hook), what malloc hands out (its larger objects and native
/// memory), then the kernel's view of its pages and of its address space.
const PROCESS_MEMORY: [&str; 5] =
    ["py.object_bytes", "malloc.in_use_bytes", "proc.rss_anon", "proc.rss", "proc.anon_bytes"];

/// The layers of a Python process's heap as plateau's hook reads them: together, what a memray
/// replay of the process sees (every allocation, Python's small objects and malloc's alike).
const HEAP_LAYERS: [&str; 2] = ["py.object_bytes", "malloc.in_use_bytes"];

/// What a replay explains: the gauge and the process it belongs to.
#[derive(Debug, Clone, PartialEq)]
struct Chosen {
    /// The deployment's role the process belongs to, if any.
    scope: Option<String>,
    /// The process within the server's tree (`engine_core`), or None for the whole tree (the sums).
    process: Option<String>,
    metric: String,
    slope: f64,
    /// Whether its growth kept its rate into the run's last half ([`STEADY_TAIL`]).
    steady: bool,
}

/// A growth whose last half runs at this share of its overall rate or more is steady: a leak keeps
/// its rate, while a cache that fills slows (the detector calls a last half under a quarter of the
/// overall rate levelling off). Measured on vLLM 0.32's n-sampling at 600 iterations: the engine
/// core's steady growth kept 0.93 of its rate into the last half, the worker's filling caches 0.58.
const STEADY_TAIL: f64 = 0.75;

/// Steady growth first (what a replay most likely reproduces and a leak most likely is), then the
/// fastest.
fn by_likeliest(a: &Chosen, b: &Chosen) -> std::cmp::Ordering {
    b.steady.cmp(&a.steady).then(b.slope.total_cmp(&a.slope))
}

/// The processes of a server's tree with gauges of their own: `engine_core` of
/// `target.engine_core.proc.rss_anon` (`scope`: under a deployment's role, `decode.target.`).
fn tree_processes(names: &[&str], scope: Option<&str>) -> Vec<String> {
    let prefix = match scope {
        Some(r) => format!("{r}.target."),
        None => "target.".to_string(),
    };
    let mut out: Vec<String> = names
        .iter()
        .filter_map(|n| n.strip_prefix(&prefix)?.strip_suffix(".proc.rss_anon"))
        .filter(|p| !p.contains('.'))
        .map(str::to_string)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The gauge a replay explains. Scopes are a deployment's roles in start order (else the one
/// server). The first family of [`PROCESS_MEMORY`] that fails anywhere decides; within it, a
/// process of the tree before the tree's sums, the fastest-growing process first, and the first
/// role (in start order) of a deployment before later ones. With `profile` and none failing: the
/// process whose anonymous pages grew fastest.
fn choose(gauges: &[(&str, Status, f64, f64)], scopes: &[Option<&str>], profile: bool) -> Option<Chosen> {
    let names: Vec<&str> = gauges.iter().map(|g| g.0).collect();
    let find = |name: &str| gauges.iter().find(|g| g.0 == name);
    let base = |scope: Option<&str>| scope.map_or_else(|| "target.".to_string(), |r| format!("{r}.target."));
    let candidates = |family: &str, failing: bool| -> Vec<Chosen> {
        let mut out = Vec::new();
        for &scope in scopes {
            let mut per_process: Vec<Chosen> = tree_processes(&names, scope)
                .into_iter()
                .filter_map(|p| {
                    let metric = format!("{}{p}.{family}", base(scope));
                    let g = find(&metric)?;
                    (!failing || g.1 == Status::Fail).then(|| Chosen {
                        scope: scope.map(str::to_string),
                        process: Some(p),
                        metric,
                        slope: g.2,
                        steady: g.3 >= STEADY_TAIL * g.2,
                    })
                })
                .collect();
            per_process.sort_by(by_likeliest);
            out.extend(per_process);
            let sum = format!("{}{family}", base(scope));
            if let Some(g) = find(&sum).filter(|g| !failing || g.1 == Status::Fail) {
                let steady = g.3 >= STEADY_TAIL * g.2;
                out.push(Chosen { scope: scope.map(str::to_string), process: None, metric: sum, slope: g.2, steady });
            }
        }
        out
    };
    // What the program holds first (the objects it keeps and malloc's heap: a replay sees both),
    // the steadiest growth before the fastest, then the kernel's view.
    let mut heap = [candidates(HEAP_LAYERS[0], true), candidates(HEAP_LAYERS[1], true)].concat();
    heap.sort_by(by_likeliest);
    if let Some(c) = heap.into_iter().next() {
        return Some(c);
    }
    for family in &PROCESS_MEMORY[HEAP_LAYERS.len()..] {
        if let Some(c) = candidates(family, true).into_iter().next() {
            return Some(c);
        }
    }
    if !profile {
        return None;
    }
    candidates("proc.rss_anon", false).into_iter().max_by(|a, b| a.slope.total_cmp(&b.slope))
}

/// After a run against a server whose process memory failed (or with --profile): a profiled
/// replay against a fresh server plateau starts (`--spawn`), which names the allocating lines;
/// for a deployment, the deployment started again with the role that grew under the profiler.
/// Of a server of several processes, the process that grew is the one a Python server's replay
/// records. Why nothing could be named (a server given by --pid, one with its own allocator, no
/// profiler installed) goes into the verdict instead. Some(exit code) when the verdict could not
/// be drawn again.
pub fn server_sites(r: &mut driver::RunResult, opts: &RunOptions, server: &ServerRun, profile: bool) -> Option<u8> {
    if opts.profile_window.is_some() || r.interrupted {
        return None;
    }
    // Each process's gauges, by scope: the one server's, or each role's.
    let scopes: Vec<Option<&str>> = match &server.started {
        Started::Deployment { roles, .. } => roles.iter().map(|r| Some(r.as_str())).collect(),
        _ => vec![None],
    };
    let gauges: Vec<(&str, Status, f64, f64)> = r
        .verdict
        .metrics
        .iter()
        .filter_map(|m| {
            let t = m.trend.as_ref()?;
            Some((m.name.as_str(), m.status, t.slope_per_iter, t.tail_slope_per_iter))
        })
        .collect();
    let chosen = choose(&gauges, &scopes, profile)?;
    let (metric, slope) = (chosen.metric.clone(), chosen.slope);
    let scope = chosen.scope.as_deref();
    // The process's own prefix: its other gauges are weighed against the replay's live heap too.
    let own = metric.rsplitn(3, '.').nth(2).map(|p| format!("{p}.")).unwrap_or_default();
    let has_gauge = |n: &str| gauges.iter().any(|g| g.0 == n);
    // A server's process memory is weighed against its live heap where it still grew: the run's
    // last iterations, after any cache filled.
    let (start, end) = replay_window(r.verdict.warmup_iterations, r.iterations, Some(r.iterations));
    let run_dir = r.out_dir.clone();
    let explains = Explains {
        run_dir: &run_dir,
        start_iter: start,
        end_iter: end,
        metric: &metric,
        run_bytes_per_iter: run_rate(&r.out_dir, &metric, &own, start, end, &has_gauge).unwrap_or(slope),
        requests_per_iter: r.verdict.requests_per_iter,
    };
    let launch = match &server.started {
        Started::Nothing => None,
        Started::Server { url, spawn } => Some(Launch::Server { url, spawn }),
        Started::Deployment { topology, injections, .. } => {
            Some(Launch::Role { topology, injections, role: scope.unwrap_or_default() })
        }
    };
    // A process of the tree that answered plateau's hook is a Python process whatever its root is.
    let answered_hook = has_gauge(&format!("{own}py.object_bytes")) || has_gauge(&format!("{own}malloc.in_use_bytes"));
    let kind = read_kind(&r.out_dir, scope).map(|k| match (k, answered_hook) {
        (ServerKind::Python { exe } | ServerKind::Native { exe } | ServerKind::OwnAllocator { exe, .. }, true) => {
            ServerKind::Python { exe }
        }
        (k, false) => k,
    });
    let whose = process_names(chosen.process.as_deref(), scope);
    let why: String = match (launch, kind) {
        _ if end <= start => "the run ended within its warm-up: no window to replay".into(),
        (_, Ok(ServerKind::Python { exe })) => unrecorded_python(&exe, opts, server),
        (None, _) => "the server was given by --pid: a profiled replay starts a fresh server under a profiler, so give its command with --spawn to name the allocating line".into(),
        (Some(_), Err(e)) => e,
        (Some(launch), Ok(kind)) => {
            let exe = match std::env::current_exe() {
                Ok(e) => e,
                Err(e) => {
                    plateau_shell::errln!("plateau: the profiled replay cannot find this binary: {e}");
                    return Some(HARNESS);
                }
            };
            let replay = ExternalReplay {
                exe: &exe,
                scenario: &opts.scenario_source,
                seed: r.verdict.seed,
                launch: &launch,
                target_args: server.target_args.clone(),
                explains,
                kind: &kind,
                also: PROCESS_MEMORY
                    .iter()
                    .map(|n| format!("{own}{n}"))
                    .filter(|n| *n != metric && has_gauge(n))
                    .collect(),
            };
            if !matches!(kind, ServerKind::OwnAllocator { .. }) {
                plateau_shell::errln!("plateau: {whose}{}; profiling a replay of iterations {start}..{end}", kind.describe());
            }
            match replay.run() {
                Ok(_) => return rejudge(r),
                Err(e) => format!("{whose}{e}"),
            }
        }
    };
    plateau_shell::errln!("plateau: no allocating line named: {why}");
    if let Err(e) = explains.record_failure(why) {
        plateau_shell::errln!("plateau: {e}");
        return Some(HARNESS);
    }
    rejudge(r)
}

/// How messages name the process a replay profiles ("the engine process of decode: ").
fn process_names(process: Option<&str>, scope: Option<&str>) -> String {
    match (process, scope) {
        (Some(p), Some(r)) => format!("the {p} process of {r}: "),
        (Some(p), None) => format!("the {p} process: "),
        (None, Some(r)) => format!("the {r} process: "),
        (None, None) => String::new(),
    }
}

/// Why a Python server's run recorded no allocation sites of its own (it records them as it goes;
/// a second run of it would see no more).
fn unrecorded_python(exe: &std::path::Path, opts: &RunOptions, server: &ServerRun) -> String {
    let why = if opts.sites == plateau_soak::sites::Depth::Off {
        "--sites off".to_string()
    } else if server.target_args.iter().any(|a| a == "--no-python-hook") {
        "--no-python-hook: memray starts inside the server's processes through plateau's hook".to_string()
    } else if matches!(server.started, Started::Nothing) {
        "the server was given by --pid or its URL: plateau puts its hook only into the servers it starts (--spawn)"
            .to_string()
    } else {
        "see the sites notes in the verdict".to_string()
    };
    format!(
        "a Python server ({}): its allocation sites are recorded by the run itself, and this run recorded none: {why}",
        exe.display()
    )
}

/// The run's rate over the replay's window of what the replay measures: for a layer of a Python
/// process's heap, both layers together (memray sees Python's small objects and malloc's alike);
/// else the gauge itself.
fn run_rate(
    dir: &std::path::Path,
    metric: &str,
    own: &str,
    start: u64,
    end: u64,
    has_gauge: &dyn Fn(&str) -> bool,
) -> Option<f64> {
    if !HEAP_LAYERS.iter().any(|l| metric == format!("{own}{l}")) {
        return window_rate(dir, metric, start, end);
    }
    let rates: Vec<f64> = HEAP_LAYERS
        .iter()
        .map(|l| format!("{own}{l}"))
        .filter(|n| has_gauge(n))
        .filter_map(|n| window_rate(dir, &n, start, end))
        .collect();
    (!rates.is_empty()).then(|| rates.iter().sum())
}

/// What kind of program the server was (server.json, written while it ran), or a deployment's
/// role's process (servers.json).
fn read_kind(dir: &std::path::Path, role: Option<&str>) -> Result<ServerKind, String> {
    let p = dir.join(if role.is_some() { plateau_soak::external::profile::SERVERS_FILE } else { "server.json" });
    let text = plateau_reports::fsutil::read_input_text(&p, plateau_reports::fsutil::RUN_FILE_BYTES)
        .map_err(|e| format!("{e}: what kind of program the server is was not read during the run"))?;
    let Some(role) = role else { return serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display())) };
    let mut kinds: std::collections::BTreeMap<String, ServerKind> =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))?;
    kinds.remove(role).ok_or_else(|| {
        format!("{}: what kind of program the {role} process is was not read during the run", p.display())
    })
}

/// The verdict drawn again by the one judge, now that the replay's sites are on disk.
fn rejudge(r: &mut driver::RunResult) -> Option<u8> {
    match driver::judge_and_write(&r.out_dir) {
        Ok(v) => {
            r.verdict = v;
            None
        }
        Err(e) => {
            plateau_shell::errln!("plateau: {e}");
            Some(HARNESS)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{choose, replay_window, Chosen};
    use plateau_reports::Status::{Fail, Pass};

    #[test]
    fn the_process_that_grew_is_replayed_and_objects_kept_come_first() {
        let g = [
            ("target.proc.rss_anon", Fail, 9000.0, 9000.0),
            ("target.api_server.proc.rss_anon", Fail, 8000.0, 8000.0),
            ("target.api_server.malloc.in_use_bytes", Fail, 7000.0, 7000.0),
            ("target.worker.proc.rss_anon", Fail, 1000.0, 1000.0),
            ("target.worker.malloc.in_use_bytes", Fail, 900_000.0, 900_000.0),
            ("target.engine_core.proc.rss_anon", Pass, 10.0, 10.0),
            ("target.engine_core.py.object_bytes", Fail, 30.0, 30.0),
        ];
        // The heap layers come first, the fastest of them: here malloc's heap in the worker.
        let c = choose(&g, &[None], false).unwrap();
        assert_eq!((c.metric.as_str(), c.process.as_deref()), ("target.worker.malloc.in_use_bytes", Some("worker")));
        let g2: Vec<_> = g.iter().copied().filter(|x| !x.0.contains("malloc.")).collect();
        let c = choose(&g2, &[None], false).unwrap();
        assert_eq!(c.metric, "target.engine_core.py.object_bytes", "a heap layer before any kernel figure");
        // A fill that slows (the worker's caches, 0.58 of its rate in the last half) gives way to a
        // steady growth however small (the engine core's, 0.93), as measured on vLLM 0.32.
        let v = [
            ("target.worker.proc.rss_anon", Pass, 0.0, 0.0),
            ("target.worker.malloc.in_use_bytes", Fail, 79_770.0, 46_080.0),
            ("target.engine_core.proc.rss_anon", Pass, 0.0, 0.0),
            ("target.engine_core.malloc.in_use_bytes", Fail, 1126.0, 1019.0),
        ];
        assert_eq!(choose(&v, &[None], false).unwrap().process.as_deref(), Some("engine_core"));
        // Only the tree's sum fails: the whole tree is replayed.
        let only_sum = [("target.proc.rss_anon", Fail, 5.0, 5.0), ("target.a.proc.rss_anon", Pass, 1.0, 1.0)];
        let c = choose(&only_sum, &[None], false).unwrap();
        assert_eq!(
            c,
            Chosen { scope: None, process: None, metric: "target.proc.rss_anon".into(), slope: 5.0, steady: true }
        );
        assert!(choose(&[("target.proc.rss_anon", Pass, 5.0, 5.0)], &[None], false).is_none());
        // A deployment: the first role in start order with a failing gauge.
        let d = [("prefill.target.proc.rss_anon", Pass, 1.0, 1.0), ("decode.target.proc.rss_anon", Fail, 2.0, 2.0)];
        let c = choose(&d, &[Some("prefill"), Some("decode")], false).unwrap();
        assert_eq!((c.scope.as_deref(), c.process), (Some("decode"), None));
    }

    #[test]
    fn the_window_ends_where_the_growth_became_conclusive_and_holds_the_iterations_before() {
        assert_eq!(replay_window(20, 200, Some(40)), (20, 60));
        assert_eq!(replay_window(20, 200, Some(150)), (110, 150));
        assert_eq!(replay_window(20, 200, None), (20, 60));
        assert_eq!(replay_window(20, 30, Some(25)), (20, 30));
    }
}
