//! `plateau fuzz SCENARIO`: random mixes of a scenario's phases and request features, each a
//! soak judged as `plateau run` judges (registries and gauges, going on while undecided); the
//! first failure is shrunk (the library's `shrink::fuzz` has the lifecycle).

use std::path::PathBuf;

use plateau_engine::Injection;
use plateau_soak::scenario::Scenario;
use plateau_soak::shrink::fuzz::{self, FuzzOptions};

use super::{HARNESS, INCONCLUSIVE, LEAK, PASS, USAGE};

#[derive(clap::Args)]
pub struct Args {
    /// The scenario whose phases and features are mixed: a .toml file or a shipped name.
    scenario: String,
    /// Mixes to draw and run.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    cases: u32,
    /// Iterations of each case before it may go on (while its gauges are undecided, up to four
    /// times as many). Default 60: the shortest run whose every gauge has the 20 points after
    /// warm-up a trend verdict needs; a registry leftover ends a case at once. Against a server
    /// (--target, --topology) the scenario's `target_iterations` and `target_warmup_iterations`
    /// where it sets them, as `plateau run` uses: a server warming up for 300 iterations would
    /// fail every 60-iteration case.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    iterations: Option<u64>,
    /// Seed of the draw and of every case's workload (default: the scenario's).
    #[arg(long)]
    seed: Option<u64>,
    /// Switch on a leak injection in every case (repeatable; see `plateau list`).
    #[arg(long = "inject", value_name = "NAME")]
    inject: Vec<Injection>,
    /// Cases run at once, each a child process (default: the machine's cores).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=64))]
    jobs: Option<u16>,
    /// Wall-clock budget for the cases and the shrink: 90s, 30m, 2h.
    #[arg(long, default_value = "30m", value_parser = super::parse_budget)]
    budget: std::time::Duration,
    /// Where the cases, fuzz.json and the shrink go (default: runs/fuzz-<scenario>-<time>).
    #[arg(long)]
    out: Option<PathBuf>,
    /// No line per case.
    #[arg(long)]
    quiet: bool,
    #[command(flatten)]
    external: super::run::ExternalArgs,
}

pub fn main(a: Args) -> u8 {
    let Args { scenario, cases, iterations, seed, inject, jobs, budget, out, quiet, external } = a;
    let (s, _) = match Scenario::load(&scenario) {
        Ok(s) => s,
        Err(e) => {
            plateau_shell::errln!("plateau: {e}");
            return USAGE;
        }
    };
    let mut doc: toml::Table = match s.text.parse() {
        Ok(d) => d,
        Err(e) => {
            plateau_shell::errln!("plateau: {}: {e}", s.file);
            return USAGE;
        }
    };
    let iterations = case_length(&s, &mut doc, iterations, external.target.is_some() || external.topology.is_some());
    let exe = match super::own_exe() {
        Ok(e) => e,
        Err(code) => return code,
    };
    let mut flags = Vec::new();
    for i in &inject {
        flags.extend(["--inject".to_string(), i.name().to_string()]);
    }
    let origin = external.origin(&scenario, &inject, flags);
    let out_dir = out.unwrap_or_else(|| PathBuf::from("runs").join(format!("fuzz-{}-{}", s.name, super::timestamp())));
    let (out_dir, stop) = match (super::absolute(&out_dir, "--out"), super::stop_flag()) {
        (Ok(o), Ok(stop)) => (o, stop),
        (Err(code), _) | (_, Err(code)) => return code,
    };
    let opts = FuzzOptions {
        cases,
        iterations,
        seed: seed.unwrap_or(s.soak.seed),
        out_dir,
        jobs: super::jobs_or_cores(jobs),
        budget,
        exe,
        quiet,
        stop,
    };
    let found = match fuzz::fuzz(&doc, &origin, &opts) {
        Ok(f) => f,
        Err(e) => {
            plateau_shell::errln!("plateau: {e}");
            return USAGE;
        }
    };
    tell(&found, &opts, cases as usize)
}

/// What a fuzz found, said (a failure, shrunk or not; a server that fails on its own; no case
/// judged; cases undecided; all passed), and its exit code.
fn tell(found: &fuzz::Fuzzed, opts: &FuzzOptions, asked: usize) -> u8 {
    let iterations = opts.iterations;
    let ran = found.records.iter().filter(|r| r.secs > 0.0).count();
    let errors = found.records.iter().filter(|r| r.secs > 0.0 && r.verdict == "error").count();
    let judged = found.judged;
    let fuzz_json = opts.out_dir.join("fuzz.json");
    // Any case that failed is a finding, the injection's or the server's own: never a pass.
    let failed = found.failure.is_some() || found.records.iter().any(|r| r.verdict == "fail");
    let code = outcome_code(failed, judged, found.undecided, asked);
    if found.interrupted {
        let fails = found.records.iter().filter(|r| r.verdict == "fail").count();
        let passes = found.records.iter().filter(|r| r.verdict == "pass").count();
        plateau_shell::errln!(
            "plateau: fuzz: interrupted (SIGTERM or Ctrl-C): {judged} of {asked} cases judged before the stop ({fails} failed, {passes} passed), the running ones stopped, nothing shrunk; see {}",
            fuzz_json.display()
        );
        return INCONCLUSIVE;
    }
    if let (None, Some(k)) = (&found.failure, found.own_failure) {
        let r = &found.records[k];
        plateau_shell::errln!(
            "plateau: fuzz: case {k} ({}) failed on {}, and its control run without the injections failed too, on {}: the server under test grows on its own (not the injection's leak; see {})",
            r.change,
            r.failing.join(", "),
            r.control_failing.join(", "),
            opts.out_dir.join("candidates").join(format!("{k:03}")).join("control").display()
        );
        return code;
    }
    if let (None, Some(r)) = (&found.failure, found.records.iter().find(|r| r.verdict == "fail")) {
        plateau_shell::errln!(
            "plateau: fuzz: case {} ({}) failed on {}: {} ({})",
            r.id,
            r.change,
            r.failing.join(", "),
            if r.note.is_empty() { "not shrunk" } else { &r.note },
            fuzz_json.display()
        );
        return code;
    }
    match &found.failure {
        None if code == HARNESS => {
            let why = if ran == 0 {
                "the budget ran out before the first case"
            } else {
                "every case that ran failed to run to a verdict"
            };
            plateau_shell::errln!("plateau: fuzz: no case was judged ({why}; see {})", fuzz_json.display());
            code
        }
        None if code == INCONCLUSIVE => {
            let mut why = Vec::new();
            if found.undecided > 0 {
                why.push(format!("{} still undecided at their cap", found.undecided));
            }
            if errors > 0 {
                why.push(format!("{errors} did not run to a verdict"));
            }
            if judged < asked && errors == 0 {
                why.push("the budget ran out for the rest".into());
            }
            plateau_shell::errln!(
                "plateau: fuzz: {} of {asked} cases decided, none failing; {} (see {}): nothing here is a pass",
                judged - found.undecided,
                why.join(", "),
                fuzz_json.display()
            );
            code
        }
        None => {
            plateau_shell::errln!(
                "plateau: fuzz: {judged} cases of {iterations} iterations or more, all judged and passed: none left anything behind or grew ({})",
                opts.out_dir.display()
            );
            code
        }
        Some((k, shrunk)) => {
            let r = &found.records[*k];
            plateau_shell::errln!("plateau: fuzz: case {k} ({}) failed on {}", r.change, r.failing.join(", "));
            match shrunk {
                Ok(s) => {
                    plateau_shell::out!("{}", s.story.split("\n## Candidates").next().unwrap_or(""));
                    plateau_shell::errln!(
                        "plateau: fuzz: shrunk in {:.0} s: {}",
                        s.secs,
                        opts.out_dir.join("shrink/story.md").display()
                    );
                }
                Err(e) => plateau_shell::errln!("plateau: fuzz: the failing case could not be shrunk: {e}"),
            }
            code
        }
    }
}

/// A fuzz's exit code: 1 when a case failed (a leak found, whatever else happened); otherwise 3
/// when no case was judged (the budget ran out before the first, or every case broke), 4 when a
/// judged case stayed undecided or fewer were judged than asked for (the property holds for the
/// decided ones only), 0 when every case asked for was judged and passed.
fn outcome_code(failed: bool, judged: usize, undecided: usize, asked: usize) -> u8 {
    if failed {
        LEAK
    } else if judged == 0 {
        HARNESS
    } else if undecided > 0 || judged < asked {
        INCONCLUSIVE
    } else {
        PASS
    }
}

/// Each case's length: the user's (with the scenario's own warm-up, as `plateau run` keeps it),
/// else against a server the scenario's target length with its target warm-up written into the
/// cases' scenario (`doc`), else [`DEFAULT_CASE_ITERATIONS`].
fn case_length(s: &Scenario, doc: &mut toml::Table, asked: Option<u64>, external: bool) -> u64 {
    if let Some(n) = asked {
        return n;
    }
    let target = s.soak.target_iterations.is_some() || s.soak.target_warmup_iterations.is_some();
    if !external || !target {
        return DEFAULT_CASE_ITERATIONS;
    }
    let t = s.soak.for_target();
    if let Some(soak) = doc.get_mut("soak").and_then(toml::Value::as_table_mut) {
        soak.insert("warmup_iterations".into(), toml::Value::Integer(t.warmup_iterations.min(i64::MAX as u64) as i64));
    }
    t.iterations
}

/// A case's length unless the user or a target length says otherwise (see `--iterations`).
const DEFAULT_CASE_ITERATIONS: u64 = 60;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_every_case_judged_with_none_failing_passes() {
        assert_eq!(outcome_code(false, 32, 0, 32), PASS);
        assert_eq!(outcome_code(false, 32, 1, 32), INCONCLUSIVE);
        assert_eq!(outcome_code(false, 5, 0, 32), INCONCLUSIVE);
        assert_eq!(outcome_code(false, 0, 0, 32), HARNESS);
        assert_eq!(outcome_code(true, 0, 0, 32), LEAK);
        assert_eq!(outcome_code(true, 3, 1, 32), LEAK);
    }

    #[test]
    fn cases_against_a_server_run_the_scenario_s_target_length_after_its_target_warm_up() {
        let (s, _) = Scenario::load("n-sampling").expect("shipped");
        let fresh = || -> toml::Table { s.text.parse().expect("toml") };
        let warmup = |d: &toml::Table| d["soak"]["warmup_iterations"].as_integer();
        let mut doc = fresh();
        assert_eq!(case_length(&s, &mut doc, None, true), 600);
        assert_eq!(warmup(&doc), Some(300));
        let mut doc = fresh();
        assert_eq!(case_length(&s, &mut doc, None, false), DEFAULT_CASE_ITERATIONS);
        assert_eq!(warmup(&doc), Some(20));
        let mut doc = fresh();
        assert_eq!(case_length(&s, &mut doc, Some(100), true), 100);
        assert_eq!(warmup(&doc), Some(20));
    }
}
