//! `plateau explain`: the story of a run.

use std::path::PathBuf;

use super::{PASS, USAGE};

#[derive(clap::Args)]
pub struct Args {
    /// A directory written by `plateau run` (verdict.json and samples.jsonl; growth.json,
    /// residues.json and mappings.json where the run wrote them).
    run_dir: PathBuf,
}

pub fn main(a: Args) -> u8 {
    match plateau_soak::explain::explain(&a.run_dir) {
        Ok(story) => {
            print!("{story}");
            PASS
        }
        Err(e) => {
            eprintln!("plateau: {e}");
            USAGE
        }
    }
}
