//! `plateau explain`: the story of a run.

use std::path::PathBuf;

use super::{verdict_code, USAGE};

#[derive(clap::Args)]
pub struct Args {
    /// A directory written by `plateau run` (verdict.json and samples.jsonl; growth.json,
    /// residues.json and mappings.json where the run wrote them).
    run_dir: PathBuf,
}

pub fn main(a: Args) -> u8 {
    match plateau_soak::explain::explain(&a.run_dir) {
        Ok((story, verdict)) => {
            plateau_shell::out!("{story}");
            verdict_code(&verdict)
        }
        Err(e) => {
            plateau_shell::errln!("plateau: {e}");
            USAGE
        }
    }
}
