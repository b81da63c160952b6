//! `plateau list`: the shipped scenarios, the leak injections and the plants, a line each.

use plateau_engine::{Injection, Plant};
use plateau_soak::scenario::{Scenario, SHIPPED};

use super::PASS;

pub fn main() -> u8 {
    println!("scenarios:");
    for (name, text) in SHIPPED {
        let d = Scenario::parse(text, name).map(|s| s.description).unwrap_or_else(|e| e.to_string());
        println!("  {name:<28} {d}");
    }
    println!("injections:");
    for i in Injection::ALL {
        println!("  {:<28} {}", i.name(), i.description());
    }
    println!("plants (must-pass caches, --plant NAME):");
    for p in Plant::ALL {
        println!("  {:<28} {}", p.name(), p.description());
    }
    PASS
}
