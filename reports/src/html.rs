//! report.html: one self-contained page per run (no script, no network, no external font; every
//! plot an inline SVG), readable at laptop and phone widths. It reads top-down the way a person
//! triages a night: the verdict and its one-line story; what the run could not judge; one small
//! plot per metric, failing ones first; where the growth is (heap or outside it, mappings,
//! registries, allocation and insertion sites); the change against a baseline; the environment;
//! the files and the replay command.

use std::fmt::Write;

use crate::env::Environment;
use crate::figures::{fmt_value, of_run, MetricFigures};
use crate::plot::{panel_svg, panels};
use crate::samples::Samples;
use crate::verdict::{MetricVerdict, Status, Verdict};

/// A run to compare against (an earlier night).
pub struct Baseline<'a> {
    /// How the page names it (its directory).
    pub label: String,
    pub samples: &'a Samples,
    pub verdict: &'a Verdict,
}

/// Everything the page shows.
pub struct ReportInput<'a> {
    pub samples: &'a Samples,
    pub verdict: &'a Verdict,
    pub environment: Option<&'a Environment>,
    pub baseline: Option<Baseline<'a>>,
    /// Files beside report.html to link (names only).
    pub files: Vec<String>,
}

/// Text made safe for HTML element content and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "\
body{font:15px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:0;color:#1b1b1b;background:#f6f6f4}\
main{max-width:1240px;margin:0 auto;padding:12px}\
h1{font-size:1.35em;margin:0 0 4px}h2{font-size:1.1em;margin:22px 0 8px}\
.v{padding:14px 16px;border-radius:8px;color:#fff}.v.fail{background:#b3261e}.v.pass{background:#2e6b34}.v.inconclusive{background:#7a5c00}\
.story{font-size:1.05em;margin:0;overflow-wrap:anywhere}figure p{font-size:.86em;margin:4px 0 0;overflow-wrap:anywhere}\
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(300px,1fr));gap:10px}\
figure{margin:0;background:#fff;border:1px solid #d8d8d8;border-radius:6px;padding:8px;min-width:0}\
figure.fail{border:2px solid #b3261e}figure.inconclusive{border:2px solid #c9a227}\
figcaption{font-size:.86em;overflow-wrap:anywhere}figcaption b{font-size:1.05em}\
.badge{display:inline-block;padding:0 6px;border-radius:4px;font-size:.85em;font-weight:600;color:#fff;background:#777}\
.badge.fail{background:#b3261e}.badge.pass{background:#2e6b34}.badge.inconclusive{background:#9a7400}\
svg.plot{width:100%;height:auto;display:block}\
.scroll{overflow-x:auto}table{border-collapse:collapse;width:100%;background:#fff;font-size:.9em}\
td,th{padding:4px 6px;border-bottom:1px solid #e6e6e6;text-align:left;vertical-align:top}\
td.n{text-align:right;white-space:nowrap}.worse{color:#b3261e;font-weight:600}\
code{overflow-wrap:anywhere;background:#eee;padding:0 3px;border-radius:3px}\
.note{background:#fff7de;border-left:4px solid #c9a227;padding:6px 10px;margin:6px 0}\
.legend{font-size:.85em;color:#555}";

fn status_class(s: Option<Status>) -> &'static str {
    match s {
        Some(Status::Fail) => "fail",
        Some(Status::Inconclusive) => "inconclusive",
        Some(Status::Pass) => "pass",
        None => "observed",
    }
}

/// The page, whole.
pub fn report_html(r: &ReportInput) -> Result<String, String> {
    let v = r.verdict;
    let mut h = String::with_capacity(256 * 1024);
    let word = match v.verdict {
        Status::Fail => "FAIL",
        Status::Inconclusive => "INCONCLUSIVE",
        _ => "PASS",
    };
    let title = format!("{word}: {} (seed {})", v.scenario, v.seed);
    let _ = write!(
        h,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>plateau {}</title><style>{STYLE}</style></head><body><main>\n",
        escape(&title)
    );
    let cls = status_class(Some(v.verdict));
    let inj = if v.injections.is_empty() { String::new() } else { format!(", injected: {}", v.injections.join(", ")) };
    let _ = writeln!(
        h,
        "<header class=\"v {cls}\"><h1>{}</h1><p class=\"story\">{}{}</p><p class=\"story\" style=\"font-size:.9em;opacity:.9\">{} iterations ({} warm-up), {} samples, backend {}{}</p></header>",
        escape(&title),
        escape(&v.summary),
        if v.incomplete { " <b>(incomplete: the run was cut short)</b>" } else { "" },
        v.iterations,
        v.warmup_iterations,
        v.samples,
        escape(&v.backend),
        escape(&inj)
    );
    unjudged(&mut h, v);
    metrics(&mut h, r)?;
    where_it_grew(&mut h, v);
    if let Some(b) = &r.baseline {
        baseline(&mut h, r, b);
    }
    environment(&mut h, r.environment);
    let _ = write!(h, "<h2>Files and replay</h2><p>");
    for f in &r.files {
        let _ = write!(h, "<a href=\"{0}\">{0}</a> ", escape(f));
    }
    let _ = write!(
        h,
        "</p><p>Replay: <code>{}</code></p>\n</main></body></html>\n",
        escape(&crate::env::replay_command(v, r.environment))
    );
    Ok(h)
}

/// What the run could not resolve: so a pass is never read as more than it judged.
fn unjudged(h: &mut String, v: &Verdict) {
    let open: Vec<&MetricVerdict> = v.metrics.iter().filter(|m| m.status == Status::Inconclusive).collect();
    if open.is_empty() && v.warnings.is_empty() && !v.incomplete {
        return;
    }
    let _ = write!(h, "<h2>What this run could not judge</h2>");
    if v.incomplete {
        let _ =
            write!(h, "<p class=\"note\">The run was interrupted: its verdict covers only the samples it took.</p>");
    }
    for m in open {
        let _ = write!(h, "<p class=\"note\"><b>{}</b>: {}</p>", escape(&m.name), escape(&m.reason));
    }
    for w in &v.warnings {
        let _ = write!(h, "<p class=\"note\">{}</p>", escape(w));
    }
}

fn metrics(h: &mut String, r: &ReportInput) -> Result<(), String> {
    let v = r.verdict;
    let ps = panels(r.samples, v, |_, _| true);
    let _ = writeln!(
        h,
        "<h2>Metrics ({})</h2><p class=\"legend\">One plot per metric on its own axis, against the iteration at quiescent points. Shaded: warm-up (not judged). Red line: the fitted slope of a failing metric; green: of a passing one. Grey line: a bounded metric's capacity. Counters are not plotted.</p><div class=\"grid\">",
        ps.len()
    );
    for p in &ps {
        let m = v.metrics.iter().find(|m| m.name == p.name);
        let cls = status_class(p.status);
        let badge = p.status_word();
        let slope = p.slope_text().map(|t| format!(" · {t}")).unwrap_or_default();
        let _ = write!(
            h,
            "<figure class=\"{cls}\"><figcaption><b>{}</b> <span class=\"badge {cls}\">{badge}</span> {}{slope}",
            escape(&p.name),
            escape(p.kind.as_str())
        );
        let _ = write!(h, "</figcaption>{}", panel_svg(p)?);
        if let Some(m) = m {
            let mut lines = Vec::new();
            if let Some(k) = m.first_iter.filter(|_| m.status == Status::Fail) {
                lines.push(format!("conclusive at iteration {k}"));
            }
            if let Some(l) = &m.location {
                lines.push(format!("where: {}", escape(l)));
            }
            if m.status != Status::Pass {
                lines.push(escape(&m.reason));
            }
            if !lines.is_empty() {
                let _ = write!(h, "<p>{}</p>", lines.join("<br>"));
            }
        }
        let _ = writeln!(h, "</figure>");
    }
    let _ = writeln!(h, "</div>");
    Ok(())
}

fn where_it_grew(h: &mut String, v: &Verdict) {
    let with_sites: Vec<&MetricVerdict> = v.metrics.iter().filter(|m| !m.sites.is_empty()).collect();
    if v.attribution.is_empty() && with_sites.is_empty() {
        return;
    }
    let _ = write!(h, "<h2>Where it grew</h2><ul>");
    for a in &v.attribution {
        let _ = write!(h, "<li>{}</li>", escape(a));
    }
    let _ = write!(h, "</ul>");
    for m in with_sites {
        if m.sites.iter().any(|s| s.kind.is_some()) {
            judged_sites(h, m);
            continue;
        }
        let _ = write!(
            h,
            "<p><b>{}</b>: sites</p><div class=\"scroll\"><table><tr><th>site</th><th>bytes/iteration</th><th>bytes/request</th><th>objects/iteration</th><th>entries left</th><th>oldest from iteration</th></tr>",
            escape(&m.name)
        );
        for s in &m.sites {
            let num = |x: Option<f64>, unit: &str| x.map(|x| fmt_value(x, unit)).unwrap_or_default();
            let _ = write!(
                h,
                "<tr><td><code>{}</code></td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
                escape(&s.place()),
                num(s.bytes_per_iter, "bytes"),
                num(s.bytes_per_request, "bytes"),
                s.objects_per_iter.map(|x| format!("{x:.1}")).unwrap_or_default(),
                s.count.map(|x| x.to_string()).unwrap_or_default(),
                s.oldest_iter.map(|x| x.to_string()).unwrap_or_default(),
            );
        }
        let _ = write!(h, "</table></div>");
    }
}

/// A gauge's allocation sites, each judged by its own series: what it is, its rate, its share of
/// the gauge's growth, what it holds and where a fill levels off.
fn judged_sites(h: &mut String, m: &MetricVerdict) {
    let explained =
        m.explained_share.map(|x| format!(", {:.0}% of its growth explained", 100.0 * x)).unwrap_or_default();
    let _ = write!(
        h,
        "<p><b>{}</b>: allocation sites{}</p><div class=\"scroll\"><table><tr><th>site</th><th>kind</th><th>bytes/request</th><th>share</th><th>held</th><th>levels at</th></tr>",
        escape(&m.name),
        escape(&explained)
    );
    for s in &m.sites {
        let num = |x: Option<f64>| x.map(|x| fmt_value(x, "bytes")).unwrap_or_default();
        let _ = write!(
            h,
            "<tr><td><code>{}</code></td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
            escape(&s.place()),
            escape(s.kind.as_deref().unwrap_or("")),
            num(s.per_request),
            s.share.map(|x| format!("{:.0}%", 100.0 * x)).unwrap_or_default(),
            num(s.size_bytes),
            num(s.bound_bytes),
        );
    }
    let _ = write!(h, "</table></div>");
}

/// Per metric present in both runs: level and slope, then and now. A change is marked worse when
/// a level rose by more than 10% or a slope turned steeper by more than its own noise floor (the
/// run's resolution): that marks where to look, it is not a verdict (`plateau history check` is).
fn baseline(h: &mut String, r: &ReportInput, b: &Baseline) {
    let (v, bv) = (r.verdict, b.verdict);
    let _ = write!(
        h,
        "<h2>Against the baseline</h2><p>Baseline: <code>{}</code>, {} (seed {}), verdict {}.</p>",
        escape(&b.label),
        escape(&bv.scenario),
        bv.seed,
        bv.verdict.as_str()
    );
    if bv.scenario != v.scenario {
        let _ = write!(
            h,
            "<p class=\"note\">The baseline ran scenario <b>{}</b>, this run <b>{}</b>: only the metrics both have are compared, and their levels may differ for that reason alone.</p>",
            escape(&bv.scenario),
            escape(&v.scenario)
        );
    }
    let now = of_run(r.samples, v);
    let then = of_run(b.samples, bv);
    let _ = write!(h, "<div class=\"scroll\"><table><tr><th>metric</th><th>level then</th><th>level now</th><th>change</th><th>slope then /it</th><th>slope now /it</th></tr>");
    let mut rows: Vec<(&MetricFigures, &MetricFigures)> =
        now.iter().filter_map(|n| then.iter().find(|t| t.name == n.name).map(|t| (n, t))).collect();
    rows.sort_by(|a, b| {
        crate::figures::report_rank(a.0.status)
            .cmp(&crate::figures::report_rank(b.0.status))
            .then(a.0.name.cmp(&b.0.name))
    });
    for (n, t) in &rows {
        let lv = |x: Option<f64>| x.map(|x| fmt_value(x, &n.unit)).unwrap_or("-".into());
        let change = match (t.level, n.level) {
            (Some(a), Some(z)) if a.abs() > 0.0 => {
                let pct = (z - a) / a.abs() * 100.0;
                let cls = if pct > 10.0 { " class=\"n worse\"" } else { " class=\"n\"" };
                format!("<td{cls}>{pct:+.1}%</td>")
            }
            (Some(a), Some(z)) => format!("<td class=\"n\">{}</td>", fmt_value(z - a, &n.unit)),
            _ => "<td class=\"n\">-</td>".into(),
        };
        let resolution = v
            .metrics
            .iter()
            .find(|m| m.name == n.name)
            .and_then(|m| m.trend.as_ref())
            .and_then(|t| t.resolution_per_iter);
        let steeper =
            matches!((t.slope_per_iter, n.slope_per_iter, resolution), (Some(a), Some(z), Some(res)) if z - a > res);
        let _ = write!(
            h,
            "<tr><td><code>{}</code></td><td class=\"n\">{}</td><td class=\"n\">{}</td>{change}<td class=\"n\">{}</td><td class=\"n{}\">{}</td></tr>",
            escape(&n.name),
            lv(t.level),
            lv(n.level),
            lv(t.slope_per_iter),
            if steeper { " worse" } else { "" },
            lv(n.slope_per_iter),
        );
    }
    let _ = write!(h, "</table></div>");
    let only: Vec<&str> =
        now.iter().filter(|n| !then.iter().any(|t| t.name == n.name)).map(|n| n.name.as_str()).collect();
    if !only.is_empty() {
        let _ = write!(h, "<p class=\"legend\">Not in the baseline: {}</p>", escape(&only.join(", ")));
    }
}

fn environment(h: &mut String, env: Option<&Environment>) {
    let _ = write!(h, "<h2>Environment</h2>");
    let Some(env) = env else {
        let _ = write!(h, "<p class=\"note\">No environment.json beside the samples (a run of an older plateau, or samples from another tool): commit, machine and GPU unknown.</p>");
        return;
    };
    let _ = write!(h, "<div class=\"scroll\"><table>");
    for (k, val) in env.rows() {
        let _ = write!(h, "<tr><th>{k}</th><td>{}</td></tr>", escape(&val));
    }
    let _ = write!(h, "</table></div>");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::{MetricVerdict, Trend, VERDICT_SCHEMA};

    fn samples(scenario: &str) -> Samples {
        let mut t = format!(
            "{{\"schema\":\"plateau.samples.v1\",\"scenario\":\"{scenario}\",\"seed\":3,\"backend\":\"cpu\",\"metrics\":{{\"a.flat\":{{\"kind\":\"gauge\",\"unit\":\"bytes\"}},\"m.mid\":{{\"kind\":\"gauge\",\"unit\":\"bytes\"}},\"z.leak\":{{\"kind\":\"gauge\",\"unit\":\"count\"}}}}}}\n"
        );
        for i in 1..=50 {
            t.push_str(&format!(
                "{{\"t\":{i},\"iter\":{i},\"quiescent\":true,\"values\":{{\"a.flat\":4096,\"m.mid\":8192,\"z.leak\":{i}}}}}\n"
            ));
        }
        Samples::parse(t.as_bytes(), std::path::Path::new("s.jsonl")).unwrap()
    }

    fn metric(name: &str, unit: &str, status: Status, slope: f64) -> MetricVerdict {
        let trend = Trend {
            slope_per_iter: slope,
            slope_per_hour: slope * 3600.0,
            growth_after_warmup: slope * 30.0,
            tail_slope_per_iter: slope,
            test: "mann-kendall/hamed-rao".into(),
            z: 0.0,
            p_value: 0.5,
            tail_p_value: 0.5,
            points: 30,
            quantum: 1.0,
            noise: 0.0,
            resolution_per_iter: Some(0.1),
            resolution_per_request: None,
            tolerance_per_iter: 0.0,
            noise_resolution_per_iter: None,
        };
        MetricVerdict {
            name: name.into(),
            kind: "gauge".into(),
            unit: unit.into(),
            status,
            reason: format!("{name} <reason>"),
            first_iter: Some(25),
            trend: Some(trend),
            capacity: None,
            max_value: None,
            location: None,
            projected: None,
            sites: vec![],
            needs_iterations: None,
            explained_share: None,
        }
    }

    fn verdict(scenario: &str) -> Verdict {
        Verdict {
            schema: VERDICT_SCHEMA.into(),
            verdict: Status::Fail,
            incomplete: false,
            scenario: scenario.into(),
            seed: 3,
            backend: "cpu".into(),
            injections: vec!["registry-retains-finished".into()],
            iterations: 50,
            warmup_iterations: 20,
            samples: 50,
            summary: "fail: z.leak".into(),
            attribution: vec!["registry: z.leak kept entries".into()],
            requests_per_iter: None,
            seconds_per_iter: None,
            tolerance: String::new(),
            planned_iterations: None,
            overrides: vec![],
            warnings: vec![],
            target_exit: None,
            settle_timeouts: 0,
            control: None,
            evidence: None,
            known: Vec::new(),
            metrics: vec![
                MetricVerdict { first_iter: Some(30), ..metric("a.flat", "bytes", Status::Fail, 0.0) },
                metric("m.mid", "bytes", Status::Pass, 0.0),
                metric("z.leak", "count", Status::Fail, 1.0),
            ],
        }
    }

    #[test]
    fn the_page_puts_the_verdict_and_failing_metrics_first_and_loads_nothing() {
        let (s, v) = (samples("n-sampling"), verdict("n-sampling"));
        let (bs, bv) = (samples("mixed"), verdict("mixed"));
        let page = report_html(&ReportInput {
            samples: &s,
            verdict: &v,
            environment: None,
            baseline: Some(Baseline { label: "runs/last-night".into(), samples: &bs, verdict: &bv }),
            files: vec!["samples.jsonl".into()],
        })
        .unwrap();
        let at = |needle: &str| page.find(needle).unwrap_or_else(|| panic!("no `{needle}` in the page"));
        assert!(at("FAIL: n-sampling (seed 3)") < at("<b>z.leak</b>"), "the verdict is not first");
        // Failing first, the earliest conclusive (iteration 25) before the later one (30).
        assert!(at("<b>z.leak</b>") < at("<b>a.flat</b>"), "the earliest failure is not first");
        assert!(at("<b>a.flat</b>") < at("<b>m.mid</b>"), "a passing metric comes before a failing one");
        assert!(page.contains("z.leak &lt;reason&gt;"), "text is not escaped");
        assert!(page.contains("baseline ran scenario <b>mixed</b>"), "another scenario's baseline is not said");
        assert!(page.contains(
            "Replay: <code>plateau run n-sampling --seed 3 --inject registry-retains-finished --iterations 50</code>"
        ));
        assert!(page.contains("No environment.json"));
        assert_eq!(page.matches("<svg").count(), 3, "one plot per metric");
        for bad in ["<script", "src=\"http", "href=\"http", "@import", "url("] {
            assert!(!page.contains(bad), "the page has `{bad}`");
        }
    }
}
