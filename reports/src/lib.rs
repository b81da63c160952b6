//! plateau-reports: the run data model shared by the harness and its readers (samples.jsonl v1,
//! verdict.json v1, environment.json v1), the plots of a run, report.html, what CI reads
//! (job-summary markdown, JUnit) (the history database lives in plateau-soak).

#[cfg(feature = "render")]
pub mod ci;
pub mod derived;
pub mod env;
pub mod figures;
pub mod fsutil;
#[cfg(feature = "render")]
pub mod html;
mod lines;
#[cfg(feature = "render")]
pub mod plot;
pub mod relations;
mod run_end;
pub mod samples;
pub mod tolerance;
pub mod verdict;

pub use env::{replay_command, shell_word, Environment, ENVIRONMENT_SCHEMA};
pub use samples::{
    CallTimes, ControlRecord, EndState, Header, Kind, MetricSpec, Row, RunEnd, SampleLine, Samples, SamplesError,
    ROLE_REQUESTS, SAMPLES_SCHEMA, UNITS,
};
pub use tolerance::{Per, Tolerance, DEFAULT_WARMUP_ITERATIONS};
pub use verdict::{Evidence, KnownEntry, MetricVerdict, Projection, Site, Status, Trend, Verdict, VERDICT_SCHEMA};
