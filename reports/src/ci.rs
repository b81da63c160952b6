//! What CI systems read from runs: GitHub's job-summary markdown (`--summary-md`) and JUnit XML
//! (`--junit`), one testsuite per run and one testcase per judged metric.
//!
//! A metric that failed is a JUnit failure carrying its reason; one too short to judge
//! (inconclusive) is skipped, never passed; shown-only (`observed`) metrics are left out. The run's
//! own verdict is the first testcase of its suite, so a CI view that lists cases shows it first.

use std::fmt::Write;

use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestSuite};

use crate::verdict::{MetricVerdict, Status, Verdict};

/// One run as CI sees it: its verdict, where it is, and how to replay it.
pub struct RunRef<'a> {
    pub verdict: &'a Verdict,
    /// The run's directory as a reader should reach it (a path relative to the workspace, or a
    /// URL of the uploaded artifact).
    pub dir: String,
    pub replay: Option<String>,
}

fn status_word(s: Status) -> &'static str {
    match s {
        Status::Pass => "pass",
        Status::Inconclusive => "inconclusive",
        Status::Fail => "FAIL",
    }
}

/// The suite name of a run: scenario, seed, injections.
fn suite_name(v: &Verdict) -> String {
    let inj: String = v.injections.iter().map(|i| format!(" +{i}")).collect();
    format!("{} (seed {}){inj}", v.scenario, v.seed)
}

/// Table cells hold no pipes or line breaks.
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// GitHub job-summary markdown for `runs`: per run its verdict and one-line story, a table of its
/// failing metrics, what it could not judge, links to its files and its replay command.
pub fn summary_markdown(runs: &[RunRef]) -> String {
    let mut out = String::new();
    let failed = runs.iter().filter(|r| r.verdict.failed()).count();
    let noun = if runs.len() == 1 { "run" } else { "runs" };
    let _ = writeln!(out, "## plateau: {} {noun}, {failed} failed\n", runs.len());
    for r in runs {
        let v = r.verdict;
        let incomplete = if v.incomplete { " (incomplete)" } else { "" };
        let _ = writeln!(out, "### {}: {}{incomplete}\n", suite_name(v), status_word(v.verdict));
        let _ = writeln!(out, "{}\n", cell(&v.summary));
        let failing: Vec<&MetricVerdict> = v.metrics.iter().filter(|m| m.status == Status::Fail).collect();
        if !failing.is_empty() {
            let _ = writeln!(out, "| metric | kind | from iteration | where | why |\n|---|---|---|---|---|");
            for m in failing {
                let first = m.first_iter.map(|i| i.to_string()).unwrap_or_default();
                let at = m.location.as_deref().unwrap_or("");
                let _ = writeln!(out, "| `{}` | {} | {first} | {} | {} |", m.name, m.kind, cell(at), cell(&m.reason));
            }
            out.push('\n');
        }
        let unjudged: Vec<&str> =
            v.metrics.iter().filter(|m| m.status == Status::Inconclusive).map(|m| m.name.as_str()).collect();
        if !unjudged.is_empty() {
            let _ = writeln!(out, "Not judged (too little evidence): {}\n", unjudged.join(", "));
        }
        for line in &v.attribution {
            let _ = writeln!(out, "- {}", cell(line));
        }
        if !v.attribution.is_empty() {
            out.push('\n');
        }
        let d = &r.dir;
        let _ = writeln!(out, "Files: [verdict.json]({d}/verdict.json), [samples.jsonl]({d}/samples.jsonl), [memory]({d}/memory.svg), [counts]({d}/counts.svg)\n");
        if let Some(cmd) = &r.replay {
            let _ = writeln!(out, "Replay: `{cmd}`\n");
        }
    }
    out
}

/// A JUnit report of `runs`: a suite per run, its verdict first, then a case per judged metric.
pub fn junit(runs: &[RunRef]) -> Result<String, String> {
    let mut report = Report::new("plateau");
    for r in runs {
        let v = r.verdict;
        let mut suite = TestSuite::new(suite_name(v));
        let mut overall = case("verdict", v.verdict, &v.summary);
        if let Some(cmd) = &r.replay {
            overall.set_system_out(format!("replay: {cmd}\nrun: {}", r.dir));
        }
        suite.add_test_case(overall);
        for m in v.metrics.iter().filter(|m| m.kind != "observed") {
            let mut c = case(&m.name, m.status, &m.reason);
            c.set_classname(format!("{}.{}", v.scenario, m.kind));
            suite.add_test_case(c);
        }
        report.add_test_suite(suite);
    }
    report.to_string().map_err(|e| format!("JUnit XML: {e}"))
}

/// One check of a list that is not a run's metrics (a selftest case): it held or not, and why.
pub struct Check {
    pub name: String,
    /// What went wrong; None when the check held.
    pub problem: Option<String>,
    /// Figures of a check that held (where it caught the leak, the run's summary).
    pub detail: String,
    pub secs: f64,
}

/// JUnit for a list of checks: one suite, a case per check.
pub fn checks_junit(suite_name: &str, checks: &[Check]) -> Result<String, String> {
    let mut report = Report::new("plateau");
    let mut suite = TestSuite::new(suite_name.to_string());
    for c in checks {
        let mut tc = match &c.problem {
            None => TestCase::new(c.name.clone(), TestCaseStatus::success()),
            Some(p) => {
                let mut s = TestCaseStatus::non_success(NonSuccessKind::Failure);
                s.set_message(p.clone());
                TestCase::new(c.name.clone(), s)
            }
        };
        tc.set_time(std::time::Duration::from_secs_f64(c.secs.max(0.0)));
        if !c.detail.is_empty() {
            tc.set_system_out(c.detail.clone());
        }
        suite.add_test_case(tc);
    }
    report.add_test_suite(suite);
    report.to_string().map_err(|e| format!("JUnit XML: {e}"))
}

/// Job-summary markdown for a list of checks: a count and a table, failures first.
pub fn checks_markdown(title: &str, checks: &[Check]) -> String {
    let failed = checks.iter().filter(|c| c.problem.is_some()).count();
    let mut out = format!(
        "## {title}: {} passed, {failed} failed\n\n| check | result | seconds |\n|---|---|---|\n",
        checks.len() - failed
    );
    let mut ordered: Vec<&Check> = checks.iter().collect();
    ordered.sort_by_key(|c| c.problem.is_none());
    for c in ordered {
        let result = match &c.problem {
            Some(p) => format!("FAIL: {}", cell(p)),
            None => format!("ok: {}", cell(&c.detail)),
        };
        let _ = writeln!(out, "| {} | {result} | {:.1} |", cell(&c.name), c.secs);
    }
    out
}

fn case(name: &str, status: Status, reason: &str) -> TestCase {
    let s = match status {
        Status::Pass => TestCaseStatus::success(),
        Status::Inconclusive => {
            let mut s = TestCaseStatus::skipped();
            s.set_message(format!("inconclusive: {reason}"));
            s
        }
        Status::Fail => {
            let mut s = TestCaseStatus::non_success(NonSuccessKind::Failure);
            s.set_message(reason.to_string());
            s.set_type("growth");
            s
        }
    };
    TestCase::new(name.to_string(), s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::VERDICT_SCHEMA;

    fn metric(name: &str, kind: &str, status: Status, reason: &str) -> MetricVerdict {
        MetricVerdict {
            name: name.into(),
            kind: kind.into(),
            unit: "count".into(),
            status,
            reason: reason.into(),
            first_iter: (status == Status::Fail).then_some(3),
            trend: None,
            capacity: None,
            max_value: None,
            location: None,
            projected: None,
            sites: Vec::new(),
            needs_iterations: None,
            explained_share: None,
        }
    }

    fn verdict() -> Verdict {
        Verdict {
            schema: VERDICT_SCHEMA.into(),
            verdict: Status::Fail,
            incomplete: false,
            scenario: "n-sampling".into(),
            seed: 7,
            backend: "cpu".into(),
            injections: vec!["registry-retains-finished".into()],
            iterations: 30,
            warmup_iterations: 20,
            samples: 31,
            summary: "fail: registry.requests".into(),
            attribution: vec!["registry: registry.requests kept entries | past".into()],
            requests_per_iter: None,
            seconds_per_iter: None,
            tolerance: "1B/request".into(),
            planned_iterations: None,
            overrides: vec![],
            warnings: Vec::new(),
            target_exit: None,
            settle_timeouts: 0,
            control: None,
            evidence: None,
            known: Vec::new(),
            metrics: vec![
                metric("registry.requests", "per_request", Status::Fail, "20 entries left"),
                metric("proc.rss", "gauge", Status::Inconclusive, "only 10 points"),
                metric("jemalloc.allocated", "gauge", Status::Pass, "flat"),
                metric("jemalloc.retained", "observed", Status::Pass, "shown"),
            ],
        }
    }

    #[test]
    fn junit_fails_the_metric_and_skips_what_it_could_not_judge() {
        let v = verdict();
        let x = junit(&[RunRef { verdict: &v, dir: "runs/a".into(), replay: Some("plateau run n-sampling".into()) }])
            .unwrap();
        assert!(x.contains(r#"tests="4" failures="2""#), "{x}");
        assert!(x.contains(r#"<testcase name="registry.requests" classname="n-sampling.per_request">"#), "{x}");
        assert!(x.contains("<skipped message=\"inconclusive: only 10 points\"/>"), "{x}");
        assert!(!x.contains("jemalloc.retained"), "observed metrics are not cases: {x}");
    }

    #[test]
    fn checks_fail_with_their_problem_and_list_failures_first() {
        let checks = [
            Check { name: "n-sampling".into(), problem: None, detail: "pass".into(), secs: 1.0 },
            Check {
                name: "aborts + x".into(),
                problem: Some("exit 0, want 1".into()),
                detail: String::new(),
                secs: 2.0,
            },
        ];
        let x = checks_junit("selftest", &checks).unwrap();
        assert!(x.contains(r#"tests="2" failures="1""#), "{x}");
        assert!(x.contains(r#"<failure message="exit 0, want 1"/>"#), "{x}");
        let md = checks_markdown("plateau selftest", &checks);
        assert!(md.starts_with("## plateau selftest: 1 passed, 1 failed"), "{md}");
        assert!(md.find("aborts + x").unwrap() < md.find("n-sampling").unwrap(), "{md}");
    }

    #[test]
    fn the_summary_tables_failing_metrics_and_names_what_was_not_judged() {
        let v = verdict();
        let md =
            summary_markdown(&[RunRef { verdict: &v, dir: "runs/a".into(), replay: Some("plateau run x".into()) }]);
        assert!(md.contains("## plateau: 1 run, 1 failed"), "{md}");
        assert!(md.contains("### n-sampling (seed 7) +registry-retains-finished: FAIL"), "{md}");
        assert!(md.contains("| `registry.requests` | per_request | 3 |"), "{md}");
        assert!(md.contains("Not judged (too little evidence): proc.rss"), "{md}");
        assert!(md.contains("kept entries \\| past"), "pipes escaped in tables and lists: {md}");
        assert!(md.contains("Replay: `plateau run x`"), "{md}");
    }
}
