//! The one judge: the verdict of a samples file as a function of what the file recorded. The
//! header holds the warm-up, the tolerance and the planned length; the last line how the run
//! ended. Every command that shows or stores a verdict gets it from [`judge`]; [`judge_with`]
//! judges with other settings and names them in the verdict.

use plateau_reports::{EndState, RunEnd, Samples, Status, Verdict};

use super::verdict::analyze;
use super::{evidence, warmup_rule, DetectorConfig, GaugeEvidence, LiveHeap, Per, Tolerance};

/// How a verdict's warning marks a run that `--stop-on-exact-failure` ended before its planned
/// length (a shrink replays such a run at the length it planned).
pub const STOPPED_ON_EXACT_FAILURE: &str = "(--stop-on-exact-failure)";

/// Settings to judge with other than those the samples recorded (`plateau analyze --warmup
/// --tolerance`). A verdict judged with any of them names them (`Verdict::overrides`) and is
/// written beside the run's own, never over it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Overrides {
    pub warmup: Option<u64>,
    pub tolerance: Option<Tolerance>,
}

impl Overrides {
    /// The overrides as flags, for the verdict and for people (`--tolerance 64B/request`).
    pub fn flags(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(w) = self.warmup {
            out.push(format!("--warmup {w}"));
        }
        if let Some(t) = self.tolerance {
            out.push(format!("--tolerance {t}"));
        }
        out
    }
}

/// The one judge: the verdict of `s`, from what it recorded alone. Errors are the file's (a
/// tolerance it records that cannot be read, or one per request in a file that counts no
/// requests): input errors, exit 2.
pub fn judge(s: &Samples) -> Result<Verdict, String> {
    judge_with(s, &Overrides::default())
}

/// [`judge`] with other settings where `o` gives them; the verdict names them.
pub fn judge_with(s: &Samples, o: &Overrides) -> Result<Verdict, String> {
    judge_with_evidence(s, o, &[])
}

/// [`judge_with`], weighing what profiled replays of the run showed of live heaps (the run's
/// growth.json, read by the soak's `analysis::judge_run`): evidence the run left on disk.
pub fn judge_with_evidence(s: &Samples, o: &Overrides, live_heap: &[LiveHeap]) -> Result<Verdict, String> {
    judge_with_sites(s, o, live_heap, None)
}

/// [`judge_with_evidence`], with the evidence of allocation sites beside the samples
/// ([`GaugeEvidence`]: the run's sites.jsonl, read by the soak's `analysis::judge_run`).
pub fn judge_with_sites(
    s: &Samples,
    o: &Overrides,
    live_heap: &[LiveHeap],
    sites: Option<&dyn GaugeEvidence>,
) -> Result<Verdict, String> {
    let recorded = s
        .header
        .tolerance
        .as_deref()
        .map(|t| t.parse::<Tolerance>().map_err(|e| format!("header: tolerance: {e}")))
        .transpose()?;
    let tolerance = o.tolerance.or(recorded).unwrap_or_default();
    let tolerance_from = source_of(o.tolerance.is_some(), recorded.is_some());
    let last = s.last_iter();
    let warmup_iterations = warmup_rule(o.warmup, s.header.warmup_iterations, Some(last))?;
    let warmup_from = source_of(o.warmup.is_some(), s.header.warmup_iterations.is_some());
    let cfg =
        DetectorConfig { warmup_iterations, tolerance, live_heap: live_heap.to_vec(), ..DetectorConfig::default() };
    let unfinished = unfinished(s);
    let mut v = analyze(s, &cfg, unfinished.as_deref(), sites);
    // An end before the plan that only a failure explains, with nothing failed: the samples
    // contradict themselves, and a contradiction is never a complete pass.
    if let (Some(why), None, false) = (early_end(s), &unfinished, v.failed()) {
        v = analyze(s, &cfg, Some(&why), sites);
    }
    if (o.tolerance.is_some() || recorded.is_some()) && v.requests_per_iter.is_none() && tolerance.per == Per::Request {
        return Err(format!(
            "tolerance {tolerance}: the samples count no requests (no counter with the role `requests` in the header), so a tolerance per request cannot be applied; give it per iteration"
        ));
    }
    v.planned_iterations = s.header.planned_iterations;
    v.overrides = o.flags();
    v.evidence = Some(evidence::of_judge(&cfg, warmup_from, tolerance_from, s.header.planned_iterations));
    if let Some(e) = &s.end {
        note_end(&mut v, e, s.header.planned_iterations);
    }
    Ok(v)
}

/// Where a setting came from: an override over what the header recorded over the default.
fn source_of(overridden: bool, recorded: bool) -> evidence::From {
    match (overridden, recorded) {
        (true, _) => evidence::From::Override,
        (false, true) => evidence::From::Header,
        (false, false) => evidence::From::Default,
    }
}

/// Why the samples are not those of a finished run, if they are not: cut short mid-line, an end
/// record that says the run was interrupted or failed, or samples that stop before their planned
/// length with no end recorded (a run killed, or samples cut by hand). A file that records no
/// plan is taken as whole.
pub fn unfinished(s: &Samples) -> Option<String> {
    if s.truncated_tail {
        return Some("its samples end mid-line".into());
    }
    let last = s.last_iter();
    match &s.end {
        Some(e) => match e.state {
            EndState::Completed => match s.header.planned_iterations {
                Some(p) if e.iterations.max(last) < p => Some(format!(
                    "its end record says it completed at iteration {} of the {p} it planned: the two disagree",
                    e.iterations.max(last)
                )),
                _ => None,
            },
            EndState::Stopped | EndState::Decided => None,
            EndState::Interrupted => Some(format!("it was interrupted at iteration {last}")),
            EndState::Failed => Some(format!(
                "it failed at iteration {last}: {}",
                e.error.as_deref().unwrap_or("the failure was not recorded")
            )),
        },
        None => match (s.header.planned_iterations, s.header.planned_duration_s) {
            (Some(p), _) if last < p => Some(format!(
                "its samples stop at iteration {last} of the {p} it planned, with no record of how it ended"
            )),
            (None, Some(d)) => Some(format!(
                "it was to run for {d} s and how it ended was not recorded (its samples stop at iteration {last})"
            )),
            _ => None,
        },
    }
}

/// Why an end before the planned length does not finish the run when nothing failed: `stopped`
/// (the first exact-layer failure) and `decided` (a failure decided) end a run early only on a
/// failure, so with none they say the run was cut short.
fn early_end(s: &Samples) -> Option<String> {
    let e = s.end.as_ref()?;
    let p = s.header.planned_iterations?;
    let at = e.iterations.max(s.last_iter());
    let how = match e.state {
        EndState::Stopped => "stopped at the first exact-layer failure",
        EndState::Decided => "stopped once its failure was decided",
        _ => return None,
    };
    (at < p)
        .then(|| format!("its end record says it {how} at iteration {at} of the {p} it planned, but nothing failed"))
}

/// What the end record adds to a verdict: an external target that ended first, points sampled
/// unsettled, its dialect and control calls (what it lacks as warnings), how far `--until-decided` went, where `--stop-on-exact-failure` stopped.
fn note_end(v: &mut Verdict, e: &RunEnd, planned: Option<u64>) {
    v.target_exit = e.target_exit.clone();
    v.settle_timeouts = e.settle_timeouts;
    if !e.roles.is_empty() {
        v.summary.push_str(&format!("; {}", roles_story(&e.roles, v)));
    }
    if let Some(c) = &e.control {
        // What the dialect lacks is said once, never skipped in silence.
        v.warnings.extend(c.lacking.iter().cloned());
        v.control = Some(c.clone());
    }
    if let Some(how) = &e.target_exit {
        let when = if v.failed() {
            "after the growth was already conclusive: the leak is the finding"
        } else {
            "before any growth was conclusive: the run could not be judged"
        };
        v.summary.push_str(&format!("; {how}, {when}"));
    }
    if let Some(cap) = e.until_decided_cap {
        let story = until_decided_story(planned.unwrap_or(e.iterations), &e.extensions, cap, v);
        v.warnings.push(story);
    }
    if e.state == EndState::Decided {
        v.warnings.push(format!(
            "stopped at iteration {} of {} once the verdict was decided (--stop-when-decided): a failure with no gauge undecided; the gauges were not judged past it",
            e.iterations,
            planned.map_or("its planned length".to_string(), |p| p.to_string())
        ));
    }
    if let Some(what) = &e.stopped_on {
        v.warnings.push(format!(
            "stopped at iteration {} of {}: {what} {STOPPED_ON_EXACT_FAILURE}; the gauges were not judged past it",
            e.iterations,
            planned.map_or("its planned length".to_string(), |p| p.to_string())
        ));
    }
}

/// Which roles of a deployment grew: each role's verdict from the metrics under its prefix
/// (`decode: fail`), the failing ones named first.
fn roles_story(roles: &[String], v: &Verdict) -> String {
    let of = |r: &str| {
        let mine: Vec<&plateau_reports::MetricVerdict> =
            v.metrics.iter().filter(|m| m.name.strip_prefix(r).is_some_and(|t| t.starts_with('.'))).collect();
        if mine.iter().any(|m| m.status == Status::Fail) {
            Status::Fail
        } else if mine.iter().any(|m| m.status == Status::Inconclusive) {
            Status::Inconclusive
        } else {
            Status::Pass
        }
    };
    let grew: Vec<&str> = roles.iter().map(String::as_str).filter(|r| of(r) == Status::Fail).collect();
    let each: Vec<String> = roles.iter().map(|r| format!("{r} {}", of(r).as_str())).collect();
    match grew.len() {
        0 => format!("no role grew ({})", each.join(", ")),
        1 => format!("the role that grew: {} ({})", grew[0], each.join(", ")),
        _ => format!("the roles that grew: {} ({})", grew.join(", "), each.join(", ")),
    }
}

/// The verdict's line on how long a run that went on until decided ran, and why it stopped.
fn until_decided_story(planned: u64, extensions: &[u64], cap: u64, v: &Verdict) -> String {
    let lengths: Vec<String> =
        std::iter::once(planned).chain(extensions.iter().copied()).map(|n| n.to_string()).collect();
    let ran = if extensions.is_empty() {
        format!("decided at its planned {planned} iterations")
    } else {
        format!("went on from {} iterations", lengths.join(" to "))
    };
    let end = if v.verdict == Status::Inconclusive && !v.incomplete {
        let undecided: Vec<&str> =
            v.metrics.iter().filter(|m| m.status == Status::Inconclusive).map(|m| m.name.as_str()).collect();
        format!(
            "; still undecided at the cap of {cap} iterations ({}): a longer --max-iterations would tell",
            undecided.join(", ")
        )
    } else {
        String::new()
    };
    format!("--until-decided: {ran}{end}")
}
