//! verdict.json, version 1: the run's verdict and, per judged metric, its status, the reason and
//! the figures behind it.

use serde::{Deserialize, Serialize};

pub const VERDICT_SCHEMA: &str = "plateau.verdict.v1";

/// A metric's or a run's status, in the order a report lists them (failures first). Each is
/// decided once, from evidence: a pass is judged and passed (its reason says what it saw, growth
/// that levelled off included); what the evidence cannot decide is inconclusive, never a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Judged and passed. There is no other passing status: a file that says `warn` (an older
    /// plateau's) does not read, and its run is judged again from its samples.
    Pass,
    /// Too little evidence to judge (a run too short for its warm-up, no quiescent values, growth
    /// whose end this run cannot tell).
    Inconclusive,
    Fail,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Inconclusive => "inconclusive",
            Status::Fail => "fail",
        }
    }
}

/// The trend figures of a gauge.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trend {
    /// Theil–Sen slope, unit per iteration.
    pub slope_per_iter: f64,
    /// The same per hour of wall (or simulated) time.
    pub slope_per_hour: f64,
    /// Last value minus the first after warm-up (medians of the first and last tenth).
    pub growth_after_warmup: f64,
    /// Theil–Sen slope over the last half after warm-up: still growing or levelled off.
    pub tail_slope_per_iter: f64,
    /// "mann-kendall/hamed-rao".
    pub test: String,
    pub z: f64,
    pub p_value: f64,
    pub tail_p_value: f64,
    /// Quiescent points after warm-up that the test saw.
    pub points: usize,
    /// The step the metric moves in (declared by the writer, or the finest step in the data).
    pub quantum: f64,
    /// Robust scale of the series around its fitted line (1.4826 x the median absolute deviation).
    pub noise: f64,
    /// The smallest steady growth this run resolves: a linear leak at this rate, added to this
    /// series, fails it. Unit per iteration; absent (null) when no rate the search tried failed
    /// it: the series cannot resolve a steady leak at all.
    #[serde(default)]
    pub resolution_per_iter: Option<f64>,
    /// The same per request (absent when the run counts no requests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolution_per_request: Option<f64>,
    /// Growth at or below this rate passes (the run's tolerance). Unit per iteration.
    pub tolerance_per_iter: f64,
    /// What the series' own noise resolves, the tolerance set to zero: the run's sensitivity, apart
    /// from what the tolerance chooses to accept. `resolution_per_iter` is the larger of the two
    /// (and a little more). Unit per iteration; absent in files written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub noise_resolution_per_iter: Option<f64>,
}

/// A place in the source behind a failure: where a registry's leftover entries were inserted, or
/// an allocation site whose live bytes grew.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Site {
    /// An allocation site as a person reads it: `FILE:LINE FUNCTION` (the file relative to its
    /// package: `vllm/v1/core/sched/scheduler.py`, `engine/src/output.rs`) or `LIBRARY!FUNCTION`
    /// for native code with no source line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site: Option<String>,
    /// What the site's own series was judged: `leak` (its live bytes grow with the work and do not
    /// level off), `fill` (they levelled off, turn over, or its new allocations die away), or
    /// `undecided`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The site's growth per request over the judged window (its judged slope).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_request: Option<f64>,
    /// The site's share (0..1) of the gauge's growth over the judged window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<f64>,
    /// A site's live bytes at the end of the run, and for a fill where it levels off (its level,
    /// or where its dying rate takes it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bound_bytes: Option<f64>,
    /// What the site's judgement said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
    pub file: String,
    pub line: u32,
    /// Registry entries left there, and the iteration of the oldest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_iter: Option<u64>,
    /// Heap growth there (a profiled replay).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_iter: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_request: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub objects_per_iter: Option<f64>,
}

impl Site {
    /// `file:line (function)`, or `file:line` when the function is not known; an allocation site
    /// by its name.
    pub fn place(&self) -> String {
        if let Some(site) = &self.site {
            return site.clone();
        }
        let f = self.function.as_deref().map(|f| format!(" ({f})")).unwrap_or_default();
        format!("{}:{}{f}", self.file, self.line)
    }
}

/// What a failing gauge's growth costs if it goes on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Projection {
    pub per_request: Option<f64>,
    pub per_million_requests: Option<f64>,
    /// At the run's own pace (iterations per wall or simulated second).
    pub per_day: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricVerdict {
    pub name: String,
    pub kind: String,
    pub unit: String,
    pub status: Status,
    pub reason: String,
    /// The first iteration at which the evidence was conclusive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_iter: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trend: Option<Trend>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_value: Option<f64>,
    /// Where the growth is: heap, outside the heap, a registry, a mapping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// A failing gauge's growth projected: per request, per million requests, per day.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub projected: Option<Projection>,
    /// Where in the source: insertion sites of a registry's leftovers, allocation sites of heap
    /// growth (most first).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sites: Vec<Site>,
    /// An undecided gauge's run length that would decide it (the iteration by which the next
    /// step of a staircase is overdue); `run --until-decided` goes on to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needs_iterations: Option<u64>,
    /// The share (0..1) of a gauge's growth over its judged window that its recorded allocation
    /// sites (`sites`) account for; absent where no site was recorded for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub explained_share: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub schema: String,
    /// "pass", "fail" or "inconclusive".
    pub verdict: Status,
    /// True when the run was interrupted or its samples cut short.
    pub incomplete: bool,
    pub scenario: String,
    pub seed: u64,
    pub backend: String,
    pub injections: Vec<String>,
    pub iterations: u64,
    pub warmup_iterations: u64,
    pub samples: usize,
    /// One line for people.
    pub summary: String,
    /// Growth attributed to the heap, outside it, or registries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attribution: Vec<String>,
    /// Requests added per iteration after warm-up (absent when the samples count no requests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_iter: Option<f64>,
    /// Median seconds per iteration (wall or simulated): only for projections, never for verdicts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds_per_iter: Option<f64>,
    /// The tolerance the gauges were judged with, as given (`1B/request`).
    #[serde(default)]
    pub tolerance: String,
    /// The length the run planned, as its samples header recorded it (absent for a run bound by
    /// time, or samples from a writer that records none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planned_iterations: Option<u64>,
    /// Settings this verdict was judged with that differ from what the samples recorded
    /// (`plateau analyze --tolerance ...`); empty for the run's own verdict.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub overrides: Vec<String>,
    /// What the reader or the detector noticed about the input itself.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// How an external target ended when it ended before the run did: its exit status or
    /// signal, and whether the kernel's OOM killer did it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_exit: Option<String>,
    /// Quiescent points sampled with requests still in flight at an external target (its
    /// in-flight gauges did not read zero within the settle timeout).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub settle_timeouts: u64,
    /// An external target's dialect and control calls (sleep, weight update, wake over HTTP),
    /// as the run recorded them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control: Option<crate::ControlRecord>,
    /// What this verdict judged and with what: a reader takes the verdict as the run's only
    /// while these still hold (absent in files written before verdicts carried it: such a
    /// verdict is judged again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<Evidence>,
    /// The known-growth entries the run was judged with (`plateau run --known FILE`), each with
    /// what it matched and what became of it; empty for a run without them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub known: Vec<KnownEntry>,
    pub metrics: Vec<MetricVerdict>,
}

impl KnownEntry {
    /// A site an entry matched, as `matched` lists it: `GAUGE: SITE (RATE)`.
    pub fn matched_line(gauge: &str, site: &str, rate: &str) -> String {
        format!("{gauge}: {site} ({rate})")
    }

    /// Whether it accepted growth at `site`.
    pub fn accepts(&self, site: &str) -> bool {
        let said = format!(": {site} (");
        self.state == "accepted" && self.matched.iter().any(|x| x.contains(&said))
    }
}

/// One entry of a known-growth file as a verdict used it: growth reported upstream, accepted at
/// or under its rate per request until its date, in the processes and sites it names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KnownEntry {
    /// Its place in the file: 1 for the first `[[known]]`.
    pub entry: usize,
    pub process: String,
    /// The regular expression on site names, as written.
    pub site: String,
    /// Bytes per request accepted (as written, and in bytes).
    pub max_per_request: String,
    pub max_bytes_per_request: f64,
    /// Why the growth is known: the upstream issue.
    pub reason: String,
    /// The last day the entry holds (`YYYY-MM-DD`).
    pub until: String,
    /// `accepted` (every growing site it matched was at or under its rate), `exceeded` (a site
    /// it matched grew faster), `expired` (it matched growth after its date), `unmatched` (it
    /// matched no growing site: stale, or fixed), or `not applied` (a run of plateau's own engine).
    pub state: String,
    /// The growing sites it matched: `GAUGE: SITE (RATE/request)`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub matched: Vec<String>,
}

/// What a verdict is a function of: the bytes it read and every setting in force. Two verdicts
/// with equal evidence are equal; a reader that finds a file's hash or the detector's version
/// changed judges again rather than trust the old verdict.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    /// SHA-256 (hex) of the samples file as judged.
    pub samples_sha256: String,
    /// The other files of the run the judge read (growth.json, residues.json, mappings.json),
    /// by name, each with its SHA-256; a file absent when judged is absent here.
    #[serde(default)]
    pub files: std::collections::BTreeMap<String, String>,
    /// The detector that judged: its crate version and the SHA-256 of its source, so a verdict
    /// from another build of the rules is known as such.
    pub detector: String,
    /// Every setting in force, defaults included, as text (`warmup_iterations`, `tolerance`,
    /// `p_value`, ...), and where each came from (`tolerance_from`: header, override, default).
    #[serde(default)]
    pub settings: std::collections::BTreeMap<String, String>,
    /// The detector's constants (thresholds with their reasons in its source), by name.
    #[serde(default)]
    pub constants: std::collections::BTreeMap<String, f64>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Verdict {
    /// The exit code of every subcommand that reports a verdict: 1 fail, 4 inconclusive (an
    /// unfinished or unjudged run among them), 0 pass. The one mapping, so no subcommand can call
    /// something a pass that another would not.
    pub fn exit_code(&self) -> u8 {
        match self.verdict {
            Status::Fail => 1,
            Status::Inconclusive => 4,
            _ if self.incomplete => 4,
            _ => 0,
        }
    }

    pub fn failed(&self) -> bool {
        self.verdict == Status::Fail
    }

    /// The leaking sites its failing gauges list, most explaining first, that no known-growth
    /// entry accepted: what a failure names first (known growth is not the finding).
    pub fn unknown_leaks(&self) -> impl Iterator<Item = &Site> {
        self.metrics
            .iter()
            .filter(|m| m.status == Status::Fail)
            .flat_map(|m| m.sites.iter())
            .filter(|s| s.kind.as_deref() == Some("leak") && !self.known.iter().any(|k| k.accepts(&s.place())))
    }

    pub fn inconclusive(&self) -> bool {
        self.verdict == Status::Inconclusive
    }

    /// The first figure that is not a finite number, by where it is: JSON has no such numbers,
    /// so a verdict holding one could not be read back. None when every figure is finite.
    pub fn non_finite(&self) -> Option<String> {
        let mut bad = Vec::new();
        let mut check = |what: String, x: Option<f64>| {
            if x.is_some_and(|x| !x.is_finite()) {
                bad.push(what);
            }
        };
        check("requests_per_iter".into(), self.requests_per_iter);
        check("seconds_per_iter".into(), self.seconds_per_iter);
        for m in &self.metrics {
            check(format!("{}.max_value", m.name), m.max_value);
            if let Some(t) = &m.trend {
                for (field, x) in [
                    ("slope_per_iter", Some(t.slope_per_iter)),
                    ("slope_per_hour", Some(t.slope_per_hour)),
                    ("growth_after_warmup", Some(t.growth_after_warmup)),
                    ("tail_slope_per_iter", Some(t.tail_slope_per_iter)),
                    ("z", Some(t.z)),
                    ("p_value", Some(t.p_value)),
                    ("tail_p_value", Some(t.tail_p_value)),
                    ("quantum", Some(t.quantum)),
                    ("noise", Some(t.noise)),
                    ("resolution_per_iter", t.resolution_per_iter),
                    ("resolution_per_request", t.resolution_per_request),
                    ("tolerance_per_iter", Some(t.tolerance_per_iter)),
                    ("noise_resolution_per_iter", t.noise_resolution_per_iter),
                ] {
                    check(format!("{}.trend.{field}", m.name), x);
                }
            }
            if let Some(p) = &m.projected {
                for (field, x) in [
                    ("per_request", p.per_request),
                    ("per_million_requests", p.per_million_requests),
                    ("per_day", p.per_day),
                ] {
                    check(format!("{}.projected.{field}", m.name), x);
                }
            }
            for s in &m.sites {
                check(format!("{}.sites.bytes_per_iter", m.name), s.bytes_per_iter);
                check(format!("{}.sites.bytes_per_request", m.name), s.bytes_per_request);
                check(format!("{}.sites.objects_per_iter", m.name), s.objects_per_iter);
                check(format!("{}.sites.per_request", m.name), s.per_request);
                check(format!("{}.sites.share", m.name), s.share);
                check(format!("{}.sites.size_bytes", m.name), s.size_bytes);
                check(format!("{}.sites.bound_bytes", m.name), s.bound_bytes);
            }
            check(format!("{}.explained_share", m.name), m.explained_share);
        }
        bad.into_iter().next()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_older_warn_does_not_read_and_an_unresolved_rate_reads_back() {
        assert!(serde_json::from_str::<Status>("\"warn\"").is_err());
        assert_eq!(serde_json::from_str::<Status>("\"pass\"").unwrap(), Status::Pass);
        let t: Trend = serde_json::from_value(serde_json::json!({
            "slope_per_iter": 1.0, "slope_per_hour": 1.0, "growth_after_warmup": 1.0, "tail_slope_per_iter": 1.0,
            "test": "mann-kendall/hamed-rao", "z": 1.0, "p_value": 0.5, "tail_p_value": 0.5, "points": 20,
            "quantum": 1.0, "noise": 1.0, "resolution_per_iter": null, "tolerance_per_iter": 0.0
        }))
        .unwrap();
        assert_eq!(t.resolution_per_iter, None);
        let back: Trend = serde_json::from_str(&serde_json::to_string(&t).unwrap()).unwrap();
        assert_eq!(back, t);
    }
}
