//! `plateau report`: a run's verdict, plots and report.html drawn again from its samples,
//! optionally against a baseline run.

use std::path::{Path, PathBuf};

use plateau_soak::analysis::{describe, judge_file, JudgeOptions};

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

fn report(run_dir: &Path, baseline: Option<&Path>) -> u8 {
    let load = |dir: &Path| judge_file(&dir.join("samples.jsonl"), &JudgeOptions::default());
    let (s, v) = match load(run_dir) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("plateau: {e}");
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
            eprintln!("plateau: --baseline: {e}");
            return USAGE;
        }
    };
    if let Err(e) = plateau_soak::analysis::write_outputs_against(run_dir, &s, &v, base.as_ref()) {
        eprintln!("plateau: {}: cannot write the report: {e}", run_dir.display());
        return USAGE;
    }
    print!("{}", describe(&v));
    if let Some(b) = &base {
        if b.verdict.scenario != v.scenario {
            println!(
                "note: the baseline ran scenario {}, this run {}: only the metrics both have are compared",
                b.verdict.scenario, v.scenario
            );
        }
        let now = plateau_reports::figures::of_run(&s, &v);
        let then = plateau_reports::figures::of_run(&b.samples, &b.verdict);
        println!(
            "{:<36} {:>14} {:>14} {:>16} {:>16}",
            "metric (against the baseline)", "level then", "level now", "slope/it then", "slope/it now"
        );
        for n in now.iter().filter(|n| n.kind == plateau_reports::Kind::Gauge) {
            let Some(t) = then.iter().find(|t| t.name == n.name) else { continue };
            let f = |x: Option<f64>| x.map(|x| plateau_reports::figures::fmt_value(x, &n.unit)).unwrap_or("-".into());
            println!(
                "{:<36} {:>14} {:>14} {:>16} {:>16}",
                n.name,
                f(t.level),
                f(n.level),
                f(t.slope_per_iter),
                f(n.slope_per_iter)
            );
        }
    }
    println!("report: {}", run_dir.join("report.html").display());
    verdict_code(&v)
}
