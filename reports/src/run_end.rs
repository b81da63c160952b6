//! How a run ended, recorded as the last line of its samples (see [`RunEnd`]): what the one judge
//! needs beyond the samples themselves to tell a finished run from one that was cut short.

use serde::{Deserialize, Serialize};

/// How a run ended, recorded as the last line of its samples: a sample with no values and an
/// `end` object, which a reader that does not know it takes for an empty sample. plateau's own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunEnd {
    pub state: EndState,
    /// Iterations done.
    pub iterations: u64,
    /// `--until-decided`: the cap the run could go on to, and each length it went on to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until_decided_cap: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extensions: Vec<u64>,
    /// `--stop-on-exact-failure`: what failed at the iteration the run stopped at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_on: Option<String>,
    /// What ended a failed run (the harness's or the target's error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// An external target that ended before the run did: its exit status or signal, and
    /// whether the kernel's OOM killer did it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_exit: Option<String>,
    /// Quiescent points sampled with requests still in flight at an external target.
    #[serde(default)]
    pub settle_timeouts: u64,
    /// An external target's control calls (the RL loop's sleep, weight update and wake over
    /// HTTP): its dialect, what each call took, and what the dialect lacks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control: Option<ControlRecord>,
    /// The roles of a deployment of separate processes (`--topology`): each role's metrics start
    /// with its name (`decode.target.proc.rss_anon`), and the verdict names the roles that grew.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<String>,
}

/// How a run drove an external server's control endpoints. Lifecycle: the dialect is found (or
/// named by `--dialect`) once before the run; every sleep phase then calls what the dialect has
/// (each call's time from the request to the state the server reports after it), and counts
/// what it lacks; the record is written with the run's end and names both in the verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ControlRecord {
    /// `vllm`, `sglang`, `llamacpp` or `openai`.
    pub dialect: String,
    /// What showed the dialect (`GET /is_sleeping answered`, `owned_by vllm`, `--dialect`).
    pub found: String,
    /// Each kind of control call made (`sleep`, `wake weights`, ...): how many, and their times.
    #[serde(default)]
    pub calls: std::collections::BTreeMap<String, CallTimes>,
    /// What sleep phases asked that the dialect cannot do over HTTP, each with how often.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lacking: Vec<String>,
    /// Each kind of control call sent, answered or not: a call that failed counts here and not
    /// in `calls`.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub sent: std::collections::BTreeMap<String, u64>,
    /// The call that failed, if one did: the call, what it asked, and what came back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
}

/// The count and wall-clock times of one kind of control call, in milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallTimes {
    pub count: u64,
    pub median_ms: f64,
    pub max_ms: f64,
}

impl CallTimes {
    /// The count, median and max of `ms` (empty: zeros).
    pub fn of(ms: &[f64]) -> CallTimes {
        let mut v = ms.to_vec();
        v.sort_by(f64::total_cmp);
        let median = match v.len() {
            0 => 0.0,
            n if n % 2 == 1 => v[n / 2],
            n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        };
        CallTimes { count: v.len() as u64, median_ms: median, max_ms: v.last().copied().unwrap_or(0.0) }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndState {
    /// Ran to its planned length or duration (or past it, `--until-decided`).
    Completed,
    /// Stopped at the first exact-layer failure (`--stop-on-exact-failure`): decided there.
    Stopped,
    /// Stopped once its verdict was decided (`--stop-when-decided`): a failure, with no gauge
    /// left undecided.
    Decided,
    /// Ctrl-C.
    Interrupted,
    /// The harness or the target failed (`error` says how).
    Failed,
}

impl RunEnd {
    pub fn new(state: EndState, iterations: u64) -> RunEnd {
        RunEnd {
            state,
            iterations,
            until_decided_cap: None,
            extensions: Vec::new(),
            stopped_on: None,
            error: None,
            target_exit: None,
            settle_timeouts: 0,
            control: None,
            roles: Vec::new(),
        }
    }

    /// Whether the run went as far as it was asked to (or stopped on a decided failure).
    pub fn finished(&self) -> bool {
        matches!(self.state, EndState::Completed | EndState::Stopped)
    }
}
