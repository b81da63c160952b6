//! A sweep spread over machines: shard I of N runs the seeds k of the range with k mod N = I, and
//! writes its result as a shard record (`sweep --out FILE`, JSON). `plateau-sim merge` joins the
//! records of one sweep into one summary after checking that they are shards of the same sweep
//! and that together they cover every seed of the range exactly once: a missing shard would
//! otherwise read as seeds that passed.

use std::path::Path;

use serde::{Deserialize, Serialize};

pub const SHARD_SCHEMA: &str = "plateau.sim.shard.v1";

/// The seeds of `range` that shard `(index, count)` runs.
pub fn shard_seeds(range: std::ops::Range<u64>, shard: Option<(u64, u64)>) -> impl Iterator<Item = u64> {
    range.filter(move |s| shard.is_none_or(|(i, n)| s % n == i))
}

/// What makes two shard records parts of the same sweep.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SweepIdentity {
    pub seeds_start: u64,
    pub seeds_end: u64,
    /// N of `--shard I/N`; 1 for an unsharded sweep.
    pub shard_count: u64,
    /// The run arguments as a replay command line takes them (`--scenario mixed --faults heavy`).
    pub run_args: String,
}

/// A seed that failed, with what its replay prints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailedSeed {
    pub seed: u64,
    pub line: String,
}

/// One shard's result (`sweep --out`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardRecord {
    pub schema: String,
    pub sweep: SweepIdentity,
    /// I of `--shard I/N`; 0 for an unsharded sweep.
    pub shard_index: u64,
    pub seeds_run: u64,
    pub failed: Vec<FailedSeed>,
    pub requests: u64,
    pub sim_ms: u64,
    pub wall_s: f64,
}

/// Shards joined.
#[derive(Debug, Clone, PartialEq)]
pub struct Merged {
    pub sweep: SweepIdentity,
    pub shards: u64,
    pub seeds_run: u64,
    pub failed: Vec<FailedSeed>,
    pub requests: u64,
    pub sim_ms: u64,
    /// The slowest shard's wall time: the sweep's, when shards run side by side.
    pub wall_s: f64,
}

impl Merged {
    pub fn replay(&self, seed: u64) -> String {
        let args = if self.sweep.run_args.is_empty() { String::new() } else { format!(" {}", self.sweep.run_args) };
        format!("plateau-sim replay --seed {seed}{args}")
    }

    /// The summary, then one line per failing seed with its replay command.
    pub fn text(&self) -> String {
        let mut out = format!(
            "merged {} shards of sweep {}..{}{}: {} seeds, {} failed; {} requests, {:.1} s simulated, slowest shard {:.1} s wall\n",
            self.shards,
            self.sweep.seeds_start,
            self.sweep.seeds_end,
            if self.sweep.run_args.is_empty() { String::new() } else { format!(" ({})", self.sweep.run_args) },
            self.seeds_run,
            self.failed.len(),
            self.requests,
            self.sim_ms as f64 / 1000.0,
            self.wall_s
        );
        for f in &self.failed {
            out.push_str(&format!("{}\n  replay: {}\n", f.line, self.replay(f.seed)));
        }
        out
    }

    /// GitHub job-summary markdown of the same.
    pub fn markdown(&self) -> String {
        let mut out = format!(
            "## plateau-sim: {} seeds over {} shards, {} failed\n\n",
            self.seeds_run,
            self.shards,
            self.failed.len()
        );
        if !self.failed.is_empty() {
            out.push_str("| seed | what failed | replay |\n|---|---|---|\n");
            for f in &self.failed {
                out.push_str(&format!("| {} | {} | `{}` |\n", f.seed, f.line.replace('|', "\\|"), self.replay(f.seed)));
            }
        }
        out
    }
}

/// Reads a shard record; errors name the file (and line).
pub fn read(path: &Path) -> Result<ShardRecord, String> {
    let text = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let r: ShardRecord =
        serde_json::from_slice(&text).map_err(|e| format!("{}: line {}: {e}", path.display(), e.line()))?;
    if r.schema != SHARD_SCHEMA {
        return Err(format!("{}: schema `{}` is not a shard record ({SHARD_SCHEMA})", path.display(), r.schema));
    }
    Ok(r)
}

/// Joins the shards of one sweep: every shard of 0..N exactly once, all of the same sweep.
pub fn merge(records: &[(String, ShardRecord)]) -> Result<Merged, String> {
    let (first_name, first) = records.first().ok_or("no shard records given")?;
    let n = first.sweep.shard_count;
    let mut seen: Vec<Option<&str>> = vec![None; n as usize];
    for (name, r) in records {
        if r.sweep != first.sweep {
            return Err(format!(
                "{name}: a shard of another sweep ({}..{}, {} shards, `{}`) than {first_name} ({}..{}, {} shards, `{}`)",
                r.sweep.seeds_start,
                r.sweep.seeds_end,
                r.sweep.shard_count,
                r.sweep.run_args,
                first.sweep.seeds_start,
                first.sweep.seeds_end,
                n,
                first.sweep.run_args
            ));
        }
        let Some(slot) = seen.get_mut(r.shard_index as usize) else {
            return Err(format!("{name}: shard {} of {n} does not exist", r.shard_index));
        };
        if let Some(other) = slot {
            return Err(format!("{name}: shard {} of {n} is also {other}", r.shard_index));
        }
        *slot = Some(name);
        let expected = shard_seeds(r.sweep.seeds_start..r.sweep.seeds_end, Some((r.shard_index, n))).count() as u64;
        if r.seeds_run != expected {
            return Err(format!(
                "{name}: ran {} seeds where shard {}/{n} has {expected} (an interrupted shard?)",
                r.seeds_run, r.shard_index
            ));
        }
    }
    let missing: Vec<String> =
        seen.iter().enumerate().filter(|(_, s)| s.is_none()).map(|(i, _)| format!("{i}/{n}")).collect();
    if !missing.is_empty() {
        return Err(format!("shards missing: {} (their seeds would read as passed)", missing.join(", ")));
    }
    let mut failed: Vec<FailedSeed> = records.iter().flat_map(|(_, r)| r.failed.iter().cloned()).collect();
    failed.sort_by_key(|f| f.seed);
    Ok(Merged {
        sweep: first.sweep.clone(),
        shards: n,
        seeds_run: records.iter().map(|(_, r)| r.seeds_run).sum(),
        failed,
        requests: records.iter().map(|(_, r)| r.requests).sum(),
        sim_ms: records.iter().map(|(_, r)| r.sim_ms).sum(),
        wall_s: records.iter().map(|(_, r)| r.wall_s).fold(0.0, f64::max),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// N shards of a range run every seed of it exactly once.
        #[test]
        fn shards_cover_every_seed_exactly_once(start in 0u64..10_000, len in 1u64..2_000, n in 1u64..64) {
            let mut hits = vec![0u32; len as usize];
            for i in 0..n {
                for s in shard_seeds(start..start + len, Some((i, n))) {
                    hits[(s - start) as usize] += 1;
                }
            }
            prop_assert!(hits.iter().all(|&h| h == 1));
        }
    }

    fn record(i: u64, n: u64, failed: &[u64]) -> (String, ShardRecord) {
        let sweep = SweepIdentity { seeds_start: 0, seeds_end: 10, shard_count: n, run_args: "--faults heavy".into() };
        let seeds_run = shard_seeds(0..10, Some((i, n))).count() as u64;
        let failed = failed.iter().map(|&seed| FailedSeed { seed, line: format!("seed {seed}: FAIL x") }).collect();
        let r = ShardRecord {
            schema: SHARD_SCHEMA.into(),
            sweep,
            shard_index: i,
            seeds_run,
            failed,
            requests: 5,
            sim_ms: 100,
            wall_s: i as f64,
        };
        (format!("shard-{i}.json"), r)
    }

    #[test]
    fn merge_joins_complete_sweeps_and_refuses_gaps_doubles_and_strangers() {
        let m = merge(&[record(1, 3, &[7]), record(0, 3, &[3]), record(2, 3, &[])]).unwrap();
        assert_eq!((m.seeds_run, m.shards, m.requests, m.wall_s), (10, 3, 15, 2.0));
        assert_eq!(m.failed.iter().map(|f| f.seed).collect::<Vec<_>>(), vec![3, 7]);
        assert!(m.text().contains("replay: plateau-sim replay --seed 3 --faults heavy"), "{}", m.text());
        let e = merge(&[record(0, 3, &[]), record(2, 3, &[])]).unwrap_err();
        assert!(e.contains("shards missing: 1/3"), "{e}");
        let e = merge(&[record(0, 2, &[]), record(0, 2, &[]), record(1, 2, &[])]).unwrap_err();
        assert!(e.contains("also shard-0.json"), "{e}");
        let e = merge(&[record(0, 2, &[]), record(1, 3, &[])]).unwrap_err();
        assert!(e.contains("another sweep"), "{e}");
        let mut short = record(1, 2, &[]);
        short.1.seeds_run -= 1;
        assert!(merge(&[record(0, 2, &[]), short]).unwrap_err().contains("interrupted"));
    }
}
