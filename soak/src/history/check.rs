//! `history check`: the latest night of each scenario (and set of injections) against its last N
//! passing nights. A gauge regressed when
//! - its level rose past the tolerance over the median of those nights *and* past the highest of
//!   them: night-to-night noise stays inside the range the passing nights already spanned, so
//!   only a move out of it, and by more than the stated fraction, is called a regression;
//! - its slope rose past the steepest of those nights by more than the latest run's resolution
//!   (the smallest steady growth that run can tell from noise, see the verdict's trend): a slope
//!   within that margin is indistinguishable from the nights it is compared with.
//!
//! The latest night's own verdict is not re-judged here; a failing night already failed its job.

use std::path::Path;

use plateau_reports::figures::{fmt_value, median};
use rusqlite::{params, Connection};

use super::{db_err, HistoryError};

/// How `check` judges.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// Passing nights to compare with (the most recent ones before the latest).
    pub last: usize,
    /// Allowed rise of a level over the median of those nights, in percent.
    pub level_tolerance_pct: f64,
}

impl Default for CheckOptions {
    fn default() -> Self {
        // A week of nights; 10%: the levels of plateau's clean n-sampling runs across seeds 1-5
        // stay within a few percent of each other (see the note on the nightly issue), so a rise
        // of a tenth that also leaves the range of the last week is beyond seed-to-seed noise.
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
        let before: Vec<i64> = list[1..].iter().filter(|r| r.2 == "pass").take(o.last).map(|r| r.0).collect();
        if before.is_empty() {
            out.compared.push(format!(
                "{label}: latest night {started} has no passing night before it to compare with (not judged)"
            ));
            continue;
        }
        out.groups_judged += 1;
        out.compared
            .push(format!("{label}: latest night {started} against the {} passing nights before it", before.len()));
        let then: Vec<Vec<(String, Row)>> = before.iter().map(|id| gauges(c, db, *id)).collect::<Result<_, _>>()?;
        for (name, now) in gauges(c, db, *latest)? {
            let pick = |f: &dyn Fn(&Row) -> Option<f64>| -> Vec<f64> {
                then.iter().filter_map(|night| night.iter().find(|(n, _)| *n == name).and_then(|(_, r)| f(r))).collect()
            };
            let fmt = |x: f64| fmt_value(x, &now.unit);
            let levels = pick(&|r| r.level);
            if let (Some(level), Some(mid)) = (now.level, median(&mut levels.clone())) {
                let highest = levels.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let limit = mid + mid.abs() * o.level_tolerance_pct / 100.0;
                if level > limit && level > highest {
                    let pct = if mid.abs() > 0.0 {
                        format!("{:+.1}%", (level - mid) / mid.abs() * 100.0)
                    } else {
                        "up from 0".into()
                    };
                    out.regressions.push(format!(
                        "{label}: {name} level {} is {pct} over the median {} of the last {} passing nights (highest {}); tolerance {}%",
                        fmt(level),
                        fmt(mid),
                        levels.len(),
                        fmt(highest),
                        o.level_tolerance_pct
                    ));
                }
            }
            let slopes = pick(&|r| r.slope);
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
