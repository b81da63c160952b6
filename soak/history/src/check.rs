//! `history check`: each scenario's nights as a series, judged from a baseline night.
//!
//! Lifecycle: `history pin RUN_DIR` names the night a group (a scenario and its injections) is
//! measured from; without a pin, the group's first complete passing night is its baseline. Check
//! takes the complete nights from the baseline to the latest (an unfinished run measures no
//! night) and, for each gauge of the latest night, fails it when
//! - it jumped: its level is more than the tolerance above the highest of the nights since the
//!   baseline. Some levels move in allocator-sized steps from night to night with nothing
//!   changed: over four clean n-sampling runs of one seed, jemalloc.metadata sat at 1.54 or 2.07 MB
//!   (a 512 KiB base block, 29%), jemalloc.resident at 6.79 or 7.32 MB (7%), and the page tables
//!   moved 21%; a step the nights since the baseline have already shown is not a regression;
//! - it creeps: over at least [`MIN_NIGHTS`] nights since the baseline the levels rise (Theil–Sen
//!   slope above zero and a Mann–Kendall test below [`CREEP_P`], the run detector's statistics)
//!   and the latest is more than the tolerance above the baseline's level. This is measured from
//!   the baseline, never from the highest night: a level that creeps 9% a night never jumps by
//!   10%, but it is 30% above its baseline by the third night after it, and the rise is monotone,
//!   so it fails there; a noisy night does not raise the bar for it;
//! - its slope is steeper than the steepest of the last N passing nights by more than the latest
//!   run's resolution (the smallest steady growth that run can tell from noise): a slope within
//!   that margin is indistinguishable from the nights it is compared with.
//!
//! The latest night's own verdict is not re-judged here, but it is read: a latest night that
//! failed its own verdict is a regression line of its own, and one that could not be judged (too
//! short, unfinished, undecided) leaves its group undecided, never "no regression": the nights
//! before it say nothing about tonight.

use std::path::Path;

use plateau_reports::figures::{fmt_value, median};
use rusqlite::{params, Connection, OptionalExtension};

use plateau_detector::stats::{mann_kendall, theil_sen};

use super::{db_err, HistoryError};

/// Nights a group's series is read from at most: a year of them.
const MAX_NIGHTS: usize = 365;

/// Nights, the baseline included, before a creep can be judged: four monotone nights are the
/// fewest for which Mann–Kendall's one-sided p falls under [`CREEP_P`] (1/24 = 0.042).
pub const MIN_NIGHTS: usize = 4;

/// Significance of a creep across nights. 5%: with four to a dozen nights the test has little
/// power, and a creep is only a regression when its level is also past the tolerance.
pub const CREEP_P: f64 = 0.05;

/// How `check` judges.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// Passing nights (the most recent before the latest) whose slopes the latest is compared with.
    pub last: usize,
    /// Allowed rise of a level above the highest night since the baseline (a jump), or above
    /// the baseline itself (a creep), in percent.
    pub level_tolerance_pct: f64,
}

impl Default for CheckOptions {
    fn default() -> Self {
        // A week of nights. 10%: the heap's live bytes (jemalloc.allocated) of clean n-sampling
        // runs across seeds 1-5 stay within 0.03% of each other, RSS within 1.7%, RssAnon 0.3%;
        // a rise of a tenth is past that; stepped levels jump only past the nights seen.
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
    /// Groups whose latest night could not be judged (inconclusive or unfinished): one line each.
    pub undecided: Vec<String>,
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

/// The group's baseline: its pinned night, else its first complete passing night; with whether
/// it was pinned.
fn baseline(c: &Connection, db: &Path, sc: &str, inj: &str) -> Result<Option<(i64, String, bool)>, HistoryError> {
    let pinned: Option<(i64, String)> = c
        .query_row(
            "SELECT r.id, r.started_utc FROM pins p JOIN runs r ON r.id = p.run_id WHERE p.scenario = ?1 AND p.injections = ?2",
            params![sc, inj],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()
        .map_err(|e| db_err(db, e))?;
    if let Some((id, started)) = pinned {
        return Ok(Some((id, started, true)));
    }
    let first: Option<(i64, String)> = c
        .query_row(
            "SELECT id, started_utc FROM runs WHERE scenario = ?1 AND injections = ?2 AND verdict = 'pass' AND incomplete = 0 ORDER BY started_utc, id LIMIT 1",
            params![sc, inj],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()
        .map_err(|e| db_err(db, e))?;
    Ok(first.map(|(id, started)| (id, started, false)))
}

/// `history pin`: makes the stored run `r` its group's baseline. It must be a complete passing
/// night. Returns what was pinned, for the user.
pub fn pin(c: &Connection, db: &Path, r: &super::store::RunRecord) -> Result<String, HistoryError> {
    let row: Option<(i64, String, String, String, bool, String)> = c
        .query_row(
            "SELECT id, scenario, injections, verdict, incomplete, started_utc FROM runs WHERE samples_sha256 = ?1",
            params![r.samples_sha256],
            |x| Ok((x.get(0)?, x.get(1)?, x.get(2)?, x.get(3)?, x.get(4)?, x.get(5)?)),
        )
        .optional()
        .map_err(|e| db_err(db, e))?;
    let Some((id, sc, inj, verdict, incomplete, started)) = row else {
        return Err(HistoryError::Input(format!(
            "{}: this run is not in {} (`plateau history add {} --db {}` first)",
            r.dir.display(),
            db.display(),
            r.dir.display(),
            db.display()
        )));
    };
    if verdict != "pass" || incomplete {
        return Err(HistoryError::Input(format!(
            "{}: its verdict is {verdict}{}: a baseline must be a complete passing night",
            r.dir.display(),
            if incomplete { " and it did not finish" } else { "" }
        )));
    }
    c.execute(
        "INSERT INTO pins (scenario, injections, run_id) VALUES (?1, ?2, ?3)
         ON CONFLICT (scenario, injections) DO UPDATE SET run_id = excluded.run_id",
        params![sc, inj, id],
    )
    .map_err(|e| db_err(db, e))?;
    let label = if inj.is_empty() { sc } else { format!("{sc} +{inj}") };
    Ok(format!("{label}: the night of {started} is the baseline"))
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
            "SELECT id, started_utc, verdict FROM runs WHERE scenario = ?1 AND injections = ?2 AND incomplete = 0 ORDER BY started_utc DESC, id DESC",
        )
        .map_err(|e| db_err(db, e))?;
    let mut latest = c
        .prepare(
            "SELECT started_utc, verdict, incomplete, summary FROM runs WHERE scenario = ?1 AND injections = ?2 ORDER BY started_utc DESC, id DESC LIMIT 1",
        )
        .map_err(|e| db_err(db, e))?;
    for (sc, inj) in groups {
        let label = if inj.is_empty() { sc.clone() } else { format!("{sc} +{inj}") };
        let (tonight, verdict, incomplete, summary): (String, String, bool, String) = latest
            .query_row(params![sc, inj], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .map_err(|e| db_err(db, e))?;
        if incomplete || verdict == "inconclusive" {
            out.undecided.push(format!(
                "{label}: the latest night {tonight} could not be judged ({summary}): no regression can be ruled out"
            ));
            continue;
        }
        if verdict == "fail" {
            out.regressions.push(format!("{label}: the latest night {tonight} failed its own verdict: {summary}"));
        }
        let list: Vec<(i64, String, String)> = runs
            .query_map(params![sc, inj], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .map_err(|e| db_err(db, e))?
            .take(MAX_NIGHTS)
            .collect::<Result<_, _>>()
            .map_err(|e| db_err(db, e))?;
        let Some((_, started, _)) = list.first() else {
            out.compared.push(format!("{label}: no complete night stored (not judged)"));
            continue;
        };
        let Some((base_id, base_started, pinned)) = baseline(c, db, &sc, &inj)? else {
            out.compared
                .push(format!("{label}: latest night {started} has no passing night to measure from (not judged)"));
            continue;
        };
        // Nights from the baseline to the latest, oldest first.
        let Some(base_at) = list.iter().position(|r| r.0 == base_id) else {
            out.compared.push(format!("{label}: its baseline {base_started} is not among its last {MAX_NIGHTS} complete nights (not judged; pin a newer one)"));
            continue;
        };
        let since: Vec<i64> = list[..=base_at].iter().rev().map(|r| r.0).collect();
        if since.len() < 2 {
            out.compared.push(format!("{label}: latest night {started} is its baseline (not judged)"));
            continue;
        }
        let passing: Vec<i64> = list[1..].iter().filter(|r| r.2 == "pass").map(|r| r.0).collect();
        let before = &passing[..passing.len().min(o.last)];
        out.groups_judged += 1;
        out.compared.push(format!(
            "{label}: latest night {started} against {} nights since its baseline {base_started} ({})",
            since.len() - 1,
            if pinned { "pinned" } else { "its first passing night; `plateau history pin` sets one" }
        ));
        let nights: Vec<Vec<(String, Row)>> = since.iter().map(|id| gauges(c, db, *id)).collect::<Result<_, _>>()?;
        let then: Vec<Vec<(String, Row)>> = before.iter().map(|id| gauges(c, db, *id)).collect::<Result<_, _>>()?;
        compare_gauges(&label, &nights, &then, o, &mut out);
    }
    Ok(out)
}

/// Each gauge of the latest night (the last of `nights`, the nights since the baseline) against
/// the nights before it: a level that jumped past the highest of them, a level that creeps above
/// the baseline night after night, a slope steeper than the steepest of `then` (the last passing
/// nights) by more than the run resolves. Each regression goes into `out`.
fn compare_gauges(
    label: &str,
    nights: &[Vec<(String, Row)>],
    then: &[Vec<(String, Row)>],
    o: &CheckOptions,
    out: &mut CheckOutcome,
) {
    let (now_night, earlier) = nights.split_last().expect("two nights at least");
    for (name, now) in now_night {
        let find = |night: &Vec<(String, Row)>, f: &dyn Fn(&Row) -> Option<f64>| {
            night.iter().find(|(n, _)| n == name).and_then(|(_, r)| f(r))
        };
        let fmt = |x: f64| fmt_value(x, &now.unit);
        let tol = o.level_tolerance_pct / 100.0;
        if let Some(level) = now.level {
            let seen: Vec<f64> = earlier.iter().filter_map(|n| find(n, &|r| r.level)).collect();
            let highest = seen.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let base = find(&nights[0], &|r| r.level);
            if !seen.is_empty() && level > highest + highest.abs() * tol {
                out.regressions.push(format!(
                    "{label}: {name} level {} jumped {} above the highest of the {} nights since the baseline ({}; median {}); tolerance {}%",
                    fmt(level),
                    pct(level, highest),
                    seen.len(),
                    fmt(highest),
                    median(&mut seen.clone()).map_or("-".into(), fmt),
                    o.level_tolerance_pct
                ));
            } else if let Some(base) = base.filter(|b| level > b + b.abs() * tol) {
                let series: Vec<(f64, f64)> = nights
                    .iter()
                    .enumerate()
                    .filter_map(|(k, n)| find(n, &|r| r.level).map(|v| (k as f64, v)))
                    .collect();
                if series.len() >= MIN_NIGHTS {
                    let x: Vec<f64> = series.iter().map(|p| p.0).collect();
                    let y: Vec<f64> = series.iter().map(|p| p.1).collect();
                    let slope = theil_sen(&x, &y);
                    let p = mann_kendall(&x, &y, slope).p_increase;
                    if slope > 0.0 && p < CREEP_P {
                        out.regressions.push(format!(
                            "{label}: {name} level {} creeps {}/night over {} nights (p = {p:.3}), {} above its baseline ({}); tolerance {}%",
                            fmt(level),
                            fmt(slope),
                            series.len(),
                            pct(level, base),
                            fmt(base),
                            o.level_tolerance_pct
                        ));
                    }
                }
            }
        }
        let slopes: Vec<f64> = then.iter().filter_map(|n| find(n, &|r| r.slope)).collect();
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

/// "+12.3%" of `v` over `base`, or "up from 0".
fn pct(v: f64, base: f64) -> String {
    if base.abs() > 0.0 {
        format!("{:+.1}%", (v - base) / base.abs() * 100.0)
    } else {
        "up from 0".into()
    }
}
