//! `plateau selftest`: every injection caught, every clean scenario passing.

use std::path::PathBuf;

use super::{CiArgs, HARNESS, LEAK, PASS, USAGE};

#[derive(clap::Args)]
pub struct Args {
    /// Shorter injected runs (each to its detection, a few iterations past it); clean
    /// scenarios still run at their full length. About 2 minutes on 2 cores.
    #[arg(long)]
    quick: bool,
    /// Cases run at once, each in a child process (default: the machine's cores). A verdict does
    /// not depend on what runs beside it.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=64))]
    jobs: Option<u16>,
    /// Keep the runs in this directory (default: a temporary one, removed on success).
    #[arg(long)]
    keep: Option<PathBuf>,
    #[command(flatten)]
    ci: CiArgs,
}

pub fn main(a: Args) -> u8 {
    let Args { quick, jobs, keep, ci } = a;
    let jobs = super::jobs_or_cores(jobs);
    let exe = match super::own_exe() {
        Ok(e) => e,
        Err(code) => return code,
    };
    let root =
        keep.clone().unwrap_or_else(|| std::env::temp_dir().join(format!("plateau-selftest-{}", std::process::id())));
    let probe = root.join(".writable");
    if let Err(e) = std::fs::create_dir_all(&root).and_then(|_| std::fs::write(&probe, b"")) {
        plateau_shell::errln!("plateau: --keep {}: {e}", root.display());
        return USAGE;
    }
    let _ = std::fs::remove_file(&probe);
    let checks = match plateau_soak::selftest::run(quick, jobs, &exe, &root) {
        Ok(c) => c,
        Err(e) => {
            plateau_shell::errln!("plateau: {e}");
            return HARNESS;
        }
    };
    if let Err(code) = ci.write_checks("plateau selftest", &checks) {
        return code;
    }
    match checks.iter().filter(|c| c.problem.is_some()).count() {
        0 => {
            if keep.is_none() {
                let _ = std::fs::remove_dir_all(&root);
            }
            PASS
        }
        _ => {
            plateau_shell::errln!("plateau: selftest failed; runs kept in {}", root.display());
            LEAK
        }
    }
}
