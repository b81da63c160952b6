//! `plateau analyze`: the detector alone on a samples file, from plateau or anything writing v1.

use std::path::{Path, PathBuf};

use plateau_soak::analysis::{describe, judge_file, write_outputs, JudgeOptions};
use plateau_soak::detector::Tolerance;

use super::{verdict_code, CiArgs, USAGE};

#[derive(clap::Args)]
pub struct Args {
    samples: PathBuf,
    /// Where to write verdict.json and plots (default: next to the samples).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Quiescent iterations to skip before trend tests (default: the header's, else 20).
    #[arg(long)]
    warmup: Option<u64>,
    /// Byte growth to accept, per request or per iteration: 64B/request, 1KiB/iteration, 0
    /// (default 1B/request).
    #[arg(long)]
    tolerance: Option<Tolerance>,
    #[command(flatten)]
    ci: CiArgs,
}

pub fn main(a: Args) -> u8 {
    let Args { samples, out, warmup, tolerance, ci } = a;
    let o = JudgeOptions { warmup, tolerance, tolerance_explicit: tolerance.is_some(), incomplete: false };
    let (s, v) = match judge_file(&samples, &o) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("plateau: {e}");
            return USAGE;
        }
    };
    let dir = out.unwrap_or_else(|| samples.parent().map(Path::to_path_buf).unwrap_or_default());
    if let Err(e) = write_outputs(&dir, &s, &v) {
        // The output directory is the user's: one that cannot be written is bad input.
        eprintln!("plateau: --out {}: {e}", dir.display());
        return USAGE;
    }
    eprint!("{}", describe(&v));
    let run = plateau_reports::ci::RunRef { verdict: &v, dir: dir.display().to_string(), replay: None };
    if let Err(code) = ci.write(&[run]) {
        return code;
    }
    verdict_code(&v)
}
