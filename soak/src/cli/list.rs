//! `plateau list`: the shipped scenarios and the leak injections, a line each.

use plateau_engine::Injection;
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
    PASS
}
