//! plateau-reports: the run data model shared by the harness and its readers (samples.jsonl v1,
//! verdict.json v1, environment.json v1), the plots of a run, report.html, what CI reads
//! (job-summary markdown, JUnit) (the history database lives in plateau-soak).

#[cfg(feature = "render")]
pub mod ci;
pub mod env;
pub mod figures;
#[cfg(feature = "render")]
pub mod html;
#[cfg(feature = "render")]
pub mod plot;
pub mod samples;
pub mod verdict;

pub use env::{Environment, ENVIRONMENT_SCHEMA};
pub use samples::{
    Header, Kind, MetricSpec, Row, SampleLine, Samples, SamplesError, ROLE_REQUESTS, SAMPLES_SCHEMA, UNITS,
};
pub use verdict::{MetricVerdict, Projection, Site, Status, Trend, Verdict, VERDICT_SCHEMA};
