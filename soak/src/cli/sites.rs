//! After a run: the profiled replay that names where memory grew, for plateau's own engine
//! (jemalloc's profiler in a child `plateau`) or for a server plateau started (memray for Python,
//! a preloaded jemalloc for a native server); then the verdict is drawn again with the sites.

use plateau_reports::Status;
use plateau_soak::analysis::describe;
use plateau_soak::driver::{self, RunOptions};
use plateau_soak::external::profile::{ExternalReplay, Launch, ServerKind};
use plateau_soak::heapprof::GrowthRecord;

use super::HARNESS;

/// Iterations of a profiled replay's window: enough for a per-iteration figure at the byte, while
/// sampling every allocation costs the replay several times a plain run.
const REPLAY_ITERATIONS: u64 = 40;

/// The replay's window, where the run grew: it ends where the growth became conclusive (at least
/// `REPLAY_ITERATIONS` past warm-up, at most the run's length) and spans the `REPLAY_ITERATIONS`
/// before, never into warm-up. A cache that filled early and a creep that came after it are then
/// told apart: the window holds the creep, not the fill.
fn replay_window(warmup: u64, iterations: u64, first_iter: Option<u64>) -> (u64, u64) {
    let start = warmup.max(1);
    let end = iterations.min((start + REPLAY_ITERATIONS).max(first_iter.unwrap_or(0)));
    (start.max(end.saturating_sub(REPLAY_ITERATIONS)), end)
}

/// After a run whose heap failed (or with --profile), the profiled replay that names where it
/// grew; then the verdict is drawn again with the sites. Some(exit code) when the replay could not
/// be run (the run's verdict stays written) or the growth is in another process.
pub fn heap_sites(r: &mut driver::RunResult, opts: &RunOptions, profile: bool) -> Option<u8> {
    if opts.profile_window.is_some() || r.interrupted {
        return None;
    }
    // A node process's heap (`decode.jemalloc.allocated`) is not replayed: the verdict says so
    // (analysis::note_node_heaps).
    let heap = r.verdict.metrics.iter().find(|m| m.name == "jemalloc.allocated")?;
    if !(profile || heap.status == plateau_reports::Status::Fail) {
        return None;
    }
    let (start, end) = replay_window(r.verdict.warmup_iterations, r.iterations, heap.first_iter);
    if end <= start {
        eprintln!("plateau: no profiled replay: the run ended within its warm-up");
        return None;
    }
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("plateau: the profiled replay cannot find this binary: {e}");
            return Some(HARNESS);
        }
    };
    let injections: Vec<String> = r.verdict.injections.clone();
    let spec = plateau_soak::heapprof::replay::ReplaySpec {
        exe: &exe,
        scenario: &opts.scenario_source,
        seed: r.verdict.seed,
        injections: &injections,
        start_iter: start,
        end_iter: end,
        run_dir: &r.out_dir,
        metric: "jemalloc.allocated",
        // The run's own growth over the replay's window, so that like is compared with like (a
        // cache that filled before the window, or a growth that starts after it, would make the
        // run's overall rate another figure).
        run_bytes_per_iter: window_rate(&r.out_dir, "jemalloc.allocated", start, end)
            .unwrap_or_else(|| heap.trend.as_ref().map_or(0.0, |t| t.slope_per_iter)),
        requests_per_iter: r.verdict.requests_per_iter,
    };
    eprintln!("plateau: profiling a replay of iterations {start}..{end} for the heap's allocation sites");
    if let Err(e) = spec.run() {
        eprint!("{}", describe(&r.verdict));
        eprintln!("plateau: {e}; the run's verdict is in {}", r.out_dir.display());
        return Some(HARNESS);
    }
    rejudge(r)
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

/// The server's process memory gauges a profiled replay explains, in order of preference: memory
/// that is the program's own (anonymous), then all of it. A deployment's are under each role
/// (`decode.target.proc.rss_anon`).
const SERVER_MEMORY: [&str; 3] = ["target.proc.rss_anon", "target.proc.rss", "target.proc.anon_bytes"];

/// After a run against a server whose process memory failed (or with --profile): a profiled
/// replay against a fresh server plateau starts (`--spawn`), which names the allocating lines;
/// for a deployment, the deployment started again with the role that grew under the profiler.
/// Why nothing could be named (a server given by --pid, one with its own allocator, no profiler
/// installed) goes into the verdict instead. Some(exit code) when the verdict could not be drawn
/// again.
pub fn server_sites(r: &mut driver::RunResult, opts: &RunOptions, server: &ServerRun, profile: bool) -> Option<u8> {
    if opts.profile_window.is_some() || r.interrupted {
        return None;
    }
    // Each process's gauges, by scope: the one server's, or each role's.
    let scopes: Vec<Option<&str>> = match &server.started {
        Started::Deployment { roles, .. } => roles.iter().map(|r| Some(r.as_str())).collect(),
        _ => vec![None],
    };
    let name_in = |scope: Option<&str>, n: &str| scope.map_or_else(|| n.to_string(), |r| format!("{r}.{n}"));
    let gauge = |name: &str| r.verdict.metrics.iter().find(|m| m.name == name && m.trend.is_some());
    // The first role (in start order) with a failing gauge, its most telling one; with --profile
    // and none failing, the preferred gauge of the process that grew most.
    let failing = scopes.iter().find_map(|&sc| {
        SERVER_MEMORY.iter().find_map(|n| gauge(&name_in(sc, n)).filter(|m| m.status == Status::Fail).map(|m| (sc, m)))
    });
    let slope = |m: &plateau_reports::MetricVerdict| m.trend.as_ref().map_or(0.0, |t| t.slope_per_iter);
    let chosen = failing.or_else(|| {
        if !profile {
            return None;
        }
        scopes
            .iter()
            .filter_map(|&sc| SERVER_MEMORY.iter().find_map(|n| gauge(&name_in(sc, n))).map(|m| (sc, m)))
            .max_by(|a, b| slope(a.1).total_cmp(&slope(b.1)))
    });
    let (scope, m) = chosen?;
    let (metric, slope) = (m.name.clone(), slope(m));
    // A server's process memory is weighed against its live heap where it still grew: the run's
    // last iterations, after any cache filled (its profiler starts with the server).
    let (start, end) = replay_window(r.verdict.warmup_iterations, r.iterations, Some(r.iterations));
    let note = |why: String| GrowthRecord {
        metric: metric.clone(),
        start_iter: start,
        end_iter: end,
        note: Some(why),
        ..GrowthRecord::default()
    };
    let launch = match &server.started {
        Started::Nothing => None,
        Started::Server { url, spawn } => Some(Launch::Server { url, spawn }),
        Started::Deployment { topology, injections, .. } => {
            Some(Launch::Role { topology, injections, role: scope.unwrap_or_default() })
        }
    };
    let record = match (launch, read_kind(&r.out_dir, scope)) {
        _ if end <= start => note("the run ended within its warm-up: no window to replay".into()),
        (None, _) => note(
            "the server was given by --pid: a profiled replay starts a fresh server under a profiler, so give its command with --spawn to name the allocating line".into(),
        ),
        (Some(_), Err(e)) => note(e),
        (Some(launch), Ok(kind)) => {
            let exe = match std::env::current_exe() {
                Ok(e) => e,
                Err(e) => {
                    eprintln!("plateau: the profiled replay cannot find this binary: {e}");
                    return Some(HARNESS);
                }
            };
            let replay = ExternalReplay {
                exe: &exe,
                scenario: &opts.scenario_source,
                seed: r.verdict.seed,
                launch: &launch,
                target_args: server.target_args.clone(),
                start_iter: start,
                end_iter: end,
                run_dir: &r.out_dir,
                metric: &metric,
                run_bytes_per_iter: window_rate(&r.out_dir, &metric, start, end).unwrap_or(slope),
                requests_per_iter: r.verdict.requests_per_iter,
                kind: &kind,
                also: SERVER_MEMORY
                    .iter()
                    .map(|n| name_in(scope, n))
                    .filter(|n| *n != metric && gauge(n).is_some())
                    .collect(),
            };
            if !matches!(kind, ServerKind::OwnAllocator { .. }) {
                let whose = scope.map(|r| format!("the {r} process: ")).unwrap_or_default();
                eprintln!("plateau: {whose}{}; profiling a replay of iterations {start}..{end}", kind.describe());
            }
            match replay.run() {
                Ok(_) => return rejudge(r),
                Err(e) => note(scope.map_or(e.clone(), |r| format!("the {r} process: {e}"))),
            }
        }
    };
    eprintln!("plateau: no allocating line named: {}", record.note.as_deref().unwrap_or(""));
    if let Err(e) = plateau_soak::heapprof::write_record(&r.out_dir, &record) {
        eprintln!("plateau: {e}");
        return Some(HARNESS);
    }
    rejudge(r)
}

/// What kind of program the server was (server.json, written while it ran), or a deployment's
/// role's process (servers.json).
fn read_kind(dir: &std::path::Path, role: Option<&str>) -> Result<ServerKind, String> {
    let p = dir.join(if role.is_some() { plateau_soak::external::profile::SERVERS_FILE } else { "server.json" });
    let text = std::fs::read_to_string(&p)
        .map_err(|e| format!("{}: {e}: what kind of program the server is was not read during the run", p.display()))?;
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
            eprintln!("plateau: {e}");
            Some(HARNESS)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::replay_window;

    #[test]
    fn the_window_ends_where_the_growth_became_conclusive_and_holds_the_iterations_before() {
        assert_eq!(replay_window(20, 200, Some(40)), (20, 60));
        assert_eq!(replay_window(20, 200, Some(150)), (110, 150));
        assert_eq!(replay_window(20, 200, None), (20, 60));
        assert_eq!(replay_window(20, 30, Some(25)), (20, 30));
    }
}
