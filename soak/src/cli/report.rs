//! `plateau report`: a run's plots and report.html drawn again from its samples and the verdict
//! it recorded, optionally against a baseline run. Redrawing never judges: the verdict is the
//! run's own verdict.json (a run without one is judged once, by the one judge, and it is written).

use std::path::{Path, PathBuf};

use plateau_reports::{Samples, Verdict};
use plateau_soak::analysis::{describe, judge_read, write_verdict};
use plateau_soak::detector::Overrides;

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

/// A run's samples and its verdict: the one in verdict.json, else judged now (and then written).
fn load(dir: &Path) -> Result<(Samples, Verdict), String> {
    let samples = dir.join("samples.jsonl");
    let s = Samples::read(&samples).map_err(|e| e.to_string())?;
    let path = dir.join("verdict.json");
    if path.exists() {
        let bytes = plateau_soak::fsutil::read_input(&path, plateau_soak::fsutil::RUN_FILE_BYTES)?;
        let v = serde_json::from_slice(&bytes).map_err(|e| format!("{}: line {}: {e}", path.display(), e.line()))?;
        return Ok((s, v));
    }
    let v = judge_read(&s, &samples, &Overrides::default())?;
    write_verdict(dir, &v).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((s, v))
}

fn report(run_dir: &Path, baseline: Option<&Path>) -> u8 {
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
    if let Err(e) = plateau_soak::analysis::draw(run_dir, &s, &v, base.as_ref()) {
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
