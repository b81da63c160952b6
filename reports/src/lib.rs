//! plateau-reports: the run data model shared by the harness and its readers (samples.jsonl v1,
//! verdict.json v1) and the plots of a run.

pub mod ci;
pub mod plot;
pub mod samples;
pub mod verdict;

pub use samples::{Header, Kind, MetricSpec, Row, SampleLine, Samples, SamplesError, SAMPLES_SCHEMA, UNITS};
pub use verdict::{MetricVerdict, Projection, Site, Status, Trend, Verdict, VERDICT_SCHEMA};
