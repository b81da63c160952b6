//! The labelled corpus: synthetic samples files of known leak and clean shapes, written by this
//! generator into `soak/spec/corpus/` and checked by `soak/spec/tests/corpus.rs`, which runs the detector
//! over every file and fails below 100% recall or above zero false alarms.
//!
//! Every file holds the same base metrics, with the noise the engine's real series show (the
//! settled heap wanders by a few hundred bytes with rare blips of a transient object; page-level
//! gauges flip by a page now and then; counts are exact), and one shape added to one metric:
//! - leaks (must fail, on the shape's metric): linear at 10x, 3x and 1x this series' own
//!   resolution (the smallest rate the detector resolves in the clean version of this series);
//!   a staircase; a late onset; square-root growth; a rising sawtooth; anonymous memory outside the
//!   heap; shared memory; file mappings; descriptors; threads; and iterations of 10 seconds (a
//!   verdict must not depend on the machine's speed);
//! - clean shapes (must pass): settled flat with blips, a warm-up ramp, a cache that fills by 30%
//!   and by 60% of the run, a one-off step, a late step at 80%, periodic bursts, a sawtooth, a
//!   wandering mean-reverting level, and GPU memory through sleep and wake cycles.
//!
//! Each at 60, 200 and 500 iterations with three noise seeds, one file per length
//! (`soak/spec/corpus/n200.csv`: a column per case). Everything is deterministic from the seed, so the
//! files in the repository can be checked against this generator; `--example corpus --jsonl DIR`
//! also writes each case as a samples file for `plateau analyze`.

use std::collections::BTreeMap;
use std::fmt::Write;

use plateau_reports::{Header, Kind, MetricSpec, Samples, SAMPLES_SCHEMA};
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

use crate::detector::{analyze, DetectorConfig, Tolerance};

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
}

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
        let rows = self
            .values
            .iter()
            .enumerate()
            .map(|(i, v)| plateau_reports::Row::new(self.dt * (i + 1) as f64, i as u64 + 1, true, vec![Some(*v)]))
            .collect();
        Samples {
            header: Header {
                schema: SAMPLES_SCHEMA.into(),
                scenario: format!("corpus-{}", self.name.replace('/', "-")),
                seed: 0,
                backend: "synthetic".into(),
                metrics,
                warmup_iterations: Some(warmup(self.n)),
                injections: vec![],
            },
            names: vec![self.metric.to_string()],
            rows,
            truncated_tail: false,
            warnings: vec![],
        }
    }

    /// The samples file (samples.jsonl v1) of the series, for `plateau analyze`.
    pub fn jsonl(&self) -> String {
        let s = self.samples();
        let mut out = serde_json::to_string(&s.header).expect("a header serializes");
        out.push('\n');
        for (r, v) in s.rows.iter().zip(&self.values) {
            let _ = writeln!(
                out,
                "{{\"t\":{},\"iter\":{},\"quiescent\":true,\"values\":{{\"{}\":{v}}}}}",
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
const BASE: [(&str, &str, f64); 7] = [
    ("jemalloc.allocated", "bytes", 1.0),
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
    for (name, level) in [("proc.file_mappings", 24.0), ("proc.fds", 11.0), ("proc.threads", 2.0)] {
        out.insert(name, vec![level; n as usize]);
    }
    out
}

/// Warm-up the corpus files declare: the soak's 20, or a fifth of a shorter run.
fn warmup(n: u64) -> u64 {
    20.min(n / 5)
}

/// The detector's resolution for a clean series (per iteration), with the default configuration
/// and no request counter (so no tolerance).
pub fn resolution(c: &Case) -> f64 {
    let s = c.samples();
    let cfg = DetectorConfig { warmup_iterations: warmup(c.n), tolerance: Tolerance::default(), ..Default::default() };
    analyze(&s, &cfg, false).metrics[0]
        .trend
        .as_ref()
        .map(|t| t.resolution_per_iter)
        .filter(|r| r.is_finite())
        .unwrap_or(64.0)
}

/// A shape: its label, the metric it changes, and what it adds at iteration `i` (1-based) of `n`.
struct Shape {
    name: &'static str,
    label: Label,
    metric: &'static str,
    dt: f64,
    add: fn(f64, f64, &mut ChaCha8Rng) -> f64,
}

fn shapes() -> Vec<Shape> {
    use Label::{Clean, Leak};
    let s =
        |name, label, metric, add: fn(f64, f64, &mut ChaCha8Rng) -> f64| Shape { name, label, metric, dt: 0.05, add };
    vec![
        // Leaks.
        s("staircase", Leak, "jemalloc.allocated", |i, _, _| 64.0 * KIB * (i / 10.0).floor()),
        s("late-onset", Leak, "jemalloc.allocated", |i, n, _| 2.0 * KIB * (i - n / 2.0).max(0.0)),
        s("sqrt", Leak, "jemalloc.allocated", |i, _, _| 64.0 * KIB * i.sqrt()),
        s("rising-sawtooth", Leak, "jemalloc.allocated", |i, _, _| 512.0 * KIB * (i % 10.0) / 10.0 + 8.0 * KIB * i),
        s("outside-heap", Leak, "proc.anon_outside_heap", |i, _, _| PAGE * (i / 2.0).floor()),
        s("shared-memory", Leak, "proc.rss_shmem", |i, _, _| 64.0 * KIB * i),
        s("file-mappings", Leak, "proc.file_mappings", |i, _, _| (i / 5.0).floor()),
        s("fds", Leak, "proc.fds", |i, _, _| (i / 8.0).floor()),
        s("threads", Leak, "proc.threads", |i, _, _| (i / 10.0).floor()),
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
    ]
}

/// Every corpus case, in a fixed order: by length, seed, then shape.
pub fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    for n in LENGTHS {
        for seed in SEEDS {
            let clean = base(n, seed);
            let heap = "jemalloc.allocated";
            let flat = Case {
                name: String::new(),
                label: Label::Clean,
                metric: heap,
                n,
                dt: 0.05,
                values: clean[heap].clone(),
            };
            let r1 = resolution(&flat);
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
                });
            }
            for shape in shapes() {
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
                });
            }
        }
    }
    out
}
