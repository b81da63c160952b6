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
            print!("{story}");
            verdict_code(&verdict)
        }
        Err(e) => {
            eprintln!("plateau: {e}");
            USAGE
        }
    }
}
