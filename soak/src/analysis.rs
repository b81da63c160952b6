//! The shell around the detector: read a samples file, judge it, add what the run directory
//! knows beyond the samples (the anonymous-mapping snapshots), and write verdict.json and plots.

use std::path::Path;

use plateau_reports::{Samples, SamplesError, Status, Verdict};
use serde::{Deserialize, Serialize};

use crate::detector::{analyze, DetectorConfig};
use crate::probes::AnonMapping;

/// Anonymous mappings at the first quiescent point after warm-up and at the end of the run: a
/// pmap-style diff says which mapping grew.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MappingSnapshots {
    pub start_iter: u64,
    pub end_iter: u64,
    pub start: Vec<AnonMapping>,
    pub end: Vec<AnonMapping>,
}

/// One address range that grew between the snapshots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrownRange {
    pub name: String,
    pub perms: String,
    pub start: u64,
    pub end: u64,
    /// Bytes of the range that were not mapped at the first snapshot.
    pub grown_bytes: u64,
}

impl MappingSnapshots {
    /// Ranges mapped at the end that were not (wholly) mapped at the start, largest growth first.
    /// Adjacent anonymous mappings with the same permissions are merged by the kernel, so a leak
    /// of many mappings can show as one range that grew.
    pub fn grown(&self) -> Vec<GrownRange> {
        let mut v: Vec<GrownRange> = self
            .end
            .iter()
            .map(|e| {
                let (e0, e1) = (e.start, e.start + e.bytes);
                let overlap: u64 = self
                    .start
                    .iter()
                    .map(|s| (s.start.max(e0), (s.start + s.bytes).min(e1)))
                    .filter(|(a, b)| a < b)
                    .map(|(a, b)| b - a)
                    .sum();
                GrownRange {
                    name: e.name.clone(),
                    perms: e.perms.clone(),
                    start: e0,
                    end: e1,
                    grown_bytes: e.bytes - overlap.min(e.bytes),
                }
            })
            .filter(|g| g.grown_bytes > 0)
            .collect();
        v.sort_by(|a, b| b.grown_bytes.cmp(&a.grown_bytes).then(a.start.cmp(&b.start)));
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
    if !s.rows.iter().any(|r| r.quiescent) {
        return Err(SamplesError {
            path: samples.to_path_buf(),
            line: 2,
            field: "quiescent".into(),
            message: "no sample is quiescent (taken with nothing in flight): nothing to judge".into(),
        });
    }
    let cfg = cfg.unwrap_or_else(|| default_config(&s));
    let mut v = analyze(&s, &cfg, incomplete);
    let snap_path = samples.with_file_name("mappings.json");
    if let Some(snap) = std::fs::read(&snap_path).ok().and_then(|b| serde_json::from_slice::<MappingSnapshots>(&b).ok())
    {
        let grown = snap.grown();
        if let Some(g) = grown.first() {
            let outside = v.metrics.iter().any(|m| {
                m.status == Status::Fail && m.location.as_deref().is_some_and(|l| l.starts_with("outside the heap"))
            });
            if outside {
                let total: u64 = grown.iter().map(|g| g.grown_bytes).sum();
                let name = format!("{} {} mapping {:#x}-{:#x}", g.name, g.perms, g.start, g.end);
                let line = format!(
                    "mapping: the {name} grew by {:.1} MiB between iterations {} and {} ({} ranges grew, {:.1} MiB in all)",
                    g.grown_bytes as f64 / 1024.0 / 1024.0,
                    snap.start_iter,
                    snap.end_iter,
                    grown.len(),
                    total as f64 / 1024.0 / 1024.0
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
