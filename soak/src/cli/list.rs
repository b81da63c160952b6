//! `plateau list`: the shipped scenarios, the leak injections and the plants, a line each.

use plateau_engine::{Injection, Plant};
use plateau_soak::scenario::{Scenario, SHIPPED};

use super::PASS;

pub fn main() -> u8 {
    plateau_shell::outln!("scenarios:");
    for (name, text) in SHIPPED {
        let d = Scenario::parse(text, name).map(|s| s.description).unwrap_or_else(|e| e.to_string());
        plateau_shell::outln!("  {name:<28} {d}");
    }
    plateau_shell::outln!("injections:");
    for i in Injection::ALL {
        plateau_shell::outln!("  {:<28} {}", i.name(), i.description());
    }
    plateau_shell::outln!("plants (must-pass caches, --plant NAME):");
    for p in Plant::ALL {
        plateau_shell::outln!("  {:<28} {}", p.name(), p.description());
    }
    PASS
}
