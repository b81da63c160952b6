//! Reading a run directory as every command does: its samples judged again, and the verdict it
//! recorded believed only where it is exactly that judgement.

use std::path::Path;

use plateau_detector::Overrides;
use plateau_reports::{Samples, Verdict};

use crate::{judge_bytes, sha256_hex};

/// A run directory as every command that reads one takes it: its samples, and the verdict of
/// exactly them. The samples are always judged again (the one judge, with every evidence file
/// beside them: a tenth of a second for most runs) and the recorded verdict.json is compared with
/// that judgement; a recorded verdict that differs in anything (its verdict, a metric's status, a
/// number, its evidence) is never believed: [`LoadedRun::judged_again`] says why, the judgement
/// is the verdict, and the file is left as it is. A verdict.json that does not read at all
/// (damaged, or an older plateau's `warn`) is refused: an input error.
pub struct LoadedRun {
    pub samples: Samples,
    pub samples_sha256: String,
    pub verdict: Verdict,
    /// Why the recorded verdict.json is not the verdict (None: it is exactly the judgement).
    pub judged_again: Option<String>,
    /// Whether the run directory had a verdict.json at all.
    pub had_verdict: bool,
}

/// Loads the run in `dir` (see [`LoadedRun`]). Errors are input errors naming the file.
pub fn load_run(dir: &Path) -> Result<LoadedRun, String> {
    let samples_path = dir.join("samples.jsonl");
    if !samples_path.is_file() {
        return Err(format!("{}: no samples.jsonl: not a run directory of plateau", dir.display()));
    }
    let bytes = plateau_reports::fsutil::read_input(&samples_path, plateau_reports::samples::MAX_FILE_BYTES)?;
    let samples = Samples::parse(&bytes[..], &samples_path).map_err(|e| e.to_string())?;
    let samples_sha256 = sha256_hex(&bytes);
    let verdict_path = dir.join("verdict.json");
    let had_verdict = std::fs::symlink_metadata(&verdict_path).is_ok();
    let recorded = match had_verdict {
        false => None,
        true => Some(
            plateau_reports::fsutil::read_input(&verdict_path, plateau_reports::fsutil::RUN_FILE_BYTES)
                .and_then(|b| serde_json::from_slice::<Verdict>(&b).map_err(|e| format!("line {}: {e}", e.line())))
                // A verdict that does not read is refused, not replaced: damaged, or an older
                // plateau's (its `warn`); analyze judges the samples again into a directory of its own.
                .map_err(|e| {
                    format!(
                        "{}: {e}: it does not read (damaged, or written by an older plateau); `plateau analyze {}` judges the samples again",
                        verdict_path.display(),
                        samples_path.display()
                    )
                })?,
        ),
    };
    let verdict = judge_bytes(&samples, &bytes, &samples_path, &Overrides::default(), None)?;
    let judged_again = match &recorded {
        None => Some("the run wrote no verdict.json".to_string()),
        Some(v) => {
            stale(v, &verdict).or_else(|| differs(v, &verdict)).map(|why| format!("{}: {why}", verdict_path.display()))
        }
    };
    Ok(LoadedRun { samples, samples_sha256, verdict, judged_again, had_verdict })
}

/// Where a recorded verdict says other than the judgement of its samples, if anywhere: the
/// verdict first, then the first metric whose status differs, else the first field.
fn differs(recorded: &Verdict, judged: &Verdict) -> Option<String> {
    if recorded.verdict != judged.verdict || recorded.incomplete != judged.incomplete {
        return Some(format!(
            "it says {}{}, and its samples judge {}{}",
            recorded.verdict.as_str(),
            if recorded.incomplete { " (incomplete)" } else { "" },
            judged.verdict.as_str(),
            if judged.incomplete { " (incomplete)" } else { "" }
        ));
    }
    let status = |v: &Verdict, name: &str| v.metrics.iter().find(|m| m.name == name).map(|m| m.status.as_str());
    for m in &judged.metrics {
        let was = status(recorded, &m.name);
        if was != Some(m.status.as_str()) {
            return Some(format!(
                "it has {} {}, and its samples judge it {}",
                m.name,
                was.unwrap_or("absent"),
                m.status.as_str()
            ));
        }
    }
    let (a, b) = (serde_json::to_value(recorded).ok()?, serde_json::to_value(judged).ok()?);
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else { return None };
    let field = b.keys().chain(a.keys()).find(|k| a.get(*k) != b.get(*k))?;
    Some(format!("its `{field}` is not what its samples judge"))
}

/// Why a recorded verdict is not the verdict of the run directory as it is now, if it is not:
/// its evidence against the evidence of the judgement just made (the samples' and each evidence
/// file's hash, as that judgement read them, and the detector), so nothing is read twice.
fn stale(v: &Verdict, judged: &Verdict) -> Option<String> {
    let Some(e) = &v.evidence else {
        return Some("it records no evidence (no hash of the samples it judged: an older plateau wrote it)".into());
    };
    let now = judged.evidence.as_ref()?;
    if e.samples_sha256 != now.samples_sha256 {
        return Some(format!(
            "it judged samples with SHA-256 {}, but samples.jsonl is now {}: the samples changed since",
            short_hash(&e.samples_sha256),
            short_hash(&now.samples_sha256)
        ));
    }
    if !v.overrides.is_empty() {
        return Some(format!("it was judged with {} (not the run's own settings)", v.overrides.join(" ")));
    }
    let names: std::collections::BTreeSet<&String> = e.files.keys().chain(now.files.keys()).collect();
    for name in names {
        let (was, is) = (e.files.get(name), now.files.get(name));
        if was != is {
            let hash = |h: Option<&String>| h.map_or("absent".to_string(), |h| short_hash(h));
            return Some(format!("{name} was {} when it was judged and is {} now", hash(was), hash(is)));
        }
    }
    if e.detector != now.detector {
        return Some(format!("it was judged by {}, and this plateau's detector is {}", e.detector, now.detector));
    }
    None
}

/// A hash as people compare it: its first 12 hex digits.
fn short_hash(h: &str) -> String {
    h.chars().take(12).collect()
}
