//! `history check`: the latest night of each scenario (and set of injections) against the
//! passing nights before it. A gauge regressed when
//! - its level rose more than the tolerance above the highest level of every passing night stored
//!   (up to a year of them). Some levels move in allocator-sized steps from night to night with
//!   nothing changed: over four clean n-sampling runs of one seed, jemalloc.metadata sat at 1.54
//!   or 2.07 MB (a 512 KiB base block, 29%), jemalloc.resident at 6.79 or 7.32 MB (7%), and the
//!   page tables moved 21%; the same over seeds 1-5. Measured from the highest night, such a step
//!   is not a regression once the history has seen both sides of it; for a steady level (the
//!   heap's live bytes: 0.03% across those seeds) the highest night is its level, and a rise of
//!   the tolerance above it is one.
//! - its slope rose past the steepest of the last N passing nights by more than the latest run's
//!   resolution (the smallest steady growth that run can tell from noise, see the verdict's
//!   trend): a slope within that margin is indistinguishable from the nights it is compared with.
//!
//! The latest night's own verdict is not re-judged here; a failing night already failed its job.

use std::path::Path;

use plateau_reports::figures::{fmt_value, median};
use rusqlite::{params, Connection};

use super::{db_err, HistoryError};

/// Passing nights a level's range is read from at most: a year of them.
const MAX_NIGHTS: usize = 365;

/// How `check` judges.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// Passing nights (the most recent before the latest) whose slopes the latest is compared with.
    pub last: usize,
    /// Allowed rise of a level above the highest passing night stored, in percent.
    pub level_tolerance_pct: f64,
}

impl Default for CheckOptions {
    fn default() -> Self {
        // A week of nights. 10%: the heap's live bytes (jemalloc.allocated) of clean n-sampling
        // runs across seeds 1-5 stay within 0.03% of each other, RSS within 1.7%, RssAnon 0.3%;
        // a rise of a tenth is past that; stepped levels are measured from their highest night.
        CheckOptions { last: 7, level_tolerance_pct: 10.0 }
    }
}

/// What `check` found.
#[derive(Debug, Clone, Default)]
pub struct CheckOutcome {
    /// One line per group compared (or not): what was compared with what.
    pub compared: Vec<String>,
    /// One line per regressed metric.
    pub regressions: Vec<String>,
    /// Groups with a latest night and at least one passing night before it.
    pub groups_judged: usize,
}

struct Row {
    unit: String,
    level: Option<f64>,
    slope: Option<f64>,
    resolution: Option<f64>,
}

fn gauges(c: &Connection, db: &Path, run: i64) -> Result<Vec<(String, Row)>, HistoryError> {
    let mut stmt = c
        .prepare_cached(
            "SELECT name, unit, level, slope_per_iter, resolution_per_iter FROM metrics WHERE run_id = ?1 AND kind = 'gauge' ORDER BY name",
        )
        .map_err(|e| db_err(db, e))?;
    let rows = stmt
        .query_map(params![run], |r| {
            Ok((
                r.get::<_, String>(0)?,
                Row { unit: r.get(1)?, level: r.get(2)?, slope: r.get(3)?, resolution: r.get(4)? },
            ))
        })
        .map_err(|e| db_err(db, e))?;
    rows.collect::<Result<Vec<_>, _>>().map_err(|e| db_err(db, e))
}

pub fn check(
    c: &Connection,
    db: &Path,
    scenario: Option<&str>,
    o: &CheckOptions,
) -> Result<CheckOutcome, HistoryError> {
    assert!(o.last > 0, "check compares with at least one night");
    let mut groups = c
        .prepare("SELECT DISTINCT scenario, injections FROM runs WHERE (?1 IS NULL OR scenario = ?1) ORDER BY scenario, injections")
        .map_err(|e| db_err(db, e))?;
    let groups: Vec<(String, String)> = groups
        .query_map(params![scenario], |r| Ok((r.get(0)?, r.get(1)?)))
        .map_err(|e| db_err(db, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| db_err(db, e))?;
    if groups.is_empty() {
        return Err(HistoryError::Input(match scenario {
            Some(s) => format!("--scenario {s}: no run of it in {}", db.display()),
            None => format!("{}: no runs stored yet (`plateau history add`)", db.display()),
        }));
    }
    let mut out = CheckOutcome::default();
    let mut runs = c
        .prepare(
            "SELECT id, started_utc, verdict FROM runs WHERE scenario = ?1 AND injections = ?2 ORDER BY started_utc DESC, id DESC",
        )
        .map_err(|e| db_err(db, e))?;
    for (sc, inj) in groups {
        let label = if inj.is_empty() { sc.clone() } else { format!("{sc} +{inj}") };
        let list: Vec<(i64, String, String)> = runs
            .query_map(params![sc, inj], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .map_err(|e| db_err(db, e))?
            .collect::<Result<_, _>>()
            .map_err(|e| db_err(db, e))?;
        let (latest, started, _) = &list[0];
        let passing: Vec<i64> = list[1..].iter().filter(|r| r.2 == "pass").take(MAX_NIGHTS).map(|r| r.0).collect();
        let before = &passing[..passing.len().min(o.last)];
        if before.is_empty() {
            out.compared.push(format!(
                "{label}: latest night {started} has no passing night before it to compare with (not judged)"
            ));
            continue;
        }
        out.groups_judged += 1;
        out.compared
            .push(format!("{label}: latest night {started} against the {} passing nights before it", before.len()));
        let all: Vec<Vec<(String, Row)>> = passing.iter().map(|id| gauges(c, db, *id)).collect::<Result<_, _>>()?;
        let then = &all[..before.len()];
        for (name, now) in gauges(c, db, *latest)? {
            let pick = |nights: &[Vec<(String, Row)>], f: &dyn Fn(&Row) -> Option<f64>| -> Vec<f64> {
                nights
                    .iter()
                    .filter_map(|night| night.iter().find(|(n, _)| *n == name).and_then(|(_, r)| f(r)))
                    .collect()
            };
            let fmt = |x: f64| fmt_value(x, &now.unit);
            if let Some(level) = now.level {
                let stored = pick(&all, &|r| r.level);
                let highest = stored.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let limit = highest + highest.abs() * o.level_tolerance_pct / 100.0;
                if !stored.is_empty() && level > limit {
                    let pct = if highest.abs() > 0.0 {
                        format!("{:+.1}%", (level - highest) / highest.abs() * 100.0)
                    } else {
                        "up from 0".into()
                    };
                    out.regressions.push(format!(
                        "{label}: {name} level {} is {pct} above the highest of the {} passing nights stored ({}; median of the last {}: {}); tolerance {}%",
                        fmt(level),
                        stored.len(),
                        fmt(highest),
                        then.len(),
                        median(&mut pick(then, &|r| r.level)).map_or("-".into(), fmt),
                        o.level_tolerance_pct
                    ));
                }
            }
            let slopes = pick(then, &|r| r.slope);
            if let (Some(slope), Some(res)) = (now.slope, now.resolution) {
                if let Some(steepest) = slopes.iter().copied().reduce(f64::max) {
                    if slope > steepest + res {
                        out.regressions.push(format!(
                            "{label}: {name} slope {}/iteration is steeper than the steepest of the last {} passing nights ({}/iteration) by more than this run resolves ({}/iteration)",
                            fmt(slope),
                            slopes.len(),
                            fmt(steepest),
                            fmt(res)
                        ));
                    }
                }
            }
        }
    }
    Ok(out)
}
