//! The history of runs across nights, in an embedded SQLite database (`plateau history`).
//!
//! Lifecycle: each night's CI job runs its scenarios, then `history add` stores every run
//! directory (header, environment, verdict and per-metric level and slope, see
//! [`plateau_reports::figures`]); `history show` prints the trend and writes an HTML page of it;
//! `history check` judges each scenario's nights as a series from a baseline night (`history pin`)
//! and fails on a level that jumped or creeps, or a slope that steepened, beyond the tolerance. The schema is versioned
//! from its first table (`PRAGMA user_version`): [`open`] applies the migrations a database lacks
//! and refuses one written by a newer plateau.

// The harness's allocator in this crate's unit tests, as the `plateau` binary has it (the
// tests read jemalloc's statistics and arenas).
#[cfg(test)]
plateau_probes::install_harness_allocator!();

pub mod check;
pub mod show;
pub mod store;

use std::path::Path;

use rusqlite::Connection;

/// Migrations in order; the database's `user_version` is how many of them it has.
const MIGRATIONS: [&str; 2] = [
    "
CREATE TABLE runs (
    id INTEGER PRIMARY KEY,
    -- SHA-256 of the run's samples.jsonl: the same run added twice is stored once.
    samples_sha256 TEXT NOT NULL UNIQUE,
    added_utc TEXT NOT NULL,
    -- When the run started (environment.json), else when it was added.
    started_utc TEXT NOT NULL,
    dir TEXT NOT NULL,
    scenario TEXT NOT NULL,
    seed INTEGER NOT NULL,
    backend TEXT NOT NULL,
    injections TEXT NOT NULL,
    iterations INTEGER NOT NULL,
    warmup_iterations INTEGER NOT NULL,
    verdict TEXT NOT NULL,
    incomplete INTEGER NOT NULL,
    summary TEXT NOT NULL,
    commit_id TEXT NOT NULL,
    version TEXT NOT NULL,
    scenario_sha256 TEXT NOT NULL,
    host TEXT NOT NULL,
    gpu TEXT NOT NULL,
    environment_json TEXT
);
CREATE INDEX runs_by_scenario ON runs (scenario, started_utc);
CREATE TABLE metrics (
    run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    kind TEXT NOT NULL,
    unit TEXT NOT NULL,
    status TEXT,
    level REAL,
    slope_per_iter REAL,
    resolution_per_iter REAL,
    PRIMARY KEY (run_id, name)
);
",
    "
-- The night each group (scenario and injections) is measured from (`history pin`).
CREATE TABLE pins (
    scenario TEXT NOT NULL,
    injections TEXT NOT NULL,
    run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    PRIMARY KEY (scenario, injections)
);
",
];

/// The schema version this plateau writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Why the history could not be used: bad input (exit 2) unless said otherwise.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("{0}")]
    Input(String),
    #[error("{0}")]
    Harness(String),
}

pub(crate) fn db_err(path: &Path, e: rusqlite::Error) -> HistoryError {
    HistoryError::Input(format!("{}: {e}", path.display()))
}

/// Opens (creating it when `create`) the database at `path` and brings its schema up to
/// [`SCHEMA_VERSION`], each migration in its own transaction.
pub fn open(path: &Path, create: bool) -> Result<Connection, HistoryError> {
    if !create && !path.exists() {
        return Err(HistoryError::Input(format!(
            "--db {}: no such database (`plateau history add RUN_DIR --db {}` creates it)",
            path.display(),
            path.display()
        )));
    }
    let mut c = Connection::open(path).map_err(|e| db_err(path, e))?;
    c.pragma_update(None, "foreign_keys", true).map_err(|e| db_err(path, e))?;
    let version: i64 = c
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(|e| HistoryError::Input(format!("--db {}: not a plateau history database ({e})", path.display())))?;
    if version == 0 {
        // A database plateau did not make: never write tables into another application's file.
        let tables: Vec<String> = c
            .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name LIMIT 5")
            .and_then(|mut st| st.query_map([], |r| r.get(0))?.collect())
            .map_err(|e| {
                HistoryError::Input(format!("--db {}: not a plateau history database ({e})", path.display()))
            })?;
        if !tables.is_empty() {
            return Err(HistoryError::Input(format!(
                "--db {}: not a plateau history database: it holds other tables ({}) and no plateau schema; give a new file",
                path.display(),
                tables.join(", ")
            )));
        }
    }
    if version > SCHEMA_VERSION {
        return Err(HistoryError::Input(format!(
            "--db {}: schema version {version} is newer than this plateau knows ({SCHEMA_VERSION}); use a newer plateau",
            path.display()
        )));
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        let tx = c.transaction().map_err(|e| db_err(path, e))?;
        tx.execute_batch(sql).map_err(|e| db_err(path, e))?;
        tx.pragma_update(None, "user_version", i as i64 + 1).map_err(|e| db_err(path, e))?;
        tx.commit().map_err(|e| db_err(path, e))?;
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_database_gets_every_migration_and_a_newer_one_is_refused() {
        let dir = std::env::temp_dir().join(format!("plateau-history-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("h.db");
        let _ = std::fs::remove_file(&path);
        assert!(open(&path, false).is_err(), "a missing database is not created by readers");
        let c = open(&path, true).unwrap();
        let v: i64 = c.pragma_query_value(None, "user_version", |r| r.get(0)).unwrap();
        assert_eq!(v, SCHEMA_VERSION);
        c.pragma_update(None, "user_version", SCHEMA_VERSION + 1).unwrap();
        drop(c);
        match open(&path, false) {
            Err(HistoryError::Input(m)) => assert!(m.contains("newer"), "{m}"),
            other => panic!("a newer schema was accepted: {:?}", other.map(|_| ())),
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
