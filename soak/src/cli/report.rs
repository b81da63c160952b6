//! `plateau report`: a run's plots and report.html drawn again from its samples and the verdict
//! it recorded, optionally against a baseline run. Redrawing never judges: the verdict is the
//! run's own verdict.json while its evidence holds (a run without one is judged once, by the one
//! judge, and it is written; one whose samples or detector changed is judged again, and said so).

use std::path::{Path, PathBuf};

use plateau_reports::{Samples, Verdict};
use plateau_soak::analysis::{describe, load_run, write_verdict};

use super::{verdict_code, USAGE};

#[derive(clap::Args)]
pub struct Args {
    run_dir: PathBuf,
    /// A run directory to compare with (another scenario's is compared where comparable).
    #[arg(long)]
    baseline: Option<PathBuf>,
}

pub fn main(a: Args) -> u8 {
    report(&a.run_dir, a.baseline.as_deref())
}

/// A run's samples and its verdict, through the one loader: the recorded verdict while it still
/// judged exactly these samples, else judged now and said so (a run that wrote no verdict gets
/// the one judged now written; a recorded one is never written over).
fn load(dir: &Path) -> Result<(Samples, Verdict), String> {
    let run = load_run(dir)?;
    match (&run.judged_again, run.had_verdict) {
        (Some(why), true) => plateau_shell::errln!("plateau: {why}: judged again from samples.jsonl (the recorded verdict is not trusted, and is left as it is)"),
        (Some(_), false) => {
            let path = dir.join("verdict.json");
            write_verdict(dir, &run.verdict).map_err(|e| format!("{}: {e}", path.display()))?;
        }
        (None, _) => {}
    }
    Ok((run.samples, run.verdict))
}

fn report(run_dir: &Path, baseline: Option<&Path>) -> u8 {
    let (s, v) = match load(run_dir) {
        Ok(x) => x,
        Err(e) => {
            plateau_shell::errln!("plateau: {e}");
            return USAGE;
        }
    };
    let base = match baseline.map(|b| load(b).map(|(samples, verdict)| (b, samples, verdict))).transpose() {
        Ok(x) => x.map(|(b, samples, verdict)| plateau_soak::analysis::BaselineRun {
            dir: b.to_path_buf(),
            samples,
            verdict,
        }),
        Err(e) => {
            plateau_shell::errln!("plateau: --baseline: {e}");
            return USAGE;
        }
    };
    if let Err(e) = plateau_soak::analysis::draw(run_dir, &s, &v, base.as_ref()) {
        plateau_shell::errln!("plateau: {}: cannot write the report: {e}", run_dir.display());
        return USAGE;
    }
    plateau_shell::out!("{}", describe(&v));
    if let Some(b) = &base {
        if b.verdict.scenario != v.scenario {
            plateau_shell::outln!(
                "note: the baseline ran scenario {}, this run {}: only the metrics both have are compared",
                b.verdict.scenario,
                v.scenario
            );
        }
        let now = plateau_reports::figures::of_run(&s, &v);
        let then = plateau_reports::figures::of_run(&b.samples, &b.verdict);
        plateau_shell::outln!(
            "{:<36} {:>14} {:>14} {:>16} {:>16}",
            "metric (against the baseline)",
            "level then",
            "level now",
            "slope/it then",
            "slope/it now"
        );
        for n in now.iter().filter(|n| n.kind == plateau_reports::Kind::Gauge) {
            let Some(t) = then.iter().find(|t| t.name == n.name) else { continue };
            let f = |x: Option<f64>| x.map(|x| plateau_reports::figures::fmt_value(x, &n.unit)).unwrap_or("-".into());
            plateau_shell::outln!(
                "{:<36} {:>14} {:>14} {:>16} {:>16}",
                n.name,
                f(t.level),
                f(n.level),
                f(t.slope_per_iter),
                f(n.slope_per_iter)
            );
        }
    }
    plateau_shell::outln!("report: {}", run_dir.join("report.html").display());
    verdict_code(&v)
}
