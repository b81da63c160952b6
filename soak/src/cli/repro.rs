//! `plateau repro`: a reproduction of a failing run against a server that runs without plateau
//! (repro.py and the run's requests), and an issue body for the server's maintainers (ISSUE.md,
//! with the run's plot beside it).

use std::path::PathBuf;

use plateau_soak::repro::{self, ReproError};

use super::{HARNESS, USAGE};

#[derive(clap::Args)]
pub struct Args {
    /// A failing run's directory (a run against a server: --target, --topology); where the run
    /// was shrunk, its minimal scenario's requests are the ones reproduced.
    run_dir: PathBuf,
    /// Where repro.py, requests.jsonl.gz, ISSUE.md and memory.png go (new or empty; default:
    /// RUN_DIR/repro).
    #[arg(long)]
    out: Option<PathBuf>,
    /// A release bisect's directory (`plateau bisect --versions ... --out DIR`) whose answer
    /// ISSUE.md gives.
    #[arg(long, value_name = "DIR")]
    bisect: Option<PathBuf>,
}

pub fn main(a: Args) -> u8 {
    let out = a.out.unwrap_or_else(|| a.run_dir.join("repro"));
    let out = match super::absolute(&out, "--out") {
        Ok(o) => o,
        Err(code) => return code,
    };
    if let Err(e) = plateau_soak::fsutil::claim_run_dir(&out) {
        plateau_shell::errln!("plateau: --out {e}");
        return USAGE;
    }
    match repro::write(&a.run_dir, &out, a.bisect.as_deref()) {
        Ok(w) => {
            plateau_shell::errln!(
                "plateau: {} grew {:.0} B/request{}; repro.py sends the run's {} requests: python3 {}/repro.py --url URL --pid PID",
                w.gauge,
                w.rate_per_request,
                w.site.map(|s| format!(" at {s}")).unwrap_or_default(),
                w.requests,
                out.display()
            );
            plateau_shell::errln!("plateau: ISSUE.md, repro.py, requests.jsonl.gz and memory.png in {}", out.display());
            0
        }
        Err(ReproError::Input(m)) => {
            plateau_shell::errln!("plateau: {m}");
            USAGE
        }
        Err(ReproError::Write(m)) => {
            plateau_shell::errln!("plateau: {m}");
            HARNESS
        }
    }
}
