//! What a bisect writes for people and tools: bisect.json, story.md (the answer first, then
//! every candidate's verdict, rate and site) and report.html (a link to each candidate's run).

use std::path::Path;

use super::subject::Plan;
use super::{short, BisectOptions, Find, Report, Soaked};

/// bisect.json, story.md and report.html in `--out`.
pub(crate) fn write_outputs(o: &BisectOptions, plan: &Plan, r: &Report) -> Result<(), String> {
    let put = |name: &str, text: String| {
        let p = o.out.join(name);
        plateau_reports::fsutil::write_atomic(&p, text.as_bytes()).map_err(|e| format!("{}: {e}", p.display()))
    };
    put("bisect.json", serde_json::to_string_pretty(r).map_err(|e| e.to_string())? + "\n")?;
    put("story.md", story(o, plan, r))?;
    put("report.html", html(o, r))
}

/// `commit` or `release`.
fn noun(o: &BisectOptions) -> &'static str {
    if o.subject.is_releases() {
        "release"
    } else {
        "commit"
    }
}

/// A candidate's first failing rate, per request where counted.
fn rate(c: &Soaked) -> String {
    match (c.rate_per_request, c.rate_per_iteration) {
        (Some(r), _) => format!("{r:.0} B/request"),
        (None, Some(i)) => format!("{i:.0} B/iteration"),
        (None, None) => String::new(),
    }
}

/// What a person reads first: the commit or release, and the growth it brought (or ended).
pub fn story(o: &BisectOptions, plan: &Plan, r: &Report) -> String {
    let noun = noun(o);
    let mut s = String::from("# plateau bisect\n\n");
    let (first_is, before, after) = match o.find {
        Find::Regression => ("First bad", "passed", "fail"),
        Find::Fix => ("First good (the fix)", "failed", "pass"),
    };
    match (r.first(), r.interrupted) {
        (Some(id), _) => {
            let subject = o.subject.describe(plan, id);
            let subject = if subject.is_empty() { String::new() } else { format!(": {subject}") };
            s.push_str(&format!("{first_is} {noun}: `{id}`{subject}\n\n"));
            let failing = r.candidates.iter().filter(|c| c.verdict == "fail");
            // The growth: at the first bad one (a regression) or at the last that still failed (a fix).
            let grown = match o.find {
                Find::Regression => r.candidates.iter().find(|c| c.id() == id),
                Find::Fix => failing.clone().next_back(),
            };
            if let Some(f) = grown.filter(|f| !f.failing.is_empty()) {
                let site = f.site.as_deref().map(|x| format!(", at `{x}`")).unwrap_or_default();
                let when = match o.find {
                    Find::Regression => format!("It brought growth in {}", f.failing.join(", ")),
                    Find::Fix => format!("It ended the growth {} still had in {}", short(f.id()), f.failing.join(", ")),
                };
                s.push_str(&format!("{when}: {}{site}.\n\n", rate(f)));
            }
            s.push_str(&format!(
                "The {noun}s soaked before it {before} their soaks; it and those soaked after it {after}.\n\n"
            ));
        }
        (None, true) => s.push_str(&format!("Interrupted before the {noun} was known.\n\n")),
        (None, false) => s.push_str(&format!(
            "Skipped candidates leave a range: the {noun} is one of {}.\n\n",
            r.range.iter().map(|c| format!("`{}`", short(c))).collect::<Vec<_>>().join(", ")
        )),
    }
    s.push_str(&format!(
        "| {noun} | subject | verdict | failing | rate | site | wall |\n|---|---|---|---|---|---|---|\n"
    ));
    let cell = |x: &str| x.replace('|', "\\|");
    for c in &r.candidates {
        s.push_str(&format!(
            "| `{}` | {} | {} | {} | {} | {} | {:.0} s |\n",
            short(c.id()),
            cell(&c.subject),
            c.skipped.as_ref().map_or(c.verdict.clone(), |w| format!("skipped: {}", cell(w))),
            c.failing.join(", "),
            rate(c),
            cell(c.site.as_deref().unwrap_or_default()),
            c.wall_s
        ));
    }
    s
}

/// A page linking each candidate's run directory and report.
fn html(o: &BisectOptions, r: &Report) -> String {
    use plateau_reports::html::escape;
    let noun = noun(o);
    let head = match (r.first(), o.find) {
        (Some(id), Find::Regression) => format!("First bad {noun}: <code>{}</code>", escape(id)),
        (Some(id), Find::Fix) => format!("First good {noun} (the fix): <code>{}</code>", escape(id)),
        (None, _) if r.interrupted => "Interrupted".to_string(),
        (None, _) => format!("Undecided between {} {noun}s (skips)", r.range.len()),
    };
    let rows: String = r
        .candidates
        .iter()
        .map(|c| {
            let run = Path::new(&c.run_dir);
            let rel = run.strip_prefix(run.parent().and_then(Path::parent).unwrap_or(run)).unwrap_or(run);
            format!(
                "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><a href=\"{}/report.html\">report</a></td></tr>\n",
                escape(short(c.id())),
                escape(&c.subject),
                escape(&c.skipped.as_ref().map_or(c.verdict.clone(), |w| format!("skipped: {w}"))),
                escape(&c.failing.join(", ")),
                escape(&rate(c)),
                escape(&rel.display().to_string())
            )
        })
        .collect();
    format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\"><title>plateau bisect</title></head><body><h1>{head}</h1><table><tr><th>{noun}</th><th>subject</th><th>verdict</th><th>failing</th><th>rate</th><th>run</th></tr>\n{rows}</table></body></html>\n"
    )
}
