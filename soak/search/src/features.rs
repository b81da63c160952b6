//! What a scenario is made of, to a shrink: its phases, and the request features those phases use
//! (the triggers of known leak classes: images, n>1, aborts by stage, stop tokens, max_tokens = 1,
//! invalid requests, shared prefixes, weight updates, prefill/decode disaggregation). Each edit is
//! a pure function of the scenario's TOML document, so a candidate is a scenario anyone can run,
//! written as TOML, and two candidates with the same text are the same run.

use toml::{Table, Value};

/// A request feature a shrink can turn off, named as the run's triggers name it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Feature {
    /// Disaggregated prefill/decode (`[pd]`): turned off, one engine does both.
    Disaggregation,
    /// Forwards lost to a dead decode node (`[pd] decode_failure_fraction`; turned off: none).
    DeadDecode,
    /// Images in prompts (turned off: placeholders become text).
    Images,
    /// n > 1 (turned off: n = 1).
    ParallelSampling,
    /// Aborts at this stage (turned off: none at it).
    Abort(String),
    /// `stop_token_ids`.
    StopTokens,
    /// `max_tokens = 1`, prefill only (turned off: 2).
    PrefillOnly,
    /// Invalid requests mixed into a batch.
    Invalid,
    /// A prompt prefix shared across requests and iterations (prefix-cache hits).
    SharedPrefix,
    /// Sleep at level 2 (weights released too; turned off: level 1).
    DeepSleep,
    /// Weights replaced while asleep.
    WeightUpdate,
}

impl Feature {
    /// The feature's name, as triggers.json and the story say it.
    pub fn name(&self) -> String {
        match self {
            Feature::Disaggregation => "pd".into(),
            Feature::DeadDecode => "dead-decode".into(),
            Feature::Images => "images".into(),
            Feature::ParallelSampling => "n>1".into(),
            Feature::Abort(stage) => format!("abort:{stage}"),
            Feature::StopTokens => "stop-tokens".into(),
            Feature::PrefillOnly => "max_tokens=1".into(),
            Feature::Invalid => "invalid".into(),
            Feature::SharedPrefix => "shared-prefix".into(),
            Feature::DeepSleep => "sleep-level-2".into(),
            Feature::WeightUpdate => "weight-update".into(),
        }
    }

    /// The scenario without it, in words: "with n = 1", "without images".
    pub fn off(&self) -> String {
        match self {
            Feature::Disaggregation => "on one engine (no [pd])".into(),
            Feature::DeadDecode => "with no forwards lost to a dead decode node".into(),
            Feature::Images => "without images".into(),
            Feature::ParallelSampling => "with n = 1".into(),
            Feature::Abort(stage) => format!("without aborts at {stage}"),
            Feature::StopTokens => "without stop tokens".into(),
            Feature::PrefillOnly => "with max_tokens = 2 instead of 1".into(),
            Feature::Invalid => "without invalid requests".into(),
            Feature::SharedPrefix => "without a shared prefix".into(),
            Feature::DeepSleep => "sleeping at level 1".into(),
            Feature::WeightUpdate => "without weight updates".into(),
        }
    }
}

fn phases(doc: &Table) -> &[Value] {
    doc.get("phase").and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

fn phases_mut(doc: &mut Table) -> impl Iterator<Item = &mut Table> {
    doc.get_mut("phase").and_then(Value::as_array_mut).into_iter().flatten().filter_map(Value::as_table_mut)
}

fn int(t: &Table, key: &str) -> Option<i64> {
    t.get(key).and_then(Value::as_integer)
}

fn kind(t: &Table) -> &str {
    t.get("kind").and_then(Value::as_str).unwrap_or("?")
}

/// How many phases the scenario has.
pub fn phase_count(doc: &Table) -> usize {
    phases(doc).len()
}

/// The kinds of the scenario's phases, in order: "batch", "pressure", "sleep".
pub fn phase_kinds(doc: &Table) -> Vec<String> {
    phases(doc).iter().filter_map(Value::as_table).map(|t| kind(t).to_string()).collect()
}

/// One phase in a line: "batch: 8 requests, n = 2, abort:decode 25%".
pub fn describe_phase(doc: &Table, index: usize) -> String {
    let Some(t) = phases(doc).get(index).and_then(Value::as_table) else { return "?".into() };
    let mut parts = Vec::new();
    if let Some(r) = int(t, "requests") {
        parts.push(format!("{r} request{}", if r == 1 { "" } else { "s" }));
    }
    if let Some(n) = int(t, "n").filter(|&n| n > 1) {
        parts.push(format!("n = {n}"));
    }
    if let Some(m) = int(t, "max_tokens") {
        parts.push(format!("max_tokens = {m}"));
    }
    if let Some(i) = t.get("images").and_then(Value::as_array).filter(|a| !a.is_empty()) {
        parts.push(format!("{} images", i.len()));
    }
    if let Some(a) = t.get("abort").and_then(Value::as_table) {
        let stage = a.get("stage").and_then(Value::as_str).unwrap_or("?");
        let f = a.get("fraction").and_then(Value::as_float).unwrap_or(0.0);
        parts.push(format!("abort:{stage} {:.0}%", f * 100.0));
    }
    if t.get("stop_token_ids").and_then(Value::as_array).is_some_and(|a| !a.is_empty()) {
        parts.push("stop tokens".into());
    }
    if let Some(i) = int(t, "invalid").filter(|&i| i > 0) {
        parts.push(format!("{i} invalid"));
    }
    if let Some(l) = int(t, "level") {
        parts.push(format!("level {l}"));
    }
    if t.get("update_weights").and_then(Value::as_bool) == Some(true) {
        parts.push("weights updated".into());
    }
    format!("{}{}{}", kind(t), if parts.is_empty() { "" } else { ": " }, parts.join(", "))
}

/// The scenario with only the phases at `keep` (indices into its phases, in order).
pub fn with_phases(doc: &Table, keep: &[usize]) -> Table {
    let mut out = doc.clone();
    let kept: Vec<Value> = keep.iter().filter_map(|&i| phases(doc).get(i).cloned()).collect();
    out.insert("phase".into(), Value::Array(kept));
    out
}

/// The features the scenario's phases (and sections) use, each once, in a fixed order.
pub fn features(doc: &Table) -> Vec<Feature> {
    let mut out = Vec::new();
    if let Some(pd) = doc.get("pd") {
        out.push(Feature::Disaggregation);
        if pd.get("decode_failure_fraction").and_then(Value::as_float).is_some_and(|f| f > 0.0) {
            out.push(Feature::DeadDecode);
        }
    }
    for v in phases(doc) {
        let Some(t) = v.as_table() else { continue };
        if t.get("images").and_then(Value::as_array).is_some_and(|a| !a.is_empty()) {
            out.push(Feature::Images);
        }
        if int(t, "n").is_some_and(|n| n > 1) {
            out.push(Feature::ParallelSampling);
        }
        if let Some(stage) = t.get("abort").and_then(|a| a.get("stage")).and_then(Value::as_str) {
            out.push(Feature::Abort(stage.to_string()));
        }
        if t.get("stop_token_ids").and_then(Value::as_array).is_some_and(|a| !a.is_empty()) {
            out.push(Feature::StopTokens);
        }
        if int(t, "max_tokens") == Some(1) {
            out.push(Feature::PrefillOnly);
        }
        if int(t, "invalid").is_some_and(|i| i > 0) {
            out.push(Feature::Invalid);
        }
        if int(t, "shared_prefix_tokens").is_some_and(|p| p > 0) {
            out.push(Feature::SharedPrefix);
        }
        if int(t, "level") == Some(2) {
            out.push(Feature::DeepSleep);
        }
        if t.get("update_weights").and_then(Value::as_bool) == Some(true) {
            out.push(Feature::WeightUpdate);
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The scenario with the features in `off` turned off, wherever they appear.
pub fn without(doc: &Table, off: &[Feature]) -> Table {
    let mut out = doc.clone();
    for f in off {
        match f {
            Feature::Disaggregation => {
                out.remove("pd");
            }
            Feature::DeadDecode => {
                if let Some(pd) = out.get_mut("pd").and_then(Value::as_table_mut) {
                    pd.remove("decode_failure_fraction");
                }
            }
            _ => {}
        }
        for t in phases_mut(&mut out) {
            turn_off(t, f);
        }
    }
    out
}

fn turn_off(t: &mut Table, f: &Feature) {
    match f {
        Feature::Disaggregation | Feature::DeadDecode => {}
        Feature::Images => {
            t.remove("images");
            if let Some(Value::String(p)) = t.get_mut("prompt") {
                *p = p.replace("<|image_pad|>", "image");
            }
        }
        Feature::ParallelSampling => {
            if int(t, "n").is_some_and(|n| n > 1) {
                t.insert("n".into(), Value::Integer(1));
            }
        }
        Feature::Abort(stage) => {
            if t.get("abort").and_then(|a| a.get("stage")).and_then(Value::as_str) == Some(stage.as_str()) {
                t.remove("abort");
            }
        }
        Feature::StopTokens => {
            t.remove("stop_token_ids");
        }
        Feature::PrefillOnly => {
            if int(t, "max_tokens") == Some(1) {
                t.insert("max_tokens".into(), Value::Integer(2));
            }
        }
        Feature::Invalid => {
            t.remove("invalid");
        }
        Feature::SharedPrefix => {
            t.remove("shared_prefix_tokens");
        }
        Feature::DeepSleep => {
            if int(t, "level") == Some(2) {
                t.insert("level".into(), Value::Integer(1));
            }
        }
        Feature::WeightUpdate => {
            t.remove("update_weights");
        }
    }
}

/// The scenario at a fixed length and seed: `[soak] iterations` and `seed` set, a wall-clock
/// `duration` and an until-decided cap below the length dropped, so the run is the one replayed.
/// A warm-up at or past the length (a run shrunk to an exact-layer failure, decided at its first
/// iterations) is cut to leave one judged point.
pub fn with_length(doc: &Table, iterations: u64, seed: u64) -> Table {
    let mut out = doc.clone();
    let soak = out.entry("soak").or_insert_with(|| Value::Table(Table::new()));
    if let Some(s) = soak.as_table_mut() {
        let count = |n: u64| Value::Integer(n.min(i64::MAX as u64) as i64);
        s.remove("duration");
        s.insert("iterations".into(), count(iterations));
        s.insert("seed".into(), count(seed));
        if s.get("max_iterations").and_then(Value::as_integer).is_some_and(|m| (m as u64) < iterations) {
            s.remove("max_iterations");
        }
        let warmup = s
            .get("warmup_iterations")
            .and_then(Value::as_integer)
            .map_or(plateau_detector::DEFAULT_WARMUP_ITERATIONS, |w| w.max(0) as u64);
        if warmup >= iterations {
            s.insert("warmup_iterations".into(), count(iterations.saturating_sub(1)));
        }
    }
    out
}

/// The scenario as TOML, in the order a person writes one: name and description, the sections,
/// then the phases. The same document always gives the same text (candidates are told apart by it).
pub fn render(doc: &Table) -> String {
    let mut out = String::new();
    for key in ["name", "description"] {
        if let Some(v) = doc.get(key) {
            out.push_str(&format!("{key} = {v}\n"));
        }
    }
    let known = ["name", "description", "engine", "soak", "pd", "sim", "phase"];
    let mut rest = Table::new();
    for (k, v) in doc.iter().filter(|(k, _)| !known.contains(&k.as_str())) {
        rest.insert(k.clone(), v.clone());
    }
    for part in ["engine", "soak", "pd", "sim", "phase"] {
        if let Some(v) = doc.get(part) {
            rest.insert(part.into(), v.clone());
            out.push('\n');
            out.push_str(&toml::to_string(&rest).unwrap_or_default());
            rest.clear();
        }
    }
    if !rest.is_empty() {
        out.push('\n');
        out.push_str(&toml::to_string(&rest).unwrap_or_default());
    }
    out
}

/// The scenario's planned length (`[soak] iterations`), if it sets one.
pub fn length(doc: &Table) -> Option<u64> {
    doc.get("soak").and_then(|s| s.get("iterations")).and_then(Value::as_integer).map(|i| i.max(0) as u64)
}

/// The scenario's seed (`[soak] seed`), if it sets one.
pub fn seed(doc: &Table) -> Option<u64> {
    doc.get("soak").and_then(|s| s.get("seed")).and_then(Value::as_integer).map(|i| i.max(0) as u64)
}

/// Requests per iteration of its batch phases (pressure phases size themselves to the pool).
pub fn batch_requests(doc: &Table) -> u64 {
    phases(doc)
        .iter()
        .filter_map(Value::as_table)
        .filter(|t| kind(t) == "batch")
        .map(|t| int(t, "requests").unwrap_or(20).max(0) as u64)
        .sum()
}

/// The scenario with every batch phase's requests halved (rounded up, and invalid requests at
/// most as many), or None when every batch already sends one.
pub fn halve_requests(doc: &Table) -> Option<Table> {
    let mut out = doc.clone();
    let mut changed = false;
    for t in phases_mut(&mut out).filter(|t| kind(t) == "batch") {
        // 20: the batch phase's default.
        let r = int(t, "requests").unwrap_or(20);
        if r > 1 {
            let half = (r + 1) / 2;
            t.insert("requests".into(), Value::Integer(half));
            if int(t, "invalid").is_some_and(|i| i > half) {
                t.insert("invalid".into(), Value::Integer(half));
            }
            changed = true;
        }
    }
    changed.then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(text: &str) -> Table {
        text.parse().expect("test TOML")
    }

    const MIXED: &str = r#"
name = "m"
description = "d"
[engine]
preset = "tiny-vl"
[[phase]]
kind = "batch"
requests = 8
prompt = "Compare <|image_pad|>, {i}"
n = 2
images = [{ width = 8, height = 8 }]
abort = { fraction = 0.25, stage = "decode" }
[[phase]]
kind = "batch"
requests = 3
max_tokens = 1
invalid = 2
stop_token_ids = [1]
[[phase]]
kind = "sleep"
level = 2
update_weights = true
"#;

    #[test]
    fn features_are_found_once_each_in_a_fixed_order() {
        let f: Vec<String> = features(&doc(MIXED)).iter().map(Feature::name).collect();
        assert_eq!(
            f,
            [
                "images",
                "n>1",
                "abort:decode",
                "stop-tokens",
                "max_tokens=1",
                "invalid",
                "sleep-level-2",
                "weight-update"
            ]
        );
    }

    #[test]
    fn turning_a_feature_off_leaves_the_rest_and_a_valid_scenario() {
        let d = doc(MIXED);
        let off = without(&d, &[Feature::Images, Feature::ParallelSampling]);
        let f: Vec<String> = features(&off).iter().map(Feature::name).collect();
        assert!(!f.contains(&"images".into()) && !f.contains(&"n>1".into()) && f.contains(&"abort:decode".into()));
        let text = render(&off);
        assert!(!text.contains("image_pad"), "{text}");
        plateau_scenario::Scenario::parse(&text, "candidate.toml").expect("still a valid scenario");
        // Every feature off at once: still a valid scenario, with nothing left to turn off.
        let bare = without(&d, &features(&d));
        assert!(features(&bare).is_empty());
        plateau_scenario::Scenario::parse(&render(&bare), "c").expect("valid");
        assert!(render(&bare).starts_with("name = \"m\"\ndescription = \"d\"\n"), "{}", render(&bare));
    }

    #[test]
    fn phases_length_and_requests() {
        let d = doc(MIXED);
        assert_eq!(phase_count(&with_phases(&d, &[0, 2])), 2);
        assert_eq!(describe_phase(&d, 0), "batch: 8 requests, n = 2, 1 images, abort:decode 25%");
        let l = with_length(&d, 40, 7);
        assert_eq!(length(&l), Some(40));
        let short = with_length(&d, 1, 7);
        plateau_scenario::Scenario::parse(&render(&short), "c").expect("a warm-up past the length is cut");
        assert_eq!(batch_requests(&l), 11);
        let h = halve_requests(&l).expect("halvable");
        assert_eq!(batch_requests(&h), 6);
        let mut x = h;
        for _ in 0..10 {
            match halve_requests(&x) {
                Some(n) => x = n,
                None => break,
            }
        }
        assert_eq!(batch_requests(&x), 2, "one request per batch phase at the floor");
    }
}
