//! The event trace: every message, step, outcome and fault of a run, as one text line each, folded
//! into a 64-bit FNV-1a hash. Two runs of one seed must give the same hash; `replay` keeps the lines.

use std::fmt::Write;

pub struct Trace {
    hash: u64,
    events: u64,
    line: String,
    kept: Option<Vec<String>>,
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0100_0000_01b3;

impl Trace {
    /// A trace that only hashes (`keep` false) or also keeps every line.
    pub fn new(keep: bool) -> Self {
        Trace { hash: FNV_OFFSET, events: 0, line: String::new(), kept: keep.then(Vec::new) }
    }

    pub fn event(&mut self, t_ms: u64, node: &str, what: std::fmt::Arguments) {
        self.line.clear();
        // Seconds with three decimals, right-aligned in 9 columns: the text `{:>9.3}` makes of
        // `t_ms / 1000.0` (every hash so far was made that way), written from the integers.
        let _ = write!(self.line, "{:>5}.{:03} {node:<9} {what}", t_ms / 1000, t_ms % 1000);
        for b in self.line.bytes().chain([b'\n']) {
            self.hash = (self.hash ^ u64::from(b)).wrapping_mul(FNV_PRIME);
        }
        self.events += 1;
        if let Some(k) = &mut self.kept {
            k.push(self.line.clone());
        }
    }

    pub fn hash(&self) -> u64 {
        self.hash
    }

    pub fn events(&self) -> u64 {
        self.events
    }

    pub fn take_lines(&mut self) -> Vec<String> {
        self.kept.take().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_sees_every_byte_and_the_order() {
        let run = |a: &str, b: &str| {
            let mut t = Trace::new(false);
            t.event(1, "n", format_args!("{a}"));
            t.event(2, "n", format_args!("{b}"));
            t.hash()
        };
        assert_eq!(run("x", "y"), run("x", "y"));
        assert_ne!(run("x", "y"), run("y", "x"));
        assert_ne!(run("x", "y"), run("x", "z"));
    }

    #[test]
    fn times_read_as_seconds_with_three_decimals() {
        for t_ms in [0, 1, 999, 1000, 1234, 99_999, 99_999_999, 123_456_789, 1 << 40] {
            let mut t = Trace::new(true);
            t.event(t_ms, "n", format_args!("x"));
            assert_eq!(t.take_lines()[0], format!("{:>9.3} n         x", t_ms as f64 / 1000.0), "{t_ms}");
        }
    }
}
