//! The labelled corpus: synthetic samples files of known leak and clean shapes, written by this
//! generator into `soak/detector/corpus/` and checked by `soak/detector/tests/corpus.rs`, which runs the detector
//! over every file and fails below 100% recall or above zero false alarms.
//!
//! Every file holds the same base metrics, with the noise the engine's real series show (the
//! settled heap wanders by a few hundred bytes with rare blips of a transient object; page-level
//! gauges flip by a page now and then; counts are exact), and one shape added to one metric:
//! - leaks (must fail, on the shape's metric): linear at 10x, 3x and 1x this series' own
//!   resolution (the smallest rate the detector resolved in the clean version of this series
//!   when the figures were frozen: `FROZEN_RESOLUTION`, never the detector under test);
//!   a staircase; a late onset; square-root growth; a rising sawtooth; 2 KiB an iteration under
//!   3 MiB teeth (a cache cleared every 30 iterations); anonymous memory outside the
//!   heap; shared memory; file mappings; descriptors; threads; iterations of 10 seconds (a
//!   verdict must not depend on the machine's speed); and fixed sizes that owe nothing to the
//!   detector's resolution: 64 B and 256 B an iteration, 1 MiB kept at every quarter of the run,
//!   a set of ids never drained (steps at doubling intervals), two such sets in one process, a rise that slows to a persistent
//!   200 B an iteration;
//! - clean shapes (must pass): settled flat with blips, a warm-up ramp, a cache that fills by 30%
//!   and by 60% of the run, a one-off step, a late step at 80%, periodic bursts, a sawtooth, a
//!   wandering mean-reverting level, GPU memory through sleep and wake cycles, code pages
//!   faulted in within file mappings that never change, a scratch buffer grown twice to the peak
//!   batch (in one engine, and in two), a full cache that churns at its bound, and the allocator's bookkeeping over such a
//!   cache converging as the churn goes on (bookkeeping that grows by a steady 256 B an iteration
//!   instead must fail).
//!
//! Each at 60, 200 and 500 iterations with three noise seeds, one file per length
//! (`soak/detector/corpus/n200.csv`: a column per case). Everything is deterministic from the seed, so the
//! files in the repository can be checked against this generator; `--example corpus --jsonl DIR`
//! also writes each case as a samples file for `plateau analyze`.

use std::collections::BTreeMap;
use std::fmt::Write;

use plateau_reports::{Header, Kind, MetricSpec, Samples, SAMPLES_SCHEMA};
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

use crate::verdict::analyze;
use crate::{DetectorConfig, Tolerance};

pub const LENGTHS: [u64; 3] = [60, 200, 500];
pub const SEEDS: [u64; 3] = [1, 2, 3];

const KIB: f64 = 1024.0;
const MIB: f64 = 1024.0 * 1024.0;
const PAGE: f64 = 4096.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Label {
    Leak,
    Clean,
}

impl Label {
    pub fn as_str(self) -> &'static str {
        match self {
            Label::Leak => "leak",
            Label::Clean => "clean",
        }
    }
}

/// One corpus series: one metric of one synthetic run.
pub struct Case {
    /// `leak/linear-3x/s1`: label, shape, noise seed.
    pub name: String,
    pub label: Label,
    /// The metric the series is of (a leak must fail on it).
    pub metric: &'static str,
    pub n: u64,
    /// Seconds per iteration.
    pub dt: f64,
    pub values: Vec<f64>,
    /// Gauges written beside the series, each a function of (iteration, run length): the file
    /// mappings around resident file pages, the live heap under the allocator's bookkeeping.
    pub beside: Vec<Beside>,
}

/// A gauge written beside a case's series: its name and its value at (iteration, run length).
pub type Beside = (&'static str, fn(f64, f64) -> f64);

impl Case {
    /// The series as a samples file would hold it: one gauge with its unit and quantum, a
    /// quiescent sample per iteration, the corpus's warm-up in the header.
    pub fn samples(&self) -> Samples {
        let (unit, quantum) = BASE.iter().find(|b| b.0 == self.metric).map_or(("bytes", PAGE), |b| (b.1, b.2));
        let mut metrics = BTreeMap::new();
        metrics.insert(
            self.metric.to_string(),
            MetricSpec { quantum: Some(quantum), ..MetricSpec::new(Kind::Gauge, unit) },
        );
        for (name, _) in &self.beside {
            let (unit, quantum) = BASE.iter().find(|b| b.0 == *name).map_or(("bytes", PAGE), |b| (b.1, b.2));
            metrics
                .insert(name.to_string(), MetricSpec { quantum: Some(quantum), ..MetricSpec::new(Kind::Gauge, unit) });
        }
        // Relations as plateau's own writer declares them: the file mappings around resident file
        // pages, the live heap under the allocator's bookkeeping.
        plateau_reports::relations::declare_v1(&mut metrics);
        let names: Vec<String> = metrics.keys().cloned().collect();
        let rows = self
            .values
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let values =
                    names.iter().map(|n| Some(if n == self.metric { *v } else { self.beside_at(n, i) })).collect();
                plateau_reports::Row::new(self.dt * (i + 1) as f64, i as u64 + 1, true, values)
            })
            .collect();
        let header = Header {
            schema: SAMPLES_SCHEMA.into(),
            scenario: format!("corpus-{}", self.name.replace('/', "-")),
            seed: 0,
            backend: "synthetic".into(),
            metrics,
            warmup_iterations: Some(warmup(self.n)),
            ..Header::default()
        };
        Samples::in_memory(header, rows)
    }

    /// The value of the gauge `name` written beside the series at its `i`-th point (0-based).
    fn beside_at(&self, name: &str, i: usize) -> f64 {
        self.beside.iter().find(|b| b.0 == name).map_or(0.0, |b| (b.1)((i + 1) as f64, self.n as f64))
    }

    /// The samples file (samples.jsonl v1) of the series, for `plateau analyze`.
    pub fn jsonl(&self) -> String {
        let s = self.samples();
        let mut out = serde_json::to_string(&s.header).expect("a header serializes");
        out.push('\n');
        for (i, (r, v)) in s.rows.iter().zip(&self.values).enumerate() {
            let bound: String = self.beside.iter().map(|(b, _)| format!(",\"{b}\":{}", self.beside_at(b, i))).collect();
            let _ = writeln!(
                out,
                "{{\"t\":{},\"iter\":{},\"quiescent\":true,\"values\":{{\"{}\":{v}{bound}}}}}",
                r.t, r.iter, self.metric
            );
        }
        out
    }
}

/// The corpus file of one length: a header row naming each case as `name:metric:dt`, then one row
/// per iteration with every case's value.
pub fn csv(cases: &[Case], n: u64) -> String {
    let cs: Vec<&Case> = cases.iter().filter(|c| c.n == n).collect();
    let mut out = String::from("iter");
    for c in &cs {
        let _ = write!(out, ",{}:{}:{}", c.name, c.metric, c.dt);
    }
    out.push('\n');
    for i in 0..n as usize {
        let _ = write!(out, "{}", i + 1);
        for c in &cs {
            let _ = write!(out, ",{}", c.values[i]);
        }
        out.push('\n');
    }
    out
}

/// The base metrics: name, unit, quantum.
const BASE: [(&str, &str, f64); 9] = [
    ("jemalloc.allocated", "bytes", 1.0),
    ("jemalloc.metadata", "bytes", 1.0),
    ("proc.rss_file", "bytes", PAGE),
    ("proc.rss_anon", "bytes", PAGE),
    ("proc.anon_outside_heap", "bytes", PAGE),
    ("proc.rss_shmem", "bytes", PAGE),
    ("proc.file_mappings", "count", 1.0),
    ("proc.fds", "count", 1.0),
    ("proc.threads", "count", 1.0),
];

/// A gauge only the GPU shape has (device memory, bytes, page quantum).
const GPU: &str = "gpu.driver_used_bytes";

/// Uniform in [0, 1).
fn unit(rng: &mut ChaCha8Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// Standard normal (Box–Muller).
fn normal(rng: &mut ChaCha8Rng) -> f64 {
    let (u, v) = (unit(rng).max(1e-12), unit(rng));
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

/// Base series of `n` points (iterations 1..=n) with the engine's noise, by metric.
fn base(n: u64, seed: u64) -> BTreeMap<&'static str, Vec<f64>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out = BTreeMap::new();
    // The settled heap: a level that wanders by a few hundred bytes around its mean (which size
    // classes the last iteration's requests left partly filled), on an 8-byte grid, and a
    // transient 12 KiB object alive at 2% of the samples.
    let mut ar = 0.0;
    let heap: Vec<f64> = (0..n)
        .map(|_| {
            ar = 0.5 * ar + 350.0 * normal(&mut rng);
            let blip = if unit(&mut rng) < 0.02 { 12.0 * KIB } else { 0.0 };
            (48.0 * MIB + ar + blip).div_euclid(8.0) * 8.0
        })
        .collect();
    out.insert("jemalloc.allocated", heap);
    // Page-level gauges: flat, with a page that comes and goes for a sample or two (1%).
    for (name, level) in
        [("proc.rss_anon", 60.0 * MIB), ("proc.anon_outside_heap", -2.0 * MIB), ("proc.rss_shmem", 0.0)]
    {
        let mut left = 0;
        let v: Vec<f64> = (0..n)
            .map(|_| {
                if left == 0 && unit(&mut rng) < 0.01 {
                    left = 1 + (rng.next_u64() % 2);
                }
                if left > 0 {
                    left -= 1;
                    level + PAGE
                } else {
                    level
                }
            })
            .collect();
        out.insert(name, v);
    }
    for (name, level) in
        [("proc.file_mappings", 24.0), ("proc.fds", 11.0), ("proc.threads", 2.0), ("proc.rss_file", 9.0 * MIB)]
    {
        out.insert(name, vec![level; n as usize]);
    }
    out
}

/// Warm-up the corpus files declare: the soak's 20, or a fifth of a shorter run.
fn warmup(n: u64) -> u64 {
    20.min(n / 5)
}

/// The resolution of the clean heap series of each length and noise seed (B per iteration), as
/// the detector quoted it on 2026-12-05 (`resolution` of the flat case, resolution margin 1.2).
/// The 1x, 3x and 10x leaks are built from these figures, frozen, and never from the detector
/// being tested: a detector that lost power would otherwise build itself weaker leaks to find.
const FROZEN_RESOLUTION: [(u64, u64, f64); 9] = [
    (60, 1, 25.05),
    (60, 2, 78.89),
    (60, 3, 42.89),
    (200, 1, 1.94),
    (200, 2, 22.66),
    (200, 3, 11.33),
    (500, 1, 1.79),
    (500, 2, 2.14),
    (500, 3, 1.68),
];

/// The frozen resolution of the clean heap series of length `n` and noise `seed`.
fn frozen_resolution(n: u64, seed: u64) -> f64 {
    FROZEN_RESOLUTION.iter().find(|(a, b, _)| *a == n && *b == seed).map_or(64.0, |r| r.2)
}

/// The detector's resolution for a clean series (per iteration), with the default configuration
/// and no request counter (so no tolerance).
pub fn resolution(c: &Case) -> f64 {
    let s = c.samples();
    let cfg = DetectorConfig { warmup_iterations: warmup(c.n), tolerance: Tolerance::default(), ..Default::default() };
    analyze(&s, &cfg, None, None).metrics[0].trend.as_ref().and_then(|t| t.resolution_per_iter).unwrap_or(64.0)
}

/// A shape: its label, the metric it changes, and what it adds at iteration `i` (1-based) of `n`.
struct Shape {
    name: &'static str,
    label: Label,
    metric: &'static str,
    dt: f64,
    add: fn(f64, f64, &mut ChaCha8Rng) -> f64,
    /// Gauges written beside the series.
    beside: Vec<Beside>,
    /// Shortest run the shape is part of (a rate below what a shorter run resolves).
    min_n: u64,
}

/// The file mappings around `proc.rss_file` in the page-in shape: 24 mappings, 20 MiB.
const FILE_BYTES: Beside = ("proc.file_bytes", |_, _| 20.0 * MIB);

/// The live heap under the bookkeeping shapes: 16 MiB, and a 64 MiB cache full by 30% of the run.
const CHURNING_HEAP: Beside = ("jemalloc.allocated", |i, n| 16.0 * MIB + 64.0 * MIB * (i / (0.3 * n)).min(1.0));

/// jemalloc's bookkeeping over that heap: 3 MiB, a megabyte more as the cache fills, then (after
/// the fill) the logarithm of the churn the measured cache-churn runs showed, on a 16-byte grid.
fn churn_bookkeeping(i: f64, n: f64) -> f64 {
    let after = (i - 0.3 * n).max(0.0);
    (3.0 * MIB + MIB * (i / (0.3 * n)).min(1.0) + 16.0 * KIB * (1.0 + after / 10.0).ln()).div_euclid(16.0) * 16.0
}

/// Bytes a hash set of u64 ids holds with `entries` in it: 9 bytes a bucket (8 and a control
/// byte), doubling when 7/8 full, as Rust's `HashSet` and most open-addressing tables do.
fn id_table_bytes(entries: f64) -> f64 {
    let mut buckets = 64.0;
    while entries > buckets * 7.0 / 8.0 {
        buckets *= 2.0;
    }
    9.0 * buckets
}

fn shapes() -> Vec<Shape> {
    use Label::{Clean, Leak};
    let s = |name, label, metric, add: fn(f64, f64, &mut ChaCha8Rng) -> f64| Shape {
        name,
        label,
        metric,
        dt: 0.05,
        add,
        beside: Vec::new(),
        min_n: 0,
    };
    vec![
        // Leaks.
        s("staircase", Leak, "jemalloc.allocated", |i, _, _| 64.0 * KIB * (i / 10.0).floor()),
        s("late-onset", Leak, "jemalloc.allocated", |i, n, _| 2.0 * KIB * (i - n / 2.0).max(0.0)),
        s("sqrt", Leak, "jemalloc.allocated", |i, _, _| 64.0 * KIB * i.sqrt()),
        s("rising-sawtooth", Leak, "jemalloc.allocated", |i, _, _| 512.0 * KIB * (i % 10.0) / 10.0 + 8.0 * KIB * i),
        // A cache of 3 MiB refilled and cleared every 30 iterations over 2 KiB kept an iteration:
        // the teeth dwarf the leak, which only the floors show (six of them from 200 on).
        Shape {
            min_n: 200,
            ..s("leak-under-teeth", Leak, "jemalloc.allocated", |i, _, _| 3.0 * MIB * (i % 30.0) / 30.0 + 2.0 * KIB * i)
        },
        s("outside-heap", Leak, "proc.anon_outside_heap", |i, _, _| PAGE * (i / 2.0).floor()),
        s("shared-memory", Leak, "proc.rss_shmem", |i, _, _| 64.0 * KIB * i),
        s("file-mappings", Leak, "proc.file_mappings", |i, _, _| (i / 5.0).floor()),
        s("fds", Leak, "proc.fds", |i, _, _| (i / 8.0).floor()),
        s("threads", Leak, "proc.threads", |i, _, _| (i / 10.0).floor()),
        // Leaks of fixed sizes, whatever the detector resolves: 64 B an iteration; 1 MiB kept
        // at every quarter of the run (equal steps); a set of ids that is never drained, 20 an
        // iteration (steps at doubling intervals); 4 KiB an iteration slowing to a persistent
        // 200 B from 55% of the run.
        // 64 B an iteration is below what 48 judged points resolve over this noise: from 200 on.
        Shape { min_n: 200, ..s("fixed-64B", Leak, "jemalloc.allocated", |i, _, _| 64.0 * i) },
        s("fixed-256B", Leak, "jemalloc.allocated", |i, _, _| 256.0 * i),
        s("chunks", Leak, "jemalloc.allocated", |i, n, _| MIB * (i / (n / 4.0)).floor()),
        s("id-set", Leak, "jemalloc.allocated", |i, _, _| id_table_bytes(20.0 * i)),
        // Two such sets in one process (a prefill and a decode engine, the second told of a few
        // fewer requests): their doublings come a few iterations apart, widening with the table.
        s("two-id-sets", Leak, "jemalloc.allocated", |i, _, _| id_table_bytes(20.0 * i) + id_table_bytes(19.0 * i)),
        s("slowing", Leak, "jemalloc.allocated", |i, n, _| {
            4.0 * KIB * i.min(0.55 * n) + 200.0 * (i - 0.55 * n).max(0.0)
        }),
        // Clean shapes.
        s("flat", Clean, "jemalloc.allocated", |_, _, _| 0.0),
        s("flat-pages", Clean, "proc.rss_anon", |_, _, _| 0.0),
        s("warmup-ramp", Clean, "jemalloc.allocated", |i, n, _| 8.0 * MIB * (i / (0.1 * n)).min(1.0)),
        s("fill30", Clean, "jemalloc.allocated", |i, n, _| 4.0 * MIB * (1.0 - (-5.0 * i / (0.3 * n)).exp())),
        s("fill60", Clean, "jemalloc.allocated", |i, n, _| 4.0 * MIB * (1.0 - (-5.0 * i / (0.6 * n)).exp())),
        s("step50", Clean, "jemalloc.allocated", |i, n, _| if i >= n / 2.0 { 24.0 * MIB } else { 0.0 }),
        s("step80", Clean, "jemalloc.allocated", |i, n, _| if i >= 0.8 * n { 8.0 * MIB } else { 0.0 }),
        s("bursts", Clean, "jemalloc.allocated", |i, _, _| if i % 20.0 == 0.0 { 2.0 * MIB } else { 0.0 }),
        s("sawtooth", Clean, "jemalloc.allocated", |i, _, _| MIB * (i % 25.0) / 25.0),
        s("wander", Clean, "jemalloc.allocated", |_, _, rng| 16.0 * KIB * normal(rng)),
        s("sleep-wake", Clean, GPU, |i, _, _| if i % 10.0 == 3.0 { 0.25 * 1024.0 * MIB } else { 2.0 * 1024.0 * MIB }),
        // Code pages faulted in (64 KiB of fault-around) as rarer paths run, inside file
        // mappings that never change.
        Shape {
            beside: vec![FILE_BYTES],
            ..s("pagein", Clean, "proc.rss_file", |i, n, _| {
                64.0 * KIB * (f64::from(u8::from(i >= 0.2 * n)) + f64::from(u8::from(i >= 0.35 * n)))
                    + 12.0 * KIB * f64::from(u8::from(i >= 0.6 * n))
            })
        },
        // A scratch buffer grown to the peak batch twice, soon after warm-up, then kept.
        s("peak-buffer", Clean, "jemalloc.allocated", |i, n, _| {
            let w = 20.0f64.min((n / 5.0).floor());
            256.0 * KIB * (f64::from(u8::from(i >= w + 3.0)) + f64::from(u8::from(i >= w + 11.0)))
        }),
        // The same buffer in two engines of one process, each grown twice a few iterations
        // apart from the other's.
        s("two-peak-buffers", Clean, "jemalloc.allocated", |i, n, _| {
            let w = 20.0f64.min((n / 5.0).floor());
            let grown = |at: f64| 256.0 * KIB * f64::from(u8::from(i >= at));
            grown(w + 3.0) + grown(w + 5.0) + grown(w + 11.0) + grown(w + 13.0)
        }),
        // A 64 MiB cache full by 30% of the run that then replaces entries of other sizes: the
        // live heap moves by up to 48 KiB from one iteration to the next around its bound.
        s("cache-churn", Clean, "jemalloc.allocated", |i, n, rng| {
            64.0 * MIB * (i / (0.3 * n)).min(1.0) + if i >= 0.3 * n { 48.0 * KIB * (unit(rng) - 0.5) } else { 0.0 }
        }),
        // The allocator's bookkeeping over that cache's heap: converging after the fill (clean),
        // and growing by a steady 256 B an iteration after it instead (a leak: bookkeeping kept
        // for every few requests, whatever the heap does).
        Shape {
            beside: vec![CHURNING_HEAP],
            ..s("bookkeeping-churn", Clean, "jemalloc.metadata", |i, n, _| churn_bookkeeping(i, n))
        },
        Shape {
            beside: vec![CHURNING_HEAP],
            ..s("bookkeeping-leak", Leak, "jemalloc.metadata", |i, n, _| {
                churn_bookkeeping(i.min(0.3 * n), n) + 256.0 * (i - 0.3 * n).max(0.0)
            })
        },
    ]
}

/// Every corpus case, in a fixed order: by length, seed, then shape.
pub fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    for n in LENGTHS {
        for seed in SEEDS {
            let clean = base(n, seed);
            let heap = "jemalloc.allocated";
            let r1 = frozen_resolution(n, seed);
            for (k, dt) in [(10.0, 0.05), (3.0, 0.05), (1.0, 0.05), (3.0, 10.0)] {
                let values = clean[heap]
                    .iter()
                    .enumerate()
                    .map(|(i, v)| v + (k * r1 * (i + 1) as f64 / 8.0).round() * 8.0)
                    .collect();
                let shape = if dt > 1.0 { format!("slow-iterations-{k}x") } else { format!("linear-{k}x") };
                out.push(Case {
                    name: format!("leak/{shape}/s{seed}"),
                    label: Label::Leak,
                    metric: heap,
                    n,
                    dt,
                    values,
                    beside: Vec::new(),
                });
            }
            for shape in shapes().into_iter().filter(|s| n >= s.min_n) {
                let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
                let mut values = clean.get(shape.metric).cloned().unwrap_or_else(|| vec![0.0; n as usize]);
                let nf = n as f64;
                if shape.name == "wander" {
                    // A mean-reverting level: AR(1) with coefficient 0.95.
                    let mut level = 0.0;
                    for v in values.iter_mut() {
                        level = 0.95 * level + (shape.add)(0.0, nf, &mut rng);
                        *v += (level / 8.0).round() * 8.0;
                    }
                } else {
                    for (i, v) in values.iter_mut().enumerate() {
                        *v += (shape.add)((i + 1) as f64, nf, &mut rng);
                    }
                }
                out.push(Case {
                    name: format!("{}/{}/s{seed}", shape.label.as_str(), shape.name),
                    label: shape.label,
                    metric: shape.metric,
                    n,
                    dt: shape.dt,
                    values,
                    beside: shape.beside.clone(),
                });
            }
        }
    }
    out
}
