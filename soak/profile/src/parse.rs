//! jemalloc's heap profile (heap_v2 text): one `@ ADDR...` line per allocation stack (return
//! addresses, innermost first), followed by the live objects and bytes it holds (`t*: OBJS:
//! BYTES [...]`, already unbiased by jemalloc for its sampling), then the process's mappings
//! (`MAPPED_LIBRARIES:`).

use std::collections::BTreeMap;

/// Live objects and bytes by allocation stack (innermost frame first).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HeapProfile {
    pub stacks: BTreeMap<Vec<u64>, (i64, i64)>,
    /// The `MAPPED_LIBRARIES:` section (a copy of /proc/<pid>/maps), for load addresses.
    pub maps: String,
}

impl HeapProfile {
    pub fn parse(text: &str) -> Result<HeapProfile, String> {
        let mut p = HeapProfile::default();
        let mut lines = text.lines().enumerate().peekable();
        match lines.next() {
            Some((_, l)) if l.starts_with("heap_v2/") => {}
            other => return Err(format!("line 1: not a heap_v2 profile: {:?}", other.map(|x| x.1))),
        }
        while let Some((n, line)) = lines.next() {
            if line.starts_with("MAPPED_LIBRARIES:") {
                p.maps = lines.map(|(_, l)| l).collect::<Vec<_>>().join("\n");
                break;
            }
            let Some(addrs) = line.strip_prefix("@ ") else { continue };
            let stack = addrs
                .split_whitespace()
                .map(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16))
                .collect::<Result<Vec<u64>, _>>()
                .map_err(|e| format!("line {}: address: {e}", n + 1))?;
            let Some((m, counts)) = lines.next() else { return Err(format!("line {}: stack without counts", n + 1)) };
            let (objs, bytes) = counts
                .trim()
                .strip_prefix("t*:")
                .and_then(|c| {
                    let mut it = c.split([':', '[']).map(str::trim);
                    Some((it.next()?.parse::<i64>().ok()?, it.next()?.parse::<i64>().ok()?))
                })
                .ok_or_else(|| format!("line {}: expected `t*: objects: bytes`", m + 1))?;
            let e = p.stacks.entry(stack).or_default();
            e.0 += objs;
            e.1 += bytes;
        }
        Ok(p)
    }

    /// What `later` holds beyond `self`, by stack: objects and bytes gained (negative for lost).
    pub fn diff(&self, later: &HeapProfile) -> BTreeMap<Vec<u64>, (i64, i64)> {
        let mut out: BTreeMap<Vec<u64>, (i64, i64)> = later.stacks.clone();
        for (k, (o, b)) in &self.stacks {
            let e = out.entry(k.clone()).or_default();
            e.0 -= o;
            e.1 -= b;
        }
        out.retain(|_, v| *v != (0, 0));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DUMP: &str = "heap_v2/1\n  t*: 3: 300 [0: 0]\n  t0: 3: 300 [0: 0]\n@ 0x10 0x20\n  t*: 2: 200 [0: 0]\n  t0: 2: 200 [0: 0]\n@ 0x30\n  t*: 1: 100 [0: 0]\n\nMAPPED_LIBRARIES:\n55d0-55e0 r--p 00000000 00:00 1 /bin/x\n";

    #[test]
    fn stacks_counts_and_maps() {
        let p = HeapProfile::parse(DUMP).unwrap();
        assert_eq!(p.stacks[&vec![0x10, 0x20]], (2, 200));
        assert_eq!(p.stacks[&vec![0x30]], (1, 100));
        assert!(p.maps.contains("/bin/x"));
        let later = HeapProfile::parse(&DUMP.replace("t*: 2: 200", "t*: 7: 700")).unwrap();
        let d = p.diff(&later);
        assert_eq!(d.len(), 1);
        assert_eq!(d[&vec![0x10, 0x20]], (5, 500));
    }

    #[test]
    fn bad_input_names_the_line() {
        assert!(HeapProfile::parse("hello").unwrap_err().contains("line 1"));
        assert!(HeapProfile::parse("heap_v2/1\n@ 0xzz\n  t*: 1: 1\n").unwrap_err().contains("line 2"));
    }
}
