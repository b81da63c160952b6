//! `plateau serve`: plateau's engine over an OpenAI-compatible HTTP API.

use plateau_engine::Injection;
use plateau_soak::scenario::Scenario;

use super::{run_error_code, PASS, USAGE};

#[derive(clap::Args)]
pub struct Args {
    /// The scenario whose [engine] section configures the engine (a .toml file or a shipped
    /// name; default n-sampling: the tiny preset on the cpu backend).
    #[arg(default_value = "n-sampling")]
    scenario: String,
    /// A model preset instead of the scenario's (see `plateau list`).
    #[arg(long)]
    preset: Option<String>,
    /// Port to listen on (0 picks a free one; the address is printed).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// cpu, cuda or auto (default: the scenario's).
    #[arg(long)]
    backend: Option<String>,
    /// Engine seed (requests without a seed draw from it).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Switch on a leak injection in the served engine (repeatable; see `plateau list`).
    #[arg(long = "inject", value_name = "NAME")]
    inject: Vec<Injection>,
}

pub fn main(a: Args) -> u8 {
    let Args { scenario, preset, port, host, backend, seed, inject } = a;
    let (mut s, _) = match Scenario::load(&scenario) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("plateau: {e}");
            return USAGE;
        }
    };
    if let Some(p) = preset {
        if let Err(e) = plateau_engine::ModelConfig::preset(&p) {
            eprintln!("plateau: --preset: {e}");
            return USAGE;
        }
        s.engine.preset = p;
    }
    let opts =
        plateau_soak::serve::ServeOptions { backend, seed, injections: inject.into_iter().collect(), host, port };
    match plateau_soak::serve::serve(&s, &opts) {
        Ok(()) => PASS,
        Err(e) => run_error_code(e),
    }
}
