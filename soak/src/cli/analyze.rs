//! `plateau analyze`: the detector alone on a samples file, from plateau or anything writing v1.
//! It judges with what the samples recorded (the one judge); `--warmup` and `--tolerance` judge
//! with other settings. Beside a run's own verdict.json its verdict goes into analyze/, never over
//! the run's: a run's verdict is what the run wrote.

use std::path::{Path, PathBuf};

use plateau_reports::Samples;
use plateau_soak::analysis::{describe, differing, judge_read_known, write_outputs};
use plateau_soak::detector::{Overrides, Tolerance};

use super::{verdict_code, CiArgs, USAGE};

/// Where analyze's verdict goes when no --out is given and the samples' directory holds a run's
/// own verdict: beside it.
const OVERRIDDEN_DIR: &str = "analyze";

#[derive(clap::Args)]
pub struct Args {
    samples: PathBuf,
    /// Where to write verdict.json and plots (default: next to the samples, or into analyze/
    /// beside them where a run's own verdict.json is: analyze never writes over a run's verdict).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Quiescent iterations to skip before trend tests (default: the header's, else 20).
    #[arg(long)]
    warmup: Option<u64>,
    /// Byte growth to accept, per request or per iteration: 64B/request, 1KiB/iteration, 0
    /// (default: the header's, else 1B/request).
    #[arg(long)]
    tolerance: Option<Tolerance>,
    /// Judge with this known-growth file (see `plateau run --known`) in place of the one the run
    /// recorded; its entries' expiry is judged on today's date. The verdict names it.
    #[arg(long, value_name = "FILE")]
    known: Option<PathBuf>,
    #[command(flatten)]
    ci: CiArgs,
}

pub fn main(a: Args) -> u8 {
    let Args { samples, out, warmup, tolerance, known, ci } = a;
    let s = match Samples::read(&samples) {
        Ok(s) => s,
        Err(e) => {
            plateau_shell::errln!("plateau: {e}");
            return USAGE;
        }
    };
    let overrides = match differing(&s, &Overrides { warmup, tolerance }) {
        Ok(o) => o,
        Err(e) => {
            plateau_shell::errln!("plateau: {}: {e}", samples.display());
            return USAGE;
        }
    };
    let known = match known.map(|k| super::known::load(&k, super::known::today())).transpose() {
        Ok(k) => k.map(|(k, _)| k),
        Err(code) => return code,
    };
    let v = match judge_read_known(&s, &samples, &overrides, known.as_ref()) {
        Ok(v) => v,
        Err(e) => {
            plateau_shell::errln!("plateau: {e}");
            return USAGE;
        }
    };
    let run_dir = samples.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let run_has_verdict = run_dir.join("verdict.json").exists();
    let overridden = overrides != Overrides::default() || known.is_some();
    let given = out.is_some();
    let dir = match out {
        Some(d) => d,
        None if run_has_verdict => run_dir.join(OVERRIDDEN_DIR),
        None => run_dir.to_path_buf(),
    };
    let dir = match super::absolute(&dir, "--out") {
        Ok(d) => d,
        Err(code) => return code,
    };
    // A directory of the user's own is never written into: --out (and analyze/) is taken as
    // `run --out` is, new or empty or plateau's own; the samples' own directory by default.
    if given || run_has_verdict {
        if let Err(e) = plateau_reports::fsutil::claim_run_dir(&dir) {
            plateau_shell::errln!("plateau: --out {e}");
            return USAGE;
        }
    }
    if run_has_verdict && same_dir(&dir, run_dir) {
        plateau_shell::errln!(
            "plateau: --out {}: it holds the run's own verdict.json; analyze's verdict goes beside it, never over it: give another --out (by default {})",
            dir.display(),
            run_dir.join(OVERRIDDEN_DIR).display()
        );
        return USAGE;
    }
    if let Err(e) = write_outputs(&dir, &s, &v) {
        // The output directory is the user's: one that cannot be written is bad input.
        plateau_shell::errln!("plateau: --out {}: {e}", dir.display());
        return USAGE;
    }
    plateau_shell::err!("{}", describe(&v));
    if overridden {
        plateau_shell::errln!("plateau: judged with {}: written to {}", v.overrides.join(" "), dir.display());
    } else {
        plateau_shell::errln!("plateau: written to {}", dir.display());
    }
    let run = plateau_reports::ci::RunRef { verdict: &v, dir: dir.display().to_string(), replay: None };
    if let Err(code) = ci.write(&[run]) {
        return code;
    }
    verdict_code(&v)
}

/// Whether two paths name the same directory (one that does not exist yet is only itself).
fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}
