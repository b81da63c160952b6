//! Known growth in the one judge: the run directory's record of its `--known` file read as
//! evidence (hashed like every file the judge reads), weighed after the sites, and said on the
//! verdict's first line.

use std::collections::BTreeMap;
use std::path::Path;

use plateau_detector::{DetectorConfig, GaugeEvidence};
use plateau_reports::{MetricVerdict, Samples, Verdict};
use plateau_sites::known::{Known, KnownEvidence, Record, MAX_FILE_BYTES, RECORD_FILE};

/// The run's known.json beside the samples, when it is there: its SHA-256 goes into `files`. A
/// record that does not read, or whose file does not, is an input error naming it.
pub(crate) fn read_record(samples: &Path, files: &mut BTreeMap<String, String>) -> Result<Option<Known>, String> {
    let path = samples.with_file_name(RECORD_FILE);
    if std::fs::symlink_metadata(&path).is_err() {
        return Ok(None);
    }
    let bytes = plateau_reports::fsutil::read_input(&path, MAX_FILE_BYTES)?;
    // Hashed as read: the bytes parsed are the bytes in the evidence.
    files.insert(RECORD_FILE.to_string(), crate::sha256_hex(&bytes));
    let record: Record =
        serde_json::from_slice(&bytes).map_err(|e| format!("{}: line {}: {e}", path.display(), e.line()))?;
    record.known(&path.display().to_string()).map(Some)
}

/// Sites first (what grew, and where), then known growth over what they named.
pub(crate) struct Layered<'a> {
    pub sites: Option<&'a dyn GaugeEvidence>,
    pub known: Option<&'a dyn GaugeEvidence>,
}

impl GaugeEvidence for Layered<'_> {
    fn amend(
        &self,
        s: &Samples,
        metrics: &mut [MetricVerdict],
        cfg: &DetectorConfig,
        requests_per_iter: Option<f64>,
    ) -> Vec<String> {
        let mut lines = Vec::new();
        for e in [self.sites, self.known].into_iter().flatten() {
            lines.extend(e.amend(s, metrics, cfg, requests_per_iter));
        }
        lines
    }
}

/// The verdict's `known` and first line: a run judged with known entries says so, with what
/// became of them.
pub(crate) fn note(v: &mut Verdict, k: &KnownEvidence) {
    v.known = k.entries();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for e in &v.known {
        *counts.entry(e.state.as_str()).or_default() += 1;
    }
    let said: Vec<String> = counts.iter().map(|(state, n)| format!("{n} {state}")).collect();
    v.summary.push_str(&format!(
        " [judged with known growth: {} ({} {}: {}), as of {}]",
        k.known.file,
        v.known.len(),
        if v.known.len() == 1 { "entry" } else { "entries" },
        said.join(", "),
        k.known.on
    ));
    let e = v.evidence.get_or_insert_with(Default::default);
    e.settings.insert("known".into(), format!("{} ({} entries)", k.known.file, v.known.len()));
    e.settings.insert("known_judged_on".into(), k.known.on.to_string());
}
