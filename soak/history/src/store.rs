//! `history add`: one row per run and one per metric, all of the given runs in one transaction
//! (every directory is read and checked before anything is written).

use std::path::{Path, PathBuf};

use plateau_reports::figures::of_run;
use plateau_reports::{Environment, Samples, Verdict};
use rusqlite::{params, Connection, OptionalExtension};

use super::{db_err, HistoryError};

/// A run directory read whole.
pub struct RunRecord {
    pub dir: PathBuf,
    pub samples_sha256: String,
    pub samples: Samples,
    pub verdict: Verdict,
    pub environment: Option<Environment>,
}

/// Whether `dir` holds a run's samples at all: a run refused or failed before its first sample
/// leaves a directory without them, which `history add runs/*` reports and skips.
pub fn has_samples(dir: &Path) -> bool {
    dir.join("samples.jsonl").is_file()
}

/// Reads a run directory through the one loader (`analysis::load_run`): samples.jsonl must be
/// there; its verdict is the run's verdict.json while that judged exactly these samples, else
/// (none written, or samples changed since) the one judge's verdict of them now, which an
/// unfinished run makes inconclusive; environment.json may be there.
pub fn read_run(dir: &Path) -> Result<RunRecord, HistoryError> {
    if !has_samples(dir) {
        return Err(HistoryError::Input(format!(
            "{}: no samples.jsonl (not a run directory: `plateau run` writes samples.jsonl)",
            dir.display()
        )));
    }
    let run = plateau_analysis::load_run(dir).map_err(HistoryError::Input)?;
    if let (Some(why), true) = (&run.judged_again, run.had_verdict) {
        plateau_shell::errln!("plateau: history: {why}: judged again from samples.jsonl, and stored as judged now");
    }
    let env_path = dir.join("environment.json");
    let environment = if env_path.exists() {
        let b = plateau_reports::fsutil::read_input(&env_path, plateau_reports::fsutil::RUN_FILE_BYTES)
            .map_err(HistoryError::Input)?;
        Some(
            serde_json::from_slice(&b)
                .map_err(|e| HistoryError::Input(format!("{}: line {}: {e}", env_path.display(), e.line())))?,
        )
    } else {
        None
    };
    Ok(RunRecord {
        dir: dir.to_path_buf(),
        samples_sha256: run.samples_sha256,
        samples: run.samples,
        verdict: run.verdict,
        environment,
    })
}

/// What [`add`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Added {
    /// Runs stored that were not there.
    pub new: usize,
    /// Runs stored before under another verdict (one written by hand, or by an older plateau's
    /// detector), now replaced by their judgement.
    pub replaced: usize,
}

/// The verdict a run is stored under: an unfinished run is never stored as a passing night.
fn stored_verdict(v: &Verdict) -> &'static str {
    if v.incomplete && v.verdict == plateau_reports::Status::Pass {
        "inconclusive"
    } else {
        v.verdict.as_str()
    }
}

/// Stores `runs`. A night is keyed by its samples' SHA-256: one already stored under the same
/// verdict and summary is left as it is; one stored under another (a verdict.json edited by hand
/// and believed by an older plateau) is replaced by the judgement of its samples.
pub fn add(c: &mut Connection, db: &Path, runs: &[RunRecord], now_utc: &str) -> Result<Added, HistoryError> {
    let tx = c.transaction().map_err(|e| db_err(db, e))?;
    let mut added = Added::default();
    for r in runs {
        let v = &r.verdict;
        let stored: Option<(i64, String, String)> = tx
            .query_row(
                "SELECT id, verdict, summary FROM runs WHERE samples_sha256 = ?1",
                params![r.samples_sha256],
                |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
            )
            .optional()
            .map_err(|e| db_err(db, e))?;
        match stored {
            Some((_, verdict, summary)) if verdict == stored_verdict(v) && summary == v.summary => continue,
            Some((id, _, _)) => {
                // Its metrics go with it (ON DELETE CASCADE, foreign keys on in `open`).
                tx.execute("DELETE FROM runs WHERE id = ?1", params![id]).map_err(|e| db_err(db, e))?;
                added.replaced += 1;
            }
            None => added.new += 1,
        }
        let env = r.environment.clone().unwrap_or_default();
        let field = |s: &str| if s.is_empty() { "unknown".to_string() } else { s.to_string() };
        let started = if env.started_utc.is_empty() { now_utc.to_string() } else { env.started_utc.clone() };
        let env_json = r.environment.as_ref().map(|e| serde_json::to_string(e).unwrap_or_default());
        let n = tx
            .execute(
                "INSERT OR IGNORE INTO runs (samples_sha256, added_utc, started_utc, dir, scenario, seed, backend, injections,
                 iterations, warmup_iterations, verdict, incomplete, summary, commit_id, version, scenario_sha256, host, gpu,
                 environment_json) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19)",
                params![
                    r.samples_sha256,
                    now_utc,
                    started,
                    r.dir.display().to_string(),
                    v.scenario,
                    v.seed as i64,
                    v.backend,
                    v.injections.join(","),
                    v.iterations as i64,
                    v.warmup_iterations as i64,
                    stored_verdict(v),
                    v.incomplete,
                    v.summary,
                    field(&env.commit),
                    field(&env.version),
                    field(&env.scenario_sha256),
                    field(&env.host),
                    field(&env.gpu),
                    env_json,
                ],
            )
            .map_err(|e| db_err(db, e))?;
        if n == 0 {
            return Err(HistoryError::Harness(format!("{}: run {} was not stored", db.display(), r.dir.display())));
        }
        let id = tx.last_insert_rowid();
        let mut stmt = tx
            .prepare_cached(
                "INSERT INTO metrics (run_id, name, kind, unit, status, level, slope_per_iter, resolution_per_iter)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )
            .map_err(|e| db_err(db, e))?;
        for m in of_run(&r.samples, v) {
            let resolution = v
                .metrics
                .iter()
                .find(|x| x.name == m.name)
                .and_then(|x| x.trend.as_ref())
                .and_then(|t| t.resolution_per_iter);
            stmt.execute(params![
                id,
                m.name,
                m.kind.as_str(),
                m.unit,
                m.status.map(|s| s.as_str()),
                m.level,
                m.slope_per_iter,
                resolution
            ])
            .map_err(|e| db_err(db, e))?;
        }
    }
    tx.commit().map_err(|e| db_err(db, e))?;
    Ok(added)
}
