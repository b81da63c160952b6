//! jemalloc's heap profile (heap_v2 text): a header naming the sample period (`heap_v2/524288`),
//! one `@ ADDR...` line per allocation stack (return addresses, innermost first), followed by the
//! live objects and bytes it holds (`t*: OBJS: BYTES [...]`), then the process's mappings
//! (`MAPPED_LIBRARIES:`). The counts are what jeprof's unbiasing expects as its input: jemalloc
//! writes, for its own unbiased estimate (c, s) of a stack's live objects and bytes, the values
//! that jeprof's formula `x / (1 - exp(-(s_in / c_in) / R))` turns back into (c, s), R being the
//! sample period. [`HeapProfile::unbiased`] applies that formula; with every allocation sampled
//! (R = 1) it changes nothing.

use std::collections::BTreeMap;

/// Live objects and bytes by allocation stack (innermost frame first).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HeapProfile {
    /// The sample period in bytes (1: every allocation).
    pub sample_period: u64,
    pub stacks: BTreeMap<Vec<u64>, (i64, i64)>,
    /// The `MAPPED_LIBRARIES:` section (a copy of /proc/<pid>/maps), for load addresses.
    pub maps: String,
}

impl HeapProfile {
    pub fn parse(text: &str) -> Result<HeapProfile, String> {
        let mut p = HeapProfile::default();
        let mut lines = text.lines().enumerate().peekable();
        match lines.next() {
            Some((_, l)) if l.starts_with("heap_v2/") => {
                p.sample_period = l["heap_v2/".len()..]
                    .trim()
                    .parse::<u64>()
                    .map_err(|e| format!("line 1: sample period: {e}"))?
                    .max(1);
            }
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

    /// The live objects and bytes of each stack as estimated for the whole heap (see the
    /// module's doc).
    pub fn unbiased(&self) -> impl Iterator<Item = (&Vec<u64>, (f64, f64))> + '_ {
        let r = self.sample_period as f64;
        self.stacks.iter().filter(|(_, (o, b))| *o > 0 && *b > 0).map(move |(k, &(o, b))| {
            let (o, b) = (o as f64, b as f64);
            let scale = 1.0 / (1.0 - (-(b / o) / r).exp());
            (k, (o * scale, b * scale))
        })
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
        assert!(HeapProfile::parse("heap_v2/x\n").unwrap_err().contains("sample period"));
    }

    #[test]
    fn sampled_counts_are_unbiased_as_jeprof_would() {
        // Every allocation sampled: as written.
        let all = HeapProfile::parse(DUMP).unwrap();
        assert_eq!(all.sample_period, 1);
        let u: Vec<(f64, f64)> = all.unbiased().map(|(_, v)| v).collect();
        assert_eq!(u, vec![(2.0, 200.0), (1.0, 100.0)]);
        // One in 4 KiB: a 100-byte object stands for about 41 of them.
        let sampled = HeapProfile::parse(&DUMP.replace("heap_v2/1", "heap_v2/4096")).unwrap();
        let (o, b) = sampled.unbiased().find(|(k, _)| **k == vec![0x30]).unwrap().1;
        let scale = 1.0 / (1.0 - (-100.0f64 / 4096.0).exp());
        assert!((o - scale).abs() < 1e-9 && (b - 100.0 * scale).abs() < 1e-6, "{o} {b}");
        assert!((40.0..42.0).contains(&o));
    }
}
