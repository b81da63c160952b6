//! `plateau repro`: from a failing run against a server, what a maintainer can act on without
//! installing plateau.
//!
//! Lifecycle: the run directory is read as every reader reads it (its samples judged again); a
//! run that did not fail, or is of plateau's own engine, is refused. Its requests are planned
//! again from its scenario (the shrunk minimal.toml where the run was shrunk) and seed, exactly
//! as the run sent them, into requests.jsonl.gz; repro.py (standard library only) sends them and
//! measures the server's process tree; ISSUE.md says what grew, where, on what, and how to run
//! repro.py; the run's memory plot goes beside it. Nothing in ISSUE.md names a path of this
//! machine ([`scrub::paths`]).

mod issue;
mod packages;
pub mod scrub;

use std::io::Write;
use std::path::{Path, PathBuf};

use plateau_reports::{Environment, MetricVerdict, Status, Verdict};
use plateau_scenario::Scenario;

/// The script, as shipped.
const REPRO_PY: &str = include_str!("repro.py");

/// Requests a reproduction sends at most: far more than five minutes of any server's work, and
/// a bound on requests.jsonl.gz.
pub const MAX_REQUESTS: u64 = 1_000_000;

/// Why a reproduction could not be written.
#[derive(Debug)]
pub enum ReproError {
    /// Exit 2: not a run this can reproduce, or an input that does not read.
    Input(String),
    /// Exit 3: writing the outputs failed.
    Write(String),
}

/// What was written.
pub struct Written {
    pub requests: u64,
    pub gauge: String,
    pub rate_per_request: f64,
    pub site: Option<String>,
}

/// The gauge a reproduction measures: the failing process memory (RSS) with the largest rate per
/// request, else the failing byte gauge that does.
pub fn grown(v: &Verdict) -> Option<(&MetricVerdict, f64)> {
    let rated = |m: &&MetricVerdict| {
        (m.status == Status::Fail && m.unit == "bytes").then_some(()).and(m.projected.as_ref()?.per_request)
    };
    let best = |rss: bool| {
        v.metrics
            .iter()
            .filter(|m| !rss || m.name.ends_with("proc.rss"))
            .filter_map(|m| rated(&m).map(|r| (m, r)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
    };
    best(true).or_else(|| best(false))
}

/// Writes requests.jsonl.gz, repro.py, ISSUE.md and memory.png for the run in `run_dir` into
/// `out`; `bisect` is a release bisect's directory whose answer ISSUE.md gives.
pub fn write(run_dir: &Path, out: &Path, bisect: Option<&Path>) -> Result<Written, ReproError> {
    let input = ReproError::Input;
    let run = plateau_analysis::load_run(run_dir).map_err(input)?;
    let v = &run.verdict;
    if !v.backend.starts_with("external") {
        return Err(ReproError::Input(format!(
            "{}: a run of plateau's own engine ({}): repro writes a reproduction against a server (--target)",
            run_dir.display(),
            v.backend
        )));
    }
    if !v.failed() {
        return Err(ReproError::Input(format!(
            "{}: the run did not fail ({}): there is no growth to reproduce",
            run_dir.display(),
            v.summary
        )));
    }
    let (gauge, rate) = grown(v).ok_or_else(|| {
        ReproError::Input(format!(
            "{}: no failing gauge of bytes with a rate per request (the run counted no requests): repro measures growth per request",
            run_dir.display()
        ))
    })?;
    let env: Environment = read_json(&run_dir.join("environment.json")).map_err(input)?;
    let (scenario, shrunk, iterations) = scenario_of(run_dir, v)?;
    std::fs::create_dir_all(out).map_err(|e| ReproError::Write(format!("{}: {e}", out.display())))?;
    let meta = serde_json::json!({
        "schema": "plateau.repro.v1",
        "summary": scrub::paths(&v.summary),
        "gauge": gauge.name,
        "process": issue::role(&gauge.name),
        "rate_per_request": rate,
        "warmup_share": v.warmup_iterations as f64 / v.iterations.max(1) as f64,
        "concurrency": flag(&env.replay_args, "--concurrency").and_then(|c| c.parse::<u64>().ok()).unwrap_or(64),
        "requests": 0,
    });
    let requests = write_requests(&out.join("requests.jsonl.gz"), &scenario, v.seed, iterations, meta)?;
    let put = |name: &str, bytes: &[u8]| {
        plateau_reports::fsutil::write_atomic(&out.join(name), bytes)
            .map_err(|e| ReproError::Write(format!("{}: {e}", out.join(name).display())))
    };
    put("repro.py", REPRO_PY.as_bytes())?;
    let plot = run_dir.join("memory.png");
    let has_plot = std::fs::read(&plot).ok().map(|png| put("memory.png", &png)).transpose()?.is_some();
    let site = issue::top_site(v);
    let text = issue::markdown(&issue::Facts {
        verdict: v,
        env: &env,
        run_dir,
        gauge,
        rate,
        requests,
        shrunk,
        has_plot,
        packages: packages::of_server(run_dir, flag(&env.replay_args, "--spawn")),
        bisect: bisect.map(issue::bisect_answer).transpose().map_err(input)?,
    });
    put("ISSUE.md", text.as_bytes())?;
    Ok(Written { requests, gauge: gauge.name.clone(), rate_per_request: rate, site: site.and_then(|s| s.site.clone()) })
}

/// The scenario the run sent (the shrunk minimal one where the run was shrunk), whether it is
/// the shrunk one, and its length.
fn scenario_of(run_dir: &Path, v: &Verdict) -> Result<(Scenario, bool, u64), ReproError> {
    let minimal = run_dir.join("shrink").join("minimal.toml");
    let (path, shrunk): (PathBuf, bool) =
        if minimal.is_file() { (minimal, true) } else { (run_dir.join("scenario.toml"), false) };
    let text = plateau_reports::fsutil::read_input_text(&path, plateau_reports::fsutil::RUN_FILE_BYTES)
        .map_err(ReproError::Input)?;
    let s = Scenario::parse(&text, &path.display().to_string()).map_err(|e| ReproError::Input(e.to_string()))?;
    let iterations = if shrunk { s.soak.iterations } else { v.iterations };
    Ok((s, shrunk, iterations))
}

/// A JSON file of a run or a bisect; errors name it, and the line.
pub(crate) fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, String> {
    plateau_reports::fsutil::read_input_json(path, plateau_reports::fsutil::RUN_FILE_BYTES)
}

/// A flag's value in a list of arguments.
fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).map(String::as_str)
}

/// requests.jsonl.gz: the description line, then one line per iteration; the requests counted.
fn write_requests(
    path: &Path,
    s: &Scenario,
    seed: u64,
    iterations: u64,
    mut meta: serde_json::Value,
) -> Result<u64, ReproError> {
    let werr = |e: std::io::Error| ReproError::Write(format!("{}: {e}", path.display()));
    // The count goes in the first line: plan once to count (cheap), once to write.
    let mut count = 0u64;
    plateau_external::requests::each_iteration(s, seed, iterations, |_, r| {
        count += r.len() as u64;
        Ok(())
    })
    .map_err(werr)?;
    if count > MAX_REQUESTS {
        return Err(ReproError::Input(format!(
            "the run sent {count} requests, more than {MAX_REQUESTS}: shrink it first"
        )));
    }
    meta["requests"] = count.into();
    let tmp = path.with_extension("partial");
    let file = std::fs::File::create(&tmp).map_err(werr)?;
    let mut gz = flate2::write::GzEncoder::new(std::io::BufWriter::new(file), flate2::Compression::default());
    writeln!(gz, "{meta}").map_err(werr)?;
    plateau_external::requests::each_iteration(s, seed, iterations, |iter, r| {
        writeln!(gz, "{}", serde_json::json!({ "iter": iter, "requests": r }))
    })
    .map_err(werr)?;
    gz.finish().and_then(|mut w| w.flush()).map_err(werr)?;
    std::fs::rename(&tmp, path).map_err(werr)?;
    Ok(count)
}
