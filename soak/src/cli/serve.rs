//! `plateau serve`: plateau's engine over an OpenAI-compatible HTTP API, or one role of a P/D
//! deployment of separate processes (`--role prefill|decode|proxy`).

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
    /// One role of a P/D deployment of separate processes, configured by the scenario's [pd]
    /// section: `prefill` and `decode` serve one engine each over the project's KV transport
    /// (TCP, at --host:--port; not HTTP); `proxy` serves the OpenAI API and routes each request
    /// to the prefill node for its first token, then to the decode node, which pulls its KV from
    /// the prefill node. Start prefill, then decode (--prefill ADDR), then proxy (--prefill ADDR
    /// --decode ADDR). Default: one engine behind the API.
    #[arg(long, value_parser = ["prefill", "decode", "proxy"])]
    role: Option<String>,
    /// The prefill node's address (HOST:PORT): what a decode node pulls KV from, and where a
    /// proxy sends prefills.
    #[arg(long, value_name = "HOST:PORT")]
    prefill: Option<String>,
    /// The decode node's address (HOST:PORT), for a proxy.
    #[arg(long, value_name = "HOST:PORT")]
    decode: Option<String>,
}

pub fn main(a: Args) -> u8 {
    let Args { scenario, preset, port, host, backend, seed, inject, role, prefill, decode } = a;
    let (mut s, _) = match Scenario::load(&scenario) {
        Ok(s) => s,
        Err(e) => {
            plateau_shell::errln!("plateau: {e}");
            return USAGE;
        }
    };
    if let Some(p) = preset {
        if let Err(e) = plateau_engine::ModelConfig::preset(&p) {
            plateau_shell::errln!("plateau: --preset: {e}");
            return USAGE;
        }
        s.engine.preset = p;
    }
    let nodes = match (role.as_deref(), prefill, decode) {
        (None, None, None) => None,
        (Some(r @ ("prefill" | "decode")), peer, None) => {
            if r == "prefill" && peer.is_some() {
                plateau_shell::errln!(
                    "plateau: --role prefill takes no --prefill (a decode node names its prefill node)"
                );
                return USAGE;
            }
            if r == "decode" && peer.is_none() {
                plateau_shell::errln!(
                    "plateau: --role decode needs --prefill HOST:PORT (the prefill node it pulls KV from)"
                );
                return USAGE;
            }
            if backend.as_deref().is_some_and(|b| b != "cpu") {
                plateau_shell::errln!("plateau: --role {r}: the nodes run on the cpu backend");
                return USAGE;
            }
            return super::node::serve_node(r, &format!("{host}:{port}"), &scenario, seed, inject, peer);
        }
        (Some("proxy"), Some(p), Some(d)) => Some((p, d)),
        (Some("proxy"), _, _) => {
            plateau_shell::errln!(
                "plateau: --role proxy needs --prefill HOST:PORT and --decode HOST:PORT (the nodes it routes to)"
            );
            return USAGE;
        }
        (_, _, _) => {
            plateau_shell::errln!("plateau: --prefill and --decode name the nodes of a P/D deployment: give --role decode (with --prefill) or --role proxy (with both)");
            return USAGE;
        }
    };
    let opts = plateau_soak::serve::ServeOptions {
        backend,
        seed,
        injections: inject.into_iter().collect(),
        host,
        port,
        nodes,
    };
    match plateau_soak::serve::serve(&s, &opts) {
        Ok(()) => PASS,
        Err(e) => run_error_code(e),
    }
}
