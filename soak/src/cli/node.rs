//! `plateau node`: one engine of a prefill/decode pair over TCP (started by `run --pd-processes`).

use plateau_engine::{Injection, Injections};
use plateau_soak::driver;
use plateau_soak::scenario::Scenario;

use super::{HARNESS, PASS, USAGE};

#[derive(clap::Args)]
pub struct Args {
    /// prefill or decode.
    #[arg(long)]
    role: String,
    /// Address to listen on, such as 127.0.0.1:0 (the bound address is printed first).
    #[arg(long)]
    listen: String,
    /// The scenario whose engine section configures this engine.
    #[arg(long)]
    scenario: String,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long = "inject", value_name = "NAME")]
    inject: Vec<Injection>,
    /// Decode role: the prefill node's address, to pull KV from.
    #[arg(long)]
    peer: Option<String>,
}

pub fn main(a: Args) -> u8 {
    let Args { role, listen, scenario, seed, inject, peer } = a;
    serve_node(&role, &listen, &scenario, seed, inject, peer)
}

/// Serves one node on `listen` until its controller's connection closes (`plateau node`, and
/// `plateau serve --role prefill|decode`).
pub fn serve_node(
    role: &str,
    listen: &str,
    scenario: &str,
    seed: u64,
    inject: Vec<Injection>,
    peer: Option<String>,
) -> u8 {
    let run = || -> Result<(), (u8, String)> {
        let role = plateau_soak::pd::node::parse_role(role).map_err(|m| (USAGE, m))?;
        // The address is the user's: one that does not parse, resolve or bind is bad input.
        let listener = std::net::TcpListener::bind(listen).map_err(|e| (USAGE, format!("--listen {listen}: {e}")))?;
        let (s, _) = Scenario::load(scenario).map_err(|e| (USAGE, e.to_string()))?;
        let pd = s.pd.clone().ok_or((USAGE, format!("{scenario}: no [pd] section")))?;
        let injections: Injections = inject.into_iter().collect();
        let leak = injections.on(Injection::PdMmapHook);
        let mut engine = driver::build_engine(&s, "cpu", injections, seed).map_err(|e| (USAGE, e.to_string()))?;
        let id = if role == plateau_engine::Role::Prefill { 1 } else { 2 };
        engine.set_role(role, id, pd.kv_transfer_timeout_ms);
        plateau_soak::pd::node::serve(engine, listener, peer, leak, pd.regions).map_err(|m| (HARNESS, m))
    };
    match run() {
        Ok(()) => PASS,
        Err((code, m)) => {
            plateau_shell::errln!("plateau node: {m}");
            code
        }
    }
}
