//! What a scenario claims to exercise, and how often it really happened.
//!
//! A scenario's phases claim triggers: an abort at a stage, n>1 sampling, images, stop tokens,
//! `max_tokens = 1`, invalid requests, a sleep/wake cycle. Claiming is not firing: an abort aimed
//! at a stage the request has already left ends nothing, a stop token the sampler never draws stops
//! nothing. A leak on a path that never runs cannot be seen, so the driver counts each trigger when
//! it happens (the abort landed at its stage, the request forked and was served, a sequence ended
//! on one of its stop tokens, a one-token request ended by length, the engine refused the invalid
//! request, the engine woke), the run's summary prints the counts, `triggers.json` keeps them,
//! and `plateau selftest` fails a scenario whose claimed trigger fired fewer than
//! [`MIN_FIRED`] times.

use std::collections::BTreeMap;
use std::path::Path;

use plateau_engine::{FinishReason, RequestOutput};
use serde::{Deserialize, Serialize};

use plateau_scenario::{Phase, Scenario, Stage};

/// A claimed trigger must fire at least this often in a run for selftest: fewer leave a leak on
/// its path below what a per-request registry shows at once and a trend can resolve at all.
pub const MIN_FIRED: u64 = 10;

/// One trigger's claim and count (a line of triggers.json).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TriggerCount {
    /// `abort:<stage>`, `n>1`, `images`, `stop-tokens`, `max_tokens=1`, `invalid`, `sleep-wake`.
    pub trigger: String,
    /// Whether a phase of the scenario asks for it (counts of unclaimed triggers are kept too).
    pub claimed: bool,
    pub fired: u64,
}

/// What the current phase's requests carry, for counting their outputs.
#[derive(Debug, Clone, Default)]
pub struct PhaseTraits {
    pub n: u32,
    pub images: bool,
    pub stop_token_ids: Vec<u32>,
    pub max_tokens: u32,
}

impl PhaseTraits {
    pub fn of(phase: &Phase) -> PhaseTraits {
        match phase {
            Phase::Batch(b) => PhaseTraits {
                n: b.n,
                images: !b.images.is_empty(),
                stop_token_ids: b.stop_token_ids.clone(),
                max_tokens: b.max_tokens,
            },
            Phase::Pressure(p) => PhaseTraits { n: p.n, max_tokens: p.max_tokens, ..PhaseTraits::default() },
            Phase::Sleep(_) => PhaseTraits::default(),
        }
    }
}

pub fn stage_name(s: Stage) -> &'static str {
    match s {
        Stage::Waiting => "waiting",
        Stage::Encode => "encode",
        Stage::AwaitingKv => "awaiting-kv",
        Stage::PullingKv => "pulling-kv",
        Stage::Prefill => "prefill",
        Stage::Decode => "decode",
        Stage::Preempted => "preempted",
        Stage::Any => "any",
    }
}

fn abort_key(s: Stage) -> String {
    format!("abort:{}", stage_name(s))
}

/// The triggers a scenario's phases claim, in a stable order.
pub fn claimed(s: &Scenario) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut claim = |k: String| {
        if !out.contains(&k) {
            out.push(k);
        }
    };
    for p in &s.phases {
        match p {
            Phase::Batch(b) => {
                if let Some(a) = &b.abort {
                    claim(abort_key(a.stage));
                }
                if b.n > 1 {
                    claim("n>1".into());
                }
                if !b.images.is_empty() {
                    claim("images".into());
                }
                if !b.stop_token_ids.is_empty() {
                    claim("stop-tokens".into());
                }
                if b.max_tokens == 1 {
                    claim("max_tokens=1".into());
                }
                if b.invalid > 0 {
                    claim("invalid".into());
                }
            }
            Phase::Pressure(p) => {
                if let Some(a) = &p.abort {
                    claim(abort_key(a.stage));
                }
                if p.n > 1 {
                    claim("n>1".into());
                }
            }
            Phase::Sleep(_) => claim("sleep-wake".into()),
        }
    }
    out
}

/// The counts of one run. Keys are few (one per trigger kind), so the map stays small.
#[derive(Debug, Clone, Default)]
pub struct Triggers {
    fired: BTreeMap<String, u64>,
}

impl Triggers {
    fn bump(&mut self, key: &str) {
        *self.fired.entry(key.to_string()).or_insert(0) += 1;
    }

    /// An abort that ended a request at `stage`.
    pub fn aborted(&mut self, stage: Stage) {
        self.bump(&abort_key(stage));
    }

    pub fn refused(&mut self) {
        self.bump("invalid");
    }

    pub fn woke(&mut self) {
        self.bump("sleep-wake");
    }

    /// A request's final output, from a phase whose requests carry `t`.
    pub fn finished(&mut self, o: &RequestOutput, t: &PhaseTraits) {
        let served = !matches!(o.finish(), FinishReason::Aborted | FinishReason::Error);
        if t.n > 1 && served && o.seqs.iter().filter(|s| !s.tokens.is_empty()).count() > 1 {
            self.bump("n>1");
        }
        if t.images && served {
            self.bump("images");
        }
        let on_stop = |s: &plateau_engine::SeqOutput| {
            s.finish == FinishReason::Stopped && s.tokens.last().is_some_and(|t0| t.stop_token_ids.contains(t0))
        };
        if o.seqs.iter().any(on_stop) {
            self.bump("stop-tokens");
        }
        if t.max_tokens == 1 && served && o.seqs.iter().all(|s| s.tokens.len() == 1) {
            self.bump("max_tokens=1");
        }
    }

    /// Every claimed trigger with its count, then any counted but unclaimed.
    pub fn report(&self, s: &Scenario) -> Vec<TriggerCount> {
        let claims = claimed(s);
        let mut out: Vec<TriggerCount> = claims
            .iter()
            .map(|k| TriggerCount { trigger: k.clone(), claimed: true, fired: self.fired.get(k).copied().unwrap_or(0) })
            .collect();
        out.extend(self.fired.iter().filter(|(k, _)| !claims.contains(k)).map(|(k, v)| TriggerCount {
            trigger: k.clone(),
            claimed: false,
            fired: *v,
        }));
        out
    }
}

/// The summary's words for a run's triggers: `abort:waiting 1500, n>1 2000, ...`.
pub fn summary(counts: &[TriggerCount]) -> String {
    counts.iter().filter(|c| c.claimed).map(|c| format!("{} {}", c.trigger, c.fired)).collect::<Vec<_>>().join(", ")
}

/// The claimed triggers that fired fewer than [`MIN_FIRED`] times.
pub fn short(counts: &[TriggerCount]) -> Vec<&TriggerCount> {
    counts.iter().filter(|c| c.claimed && c.fired < MIN_FIRED).collect()
}

/// What is wrong with a finished run's triggers, from its directory's triggers.json: a claimed
/// trigger that fired too rarely for a leak on its path to show, or a file that cannot be read.
pub fn unfired_in(dir: &Path) -> Option<String> {
    let path = dir.join("triggers.json");
    let counts: Vec<TriggerCount> = match std::fs::read(&path)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
    {
        Ok(c) => c,
        Err(e) => return Some(format!("{}: {e}", path.display())),
    };
    let short = short(&counts);
    (!short.is_empty()).then(|| {
        let each: Vec<String> = short.iter().map(|t| format!("{} fired {} times", t.trigger, t.fired)).collect();
        format!("claimed triggers fired fewer than {MIN_FIRED} times: {}", each.join(", "))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scenario(name: &str) -> Scenario {
        Scenario::load(name).unwrap().0
    }

    #[test]
    fn a_scenario_claims_what_its_phases_ask_for() {
        assert_eq!(claimed(&scenario("pd-transfer")), ["abort:awaiting-kv", "abort:pulling-kv", "abort:decode"]);
        let mixed = claimed(&scenario("mixed"));
        for k in ["invalid", "max_tokens=1", "stop-tokens", "n>1", "images", "sleep-wake", "abort:preempted"] {
            assert!(mixed.iter().any(|c| c == k), "mixed does not claim {k}: {mixed:?}");
        }
        assert_eq!(claimed(&scenario("n-sampling")), ["n>1"]);
    }

    #[test]
    fn a_claim_that_never_fired_is_short_and_an_unclaimed_count_is_kept_apart() {
        let s = scenario("n-sampling");
        let mut t = Triggers::default();
        t.refused();
        let r = t.report(&s);
        assert_eq!(r[0], TriggerCount { trigger: "n>1".into(), claimed: true, fired: 0 });
        assert_eq!(r[1], TriggerCount { trigger: "invalid".into(), claimed: false, fired: 1 });
        assert_eq!(short(&r).len(), 1);
        assert_eq!(summary(&r), "n>1 0");
    }
}
