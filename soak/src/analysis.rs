//! The shell around the detector: read a samples file, judge it, add what the run directory
//! knows beyond the samples (the anonymous-mapping snapshots), and write verdict.json and plots.

use std::collections::BTreeMap;
use std::path::Path;

use plateau_reports::{Samples, SamplesError, Status, Verdict};
use serde::{Deserialize, Serialize};

use crate::detector::{analyze, DetectorConfig};
use crate::probes::AnonMapping;

/// Anonymous mappings at the first quiescent point after warm-up and at the end of the run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MappingSnapshots {
    pub start_iter: u64,
    pub end_iter: u64,
    /// name -> (count, bytes)
    pub start: BTreeMap<String, (u64, u64)>,
    pub end: BTreeMap<String, (u64, u64)>,
}

impl MappingSnapshots {
    pub fn group(maps: &[AnonMapping]) -> BTreeMap<String, (u64, u64)> {
        let mut g = BTreeMap::new();
        for m in maps {
            let e = g.entry(m.name.clone()).or_insert((0, 0));
            e.0 += 1;
            e.1 += m.bytes;
        }
        g
    }

    /// Mappings that grew, largest growth first: (name, +count, +bytes).
    pub fn grown(&self) -> Vec<(String, i64, i64)> {
        let mut v: Vec<(String, i64, i64)> = self
            .end
            .iter()
            .map(|(name, &(c, b))| {
                let (c0, b0) = self.start.get(name).copied().unwrap_or((0, 0));
                (name.clone(), c as i64 - c0 as i64, b as i64 - b0 as i64)
            })
            .filter(|g| g.2 > 0)
            .collect();
        v.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(&b.0)));
        v
    }
}

/// Reads `samples`, judges it and, when a mapping snapshot lies beside it, names the mappings
/// that grew for every metric judged to grow outside the heap.
pub fn judge_file(
    samples: &Path,
    cfg: Option<DetectorConfig>,
    incomplete: bool,
) -> Result<(Samples, Verdict), SamplesError> {
    let s = Samples::read(samples)?;
    let cfg = cfg.unwrap_or_else(|| default_config(&s));
    let mut v = analyze(&s, &cfg, incomplete);
    let snap_path = samples.with_file_name("mappings.json");
    if let Some(snap) = std::fs::read(&snap_path).ok().and_then(|b| serde_json::from_slice::<MappingSnapshots>(&b).ok())
    {
        let grown = snap.grown();
        if let Some((name, dc, db)) = grown.first() {
            let outside = v.metrics.iter().any(|m| {
                m.status == Status::Fail && m.location.as_deref().is_some_and(|l| l.starts_with("outside the heap"))
            });
            if outside {
                let line = format!(
                    "mapping: {name} grew by {dc} mappings and {:.1} MiB between iterations {} and {}",
                    *db as f64 / 1024.0 / 1024.0,
                    snap.start_iter,
                    snap.end_iter
                );
                for m in v.metrics.iter_mut().filter(|m| m.status == Status::Fail) {
                    if let Some(l) = &mut m.location {
                        if l.starts_with("outside the heap") {
                            l.push_str(&format!("; growing mapping: {name}"));
                        }
                    }
                }
                v.attribution.push(line);
            }
        }
    }
    Ok((s, v))
}

/// Warm-up from the header, else a fifth of the run.
pub fn default_config(s: &Samples) -> DetectorConfig {
    let iterations = s.rows.iter().map(|r| r.iter).max().unwrap_or(0);
    let warmup = s.header.warmup_iterations.unwrap_or(iterations / 5);
    DetectorConfig { warmup_iterations: warmup, ..DetectorConfig::default() }
}

/// Writes verdict.json and the plots into `dir`. Plot failures are reported, not fatal.
pub fn write_outputs(dir: &Path, s: &Samples, v: &Verdict) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut json = serde_json::to_string_pretty(v).map_err(std::io::Error::other)?;
    json.push('\n');
    std::fs::write(dir.join("verdict.json"), json)?;
    if let Err(e) = plateau_reports::plot::plot_run(s, dir) {
        eprintln!("plateau: warning: plots in {} not drawn: {e}", dir.display());
    }
    Ok(())
}

/// A short human summary of a verdict: the summary line, then each failing or warning metric.
pub fn describe(v: &Verdict) -> String {
    let mut out = format!("verdict: {}{}\n", v.summary, if v.incomplete { " (incomplete)" } else { "" });
    for m in v.metrics.iter().filter(|m| m.status != Status::Pass) {
        let status = if m.status == Status::Fail { "FAIL" } else { "warn" };
        out.push_str(&format!("  {status} {} ({}): {}", m.name, m.kind, m.reason));
        if let Some(l) = &m.location {
            out.push_str(&format!(" [{l}]"));
        }
        out.push('\n');
    }
    for a in &v.attribution {
        out.push_str(&format!("  where: {a}\n"));
    }
    out
}
