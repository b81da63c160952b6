//! `history show`: the trend across nights, per scenario, as markdown tables on stdout (readable
//! in a terminal and in a CI job summary) and as one self-contained HTML page.

use std::fmt::Write;
use std::path::Path;

use plateau_reports::figures::fmt_value;
use plateau_reports::html::escape;
use rusqlite::{params, Connection};

use super::{db_err, HistoryError};

/// One stored run, as the trend lists it.
#[derive(Debug, Clone)]
pub struct Night {
    pub id: i64,
    pub started_utc: String,
    pub commit: String,
    pub scenario: String,
    pub seed: u64,
    pub injections: String,
    pub verdict: String,
    pub failing: Vec<String>,
}

/// A metric's values across the nights of a scenario (None where a night lacks it).
#[derive(Debug, Clone)]
pub struct MetricTrend {
    pub name: String,
    pub unit: String,
    pub levels: Vec<Option<f64>>,
    pub slopes: Vec<Option<f64>>,
    pub statuses: Vec<Option<String>>,
}

/// Filters of `history show`.
#[derive(Debug, Clone, Default)]
pub struct ShowFilter {
    pub scenario: Option<String>,
    pub metric: Option<String>,
    /// The last N nights per scenario (0: all).
    pub last: usize,
}

/// Nights of each scenario, oldest first, scenarios by name.
pub fn nights(c: &Connection, db: &Path, f: &ShowFilter) -> Result<Vec<(String, Vec<Night>)>, HistoryError> {
    let mut stmt = c
        .prepare(
            "SELECT r.id, r.started_utc, r.commit_id, r.scenario, r.seed, r.injections, r.verdict,
                    (SELECT group_concat(name, ' ') FROM metrics m WHERE m.run_id = r.id AND m.status = 'fail')
             FROM runs r WHERE (?1 IS NULL OR r.scenario = ?1) ORDER BY r.scenario, r.started_utc, r.id",
        )
        .map_err(|e| db_err(db, e))?;
    let rows = stmt
        .query_map(params![f.scenario], |r| {
            Ok(Night {
                id: r.get(0)?,
                started_utc: r.get(1)?,
                commit: r.get(2)?,
                scenario: r.get(3)?,
                seed: r.get::<_, i64>(4)? as u64,
                injections: r.get(5)?,
                verdict: r.get(6)?,
                failing: r
                    .get::<_, Option<String>>(7)?
                    .map(|s| s.split(' ').map(String::from).collect())
                    .unwrap_or_default(),
            })
        })
        .map_err(|e| db_err(db, e))?;
    let mut out: Vec<(String, Vec<Night>)> = Vec::new();
    for n in rows {
        let n = n.map_err(|e| db_err(db, e))?;
        match out.last_mut() {
            Some((s, v)) if *s == n.scenario => v.push(n),
            _ => out.push((n.scenario.clone(), vec![n])),
        }
    }
    for (_, v) in &mut out {
        if f.last > 0 && v.len() > f.last {
            v.drain(..v.len() - f.last);
        }
    }
    if let Some(s) = &f.scenario {
        if out.is_empty() {
            return Err(HistoryError::Input(format!("--scenario {s}: no run of it in {}", db.display())));
        }
    }
    Ok(out)
}

/// The trends of the metrics of `nights`: the one named by the filter, else every gauge.
pub fn trends(
    c: &Connection,
    db: &Path,
    nights: &[Night],
    metric: Option<&str>,
) -> Result<Vec<MetricTrend>, HistoryError> {
    let mut stmt = c
        .prepare_cached(
            "SELECT name, unit, level, slope_per_iter, status FROM metrics
             WHERE run_id = ?1 AND (?2 IS NULL OR name = ?2) AND (?2 IS NOT NULL OR kind = 'gauge') ORDER BY name",
        )
        .map_err(|e| db_err(db, e))?;
    let mut out: Vec<MetricTrend> = Vec::new();
    for (k, n) in nights.iter().enumerate() {
        let rows = stmt
            .query_map(params![n.id, metric], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
            })
            .map_err(|e| db_err(db, e))?;
        for row in rows {
            let (name, unit, level, slope, status): (String, String, Option<f64>, Option<f64>, Option<String>) =
                row.map_err(|e| db_err(db, e))?;
            let i = match out.binary_search_by(|t| t.name.cmp(&name)) {
                Ok(i) => i,
                Err(i) => {
                    let blank = vec![None; nights.len()];
                    out.insert(
                        i,
                        MetricTrend {
                            name,
                            unit,
                            levels: blank.clone(),
                            slopes: blank,
                            statuses: vec![None; nights.len()],
                        },
                    );
                    i
                }
            };
            out[i].levels[k] = level;
            out[i].slopes[k] = slope;
            out[i].statuses[k] = status;
        }
    }
    Ok(out)
}

fn night_label(n: &Night) -> String {
    let inj = if n.injections.is_empty() { String::new() } else { format!(" +{}", n.injections) };
    format!("{} {} seed {}{inj}", n.started_utc, n.commit, n.seed)
}

/// Markdown: per scenario a table of nights (verdict, failing metrics) and, with `--metric`, its
/// level and slope per night; without, each gauge's first and last level and slope.
pub fn markdown(c: &Connection, db: &Path, f: &ShowFilter) -> Result<String, HistoryError> {
    let all = nights(c, db, f)?;
    let mut out = String::new();
    let total: usize = all.iter().map(|(_, v)| v.len()).sum();
    let _ = writeln!(out, "## plateau history: {total} runs of {} scenarios ({})\n", all.len(), db.display());
    for (scenario, ns) in &all {
        let failed = ns.iter().filter(|n| n.verdict == "fail").count();
        let _ = writeln!(out, "### {scenario}: {} nights, {failed} failed\n", ns.len());
        let ts = trends(c, db, ns, f.metric.as_deref())?;
        if let Some(m) = &f.metric {
            let Some(t) = ts.first() else {
                let _ = writeln!(out, "No metric `{m}` in these runs.\n");
                continue;
            };
            let _ =
                writeln!(out, "| night | verdict | `{m}` level | slope/iteration | status |\n|---|---|---|---|---|");
            for (k, n) in ns.iter().enumerate() {
                let v = |x: Option<f64>| x.map(|x| fmt_value(x, &t.unit)).unwrap_or("-".into());
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {} |",
                    night_label(n),
                    n.verdict,
                    v(t.levels[k]),
                    v(t.slopes[k]),
                    t.statuses[k].as_deref().unwrap_or("-")
                );
            }
            out.push('\n');
            continue;
        }
        let _ = writeln!(out, "| night | verdict | failing metrics |\n|---|---|---|");
        for n in ns {
            let _ = writeln!(out, "| {} | {} | {} |", night_label(n), n.verdict, n.failing.join(", "));
        }
        let _ = writeln!(
            out,
            "\n| gauge | level first night | level last night | slope first | slope last |\n|---|---|---|---|---|"
        );
        for t in &ts {
            let first = t.levels.iter().position(Option::is_some);
            let last = t.levels.iter().rposition(Option::is_some);
            let v = |x: Option<Option<f64>>| x.flatten().map(|x| fmt_value(x, &t.unit)).unwrap_or("-".into());
            let _ = writeln!(
                out,
                "| `{}` | {} | {} | {} | {} |",
                t.name,
                v(first.map(|i| t.levels[i])),
                v(last.map(|i| t.levels[i])),
                v(first.map(|i| t.slopes[i])),
                v(last.map(|i| t.slopes[i]))
            );
        }
        out.push('\n');
    }
    Ok(out)
}

/// A line of `values` (None: gaps) as an inline SVG sparkline, `w` x `h` pixels.
fn sparkline(values: &[Option<f64>], w: f64, h: f64) -> String {
    let known: Vec<f64> = values.iter().flatten().copied().collect();
    let (lo, hi) = known.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |a, &x| (a.0.min(x), a.1.max(x)));
    let span = if hi > lo { hi - lo } else { 1.0 };
    let step = if values.len() > 1 { (w - 4.0) / (values.len() - 1) as f64 } else { 0.0 };
    let mut pts = String::new();
    for (i, v) in values.iter().enumerate() {
        if let Some(v) = v {
            let _ = write!(pts, "{:.1},{:.1} ", 2.0 + i as f64 * step, h - 2.0 - (v - lo) / span * (h - 4.0));
        }
    }
    format!(
        "<svg viewBox=\"0 0 {w} {h}\" class=\"spark\" role=\"img\"><polyline fill=\"none\" stroke=\"#1f63b4\" stroke-width=\"1.5\" points=\"{}\"/></svg>",
        pts.trim_end()
    )
}

/// The HTML page: per scenario, a strip of verdicts (one cell per night, red when it failed) and
/// per gauge a sparkline of its level and of its slope across nights.
pub fn html(c: &Connection, db: &Path, f: &ShowFilter) -> Result<String, HistoryError> {
    let all = nights(c, db, f)?;
    let mut h = String::from(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>plateau history</title><style>\
body{font:15px/1.45 system-ui,sans-serif;margin:0;background:#f6f6f4;color:#1b1b1b}main{max-width:1240px;margin:0 auto;padding:12px}\
.strip{display:flex;flex-wrap:wrap;gap:1px}.strip span{width:8px;height:18px;background:#2e6b34}.strip span.fail{background:#b3261e}.strip span.inconclusive{background:#c9a227}\
.scroll{overflow-x:auto}table{border-collapse:collapse;width:100%;background:#fff;font-size:.9em}td,th{padding:4px 6px;border-bottom:1px solid #e6e6e6;text-align:left}\
svg.spark{width:220px;height:36px;display:block}code{overflow-wrap:anywhere}</style></head><body><main><h1>plateau history</h1>\n",
    );
    for (scenario, ns) in &all {
        let failed = ns.iter().filter(|n| n.verdict == "fail").count();
        let _ = write!(h, "<h2>{}: {} nights, {failed} failed</h2><div class=\"strip\">", escape(scenario), ns.len());
        for n in ns {
            let _ = write!(
                h,
                "<span class=\"{}\" title=\"{}: {}\"></span>",
                escape(&n.verdict),
                escape(&night_label(n)),
                escape(&n.verdict)
            );
        }
        let _ = write!(
            h,
            "</div><p>From {} to {}.</p><div class=\"scroll\"><table><tr><th>metric</th><th>level across nights</th><th>last level</th><th>slope/iteration across nights</th><th>last slope</th></tr>",
            escape(&ns[0].started_utc),
            escape(&ns[ns.len() - 1].started_utc)
        );
        for t in trends(c, db, ns, f.metric.as_deref())? {
            let last = |v: &[Option<f64>]| {
                v.iter().rev().flatten().next().map(|x| fmt_value(*x, &t.unit)).unwrap_or("-".into())
            };
            let _ = write!(
                h,
                "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&t.name),
                sparkline(&t.levels, 220.0, 36.0),
                last(&t.levels),
                sparkline(&t.slopes, 220.0, 36.0),
                last(&t.slopes)
            );
        }
        let _ = writeln!(h, "</table></div>");
    }
    h.push_str("</main></body></html>\n");
    Ok(h)
}
