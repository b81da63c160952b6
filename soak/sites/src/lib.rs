//! plateau-sites: every allocation site a gauge. While a run goes on, its profiler records the
//! live bytes each allocation site holds at every quiescent point (`record.rs`: sites.jsonl, in
//! the run directory beside samples.jsonl); the one judge then judges each site's series as it
//! judges a gauge (`judge.rs`) and explains every failing or undecided gauge by its sites
//! (`explain.rs`): a site whose live bytes grow with the work and never level off is a leak and is
//! blamed, with its rate per request and share of the gauge's growth; a site that filled and
//! levelled off, turns over, or whose new allocations die away is a fill, named with its size and
//! bound, and a gauge whose growth is all fills is never failed as a leak.
//!
//! Lifecycle: a recorder (plateau's own process: jemalloc's heap profile, in plateau-profile;
//! a Python server: memray inside its processes, in plateau-external) writes a
//! [`record::Snapshot`] per process at each quiescent point through a [`record::SitesWriter`];
//! `plateau-analysis` reads the log back ([`read::SiteLog`]) and hands it to the detector as
//! [`explain::SiteEvidence`], so every command that judges a run directory (run, analyze, report,
//! history) draws its verdict once, with its sites.

mod churn;
pub mod explain;
pub mod judge;
pub mod known;
pub mod read;
pub mod record;

pub use explain::SiteEvidence;

/// What a run records of its allocation sites (`plateau run --sites`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Depth {
    /// Every allocation the profiler can see: plateau's own heap (sampled); in a Python server's
    /// processes Python's small objects (pymalloc) as well as malloc's, with native frames.
    #[default]
    Full,
    /// In a Python server, malloc's allocations only (Python's objects over 512 bytes and native
    /// code, with native frames): a fraction of the cost, its small objects (`py.object_bytes`)
    /// unexplained. plateau's own heap as with `full`.
    Heap,
    /// No sites recorded: the run's gauges are judged without them.
    Off,
}

impl std::str::FromStr for Depth {
    type Err = String;
    fn from_str(s: &str) -> Result<Depth, String> {
        match s {
            "full" => Ok(Depth::Full),
            "heap" => Ok(Depth::Heap),
            "off" => Ok(Depth::Off),
            other => Err(format!("{other:?}: one of full, heap, off")),
        }
    }
}

impl Depth {
    pub fn name(self) -> &'static str {
        match self {
            Depth::Full => "full",
            Depth::Heap => "heap",
            Depth::Off => "off",
        }
    }
}
pub use read::SiteLog;
pub use record::{Domain, Live, Process, Recorded, SiteName, SitesWriter, Snapshot, SITES_FILE};

#[cfg(test)]
mod tests;
