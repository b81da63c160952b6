//! Known growth: growth already reported upstream, accepted only as written.
//!
//! Lifecycle: `plateau run --known FILE` reads the file strictly ([`parse`]: every entry names a
//! process, a regular expression on site names, a rate per request, a reason and an expiry date)
//! and records it in the run directory as [`RECORD_FILE`], with the day the run began. Every
//! reader of the run judges it again with that record (the one judge, [`KnownEvidence`], weighed
//! after the sites have named what grew): a failing gauge whose leaking sites are each matched
//! by an entry, at or under its rate and before its date, and which they explain, passes, naming
//! the entries and their reasons; a site above its entry's rate, an entry past its date, or
//! growth no entry covers fails as before. Entries that matched nothing are said (stale entries
//! stay visible). Known growth never applies to plateau's own engine (its injections and plants
//! must fail or pass on their own).

mod apply;
mod parse;

use std::cell::RefCell;

use plateau_detector::{DetectorConfig, GaugeEvidence};
use plateau_reports::{KnownEntry, MetricVerdict, Samples};
use serde::{Deserialize, Serialize};

pub use parse::{parse, MAX_ENTRIES};

/// The run directory's record of the known-growth file it was run with.
pub const RECORD_FILE: &str = "known.json";

/// A known-growth file is small: a few dozen entries.
pub const MAX_FILE_BYTES: u64 = 1 << 20;

const RECORD_SCHEMA: &str = "plateau.known.v1";

/// A calendar day, compared as people read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Date {
    pub year: u16,
    pub month: u8,
    pub day: u8,
}

impl std::fmt::Display for Date {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:04}-{:02}-{:02}", self.year, self.month, self.day)
    }
}

impl Date {
    /// A TOML date-time that is a day alone.
    pub fn from_datetime(d: toml::value::Datetime) -> Result<Date, String> {
        match (d.date, d.time) {
            (Some(x), None) => Ok(Date { year: x.year, month: x.month, day: x.day }),
            _ => Err(format!("{d}: a day (YYYY-MM-DD), without a time")),
        }
    }
}

impl std::str::FromStr for Date {
    type Err = String;
    fn from_str(s: &str) -> Result<Date, String> {
        let d: toml::value::Datetime = s.trim().parse().map_err(|_| format!("{s:?} is not a date (YYYY-MM-DD)"))?;
        Date::from_datetime(d)
    }
}

/// One entry of the file.
#[derive(Debug, Clone)]
pub struct Entry {
    /// 1 for the first `[[known]]`.
    pub number: usize,
    /// A role (`engine_core`), a gauge's whole prefix (`target.engine_core`), or `*`.
    pub process: String,
    pub site: regex::Regex,
    pub site_text: String,
    /// Bytes per request accepted, and as written.
    pub max_per_request: f64,
    pub max_text: String,
    pub reason: String,
    /// The last day the entry holds.
    pub until: Date,
}

/// A file's entries and the day the run is judged on (the day it began).
#[derive(Debug, Clone)]
pub struct Known {
    /// The file as the user named it.
    pub file: String,
    pub on: Date,
    pub entries: Vec<Entry>,
}

/// `known.json` in a run directory: the file's text as it was, its name, and the day the run
/// began (expiry is judged on that day, so a run judged again later keeps its verdict).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    pub schema: String,
    pub file: String,
    pub judged_on: String,
    pub text: String,
}

impl Record {
    pub fn new(file: &str, on: Date, text: &str) -> Record {
        Record { schema: RECORD_SCHEMA.into(), file: file.into(), judged_on: on.to_string(), text: text.into() }
    }

    /// The entries it records; errors name the record.
    pub fn known(&self, path: &str) -> Result<Known, String> {
        if self.schema != RECORD_SCHEMA {
            return Err(format!("{path}: schema {:?}, not {RECORD_SCHEMA}", self.schema));
        }
        let on: Date = self.judged_on.parse().map_err(|e| format!("{path}: judged_on: {e}"))?;
        // Errors name the record and the file it came from; the verdict names the file.
        let k = parse(&self.text, &format!("{path} (recorded from {})", self.file), on)?;
        Ok(Known { file: self.file.clone(), ..k })
    }
}

/// Known growth as evidence for the one judge, after the sites: see the module's doc. What it
/// decided for each entry is kept for the verdict's `known`.
pub struct KnownEvidence<'a> {
    pub known: &'a Known,
    pub used: RefCell<Vec<KnownEntry>>,
}

impl<'a> KnownEvidence<'a> {
    pub fn new(known: &'a Known) -> KnownEvidence<'a> {
        KnownEvidence { known, used: RefCell::new(Vec::new()) }
    }

    /// The verdict's `known`, once the judge has run.
    pub fn entries(&self) -> Vec<KnownEntry> {
        self.used.borrow().clone()
    }
}

impl GaugeEvidence for KnownEvidence<'_> {
    fn amend(
        &self,
        s: &Samples,
        metrics: &mut [MetricVerdict],
        cfg: &DetectorConfig,
        requests_per_iter: Option<f64>,
    ) -> Vec<String> {
        let own = own_engine(s);
        let (entries, lines) = match &own {
            Some(why) => {
                (apply::not_applied(self.known), vec![format!("known: {} not applied: {why}", self.known.file)])
            }
            None => {
                let rise = |m: &MetricVerdict| whole_rise(s, &m.name, cfg.warmup_iterations, requests_per_iter);
                apply::apply(self.known, metrics, &rise)
            }
        };
        *self.used.borrow_mut() = entries;
        lines
    }
}

/// A gauge's whole rise a request over its judged window (quiescent samples after `warmup`): its
/// highest value above its first, over the window's iterations. What an undecided gauge is
/// weighed at: no less than any steady rate it could have had from the window's start.
fn whole_rise(s: &Samples, name: &str, warmup: u64, requests_per_iter: Option<f64>) -> Option<f64> {
    let (i, r) = (s.index(name)?, requests_per_iter.filter(|r| *r > 0.0)?);
    let pts: Vec<(u64, f64)> = s.quiescent_series(i).into_iter().filter(|p| p.0 > warmup).collect();
    let (first, last) = (pts.first()?, pts.last()?);
    let top = pts.iter().map(|p| p.1).fold(first.1, f64::max);
    (last.0 > first.0).then(|| (top - first.1) / (last.0 - first.0) as f64 / r)
}

/// Why known growth does not apply to these samples, if it does not: plateau's own engine, whose
/// injections and plants are the harness's own checks.
fn own_engine(s: &Samples) -> Option<String> {
    let h = &s.header;
    if !h.backend.starts_with("external") {
        return Some(format!("the run is of plateau's own engine ({}): known growth is a server's", h.backend));
    }
    if !h.injections.is_empty() || !h.plants.is_empty() {
        return Some("the run switched on injections or plants, which must fail or pass on their own".into());
    }
    None
}

#[cfg(test)]
mod tests;
