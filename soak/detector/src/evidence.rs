//! What a verdict records of the judge itself: the detector's version (its crate version and the
//! SHA-256 of its source, from build.rs), every setting in force with where it came from, and
//! every constant of its rules. A reader compares them with its own before it trusts a verdict.

use std::collections::BTreeMap;

use plateau_reports::Evidence;

use super::{attribution, levelling, live_heap, overhead, power, release, series, stats, steps, DetectorConfig};

/// This detector: `plateau-detector VERSION+SOURCE_SHA256` (the hash's first 16 hex digits).
pub fn version() -> String {
    let source = env!("PLATEAU_DETECTOR_SOURCE_SHA256");
    format!("plateau-detector {}+{}", env!("CARGO_PKG_VERSION"), &source[..source.len().min(16)])
}

/// The constants of the rules, by `module::NAME` (each has its reason beside it in the source).
pub fn constants() -> BTreeMap<String, f64> {
    [
        ("series::MIN_QUANTA", series::MIN_QUANTA),
        ("series::MIN_TAIL_QUANTA", series::MIN_TAIL_QUANTA),
        ("series::NOISE_SCALES", series::NOISE_SCALES),
        ("levelling::DECAY_FRACTION", levelling::DECAY_FRACTION),
        ("levelling::HALVING_RATIO", levelling::HALVING_RATIO),
        ("levelling::MIN_SIDE", levelling::MIN_SIDE as f64),
        ("levelling::MIN_SIDE_AFTER_STEP", levelling::MIN_SIDE_AFTER_STEP as f64),
        ("levelling::LEVEL_FRACTION", levelling::LEVEL_FRACTION),
        ("overhead::SLOWING_RATIO", overhead::SLOWING_RATIO),
        ("overhead::MIN_HALF_POINTS", overhead::MIN_HALF_POINTS as f64),
        ("overhead::MIN_RATIO_QUANTA", overhead::MIN_RATIO_QUANTA),
        ("overhead::HEAP_BUDGET", overhead::HEAP_BUDGET),
        ("overhead::FILL_SHARE", overhead::FILL_SHARE),
        ("overhead::FILL_ITERATIONS", overhead::FILL_ITERATIONS),
        ("overhead::HORIZON_RUNS", overhead::HORIZON_RUNS),
        ("steps::STEP_NOISE_SCALES", steps::STEP_NOISE_SCALES),
        ("steps::MIN_SIDE", steps::MIN_SIDE as f64),
        ("steps::MAX_CUTS", steps::MAX_CUTS as f64),
        ("steps::SMOOTH_HALF_WIDTH", steps::SMOOTH_HALF_WIDTH as f64),
        ("steps::LEVEL_FRACTION", steps::LEVEL_FRACTION),
        ("steps::OVERDUE", steps::OVERDUE),
        ("steps::TWO_STEP_RATIO", steps::TWO_STEP_RATIO),
        ("steps::MAX_RATIO", steps::MAX_RATIO),
        ("steps::CLUSTER_FRACTION", steps::CLUSTER_FRACTION),
        ("steps::WOBBLE_FACTOR", steps::WOBBLE_FACTOR),
        ("steps::LEVEL_SPREAD_FACTOR", steps::LEVEL_SPREAD_FACTOR),
        ("steps::SMALL_STEP_FRACTION", steps::SMALL_STEP_FRACTION),
        ("release::RELEASE_SHARE", release::RELEASE_SHARE),
        ("release::MIN_RELEASES", release::MIN_RELEASES as f64),
        ("power::RESOLUTION_DOUBLINGS", power::RESOLUTION_DOUBLINGS as f64),
        ("power::RESOLUTION_BISECTIONS", power::RESOLUTION_BISECTIONS as f64),
        ("power::RESOLUTION_MARGIN", power::RESOLUTION_MARGIN),
        ("live_heap::FLAT_SHARE", live_heap::FLAT_SHARE),
        ("attribution::HEAP_SHARE", attribution::HEAP_SHARE),
        ("stats::MAX_POINTS", stats::MAX_POINTS as f64),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// Where a setting came from: what the samples recorded, an override, or the detector's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum From {
    Header,
    Override,
    Default,
}

impl From {
    fn as_str(self) -> &'static str {
        match self {
            From::Header => "header",
            From::Override => "override",
            From::Default => "default",
        }
    }
}

/// The judge's part of a verdict's evidence: everything but the hashes of the files, which the
/// shell that read them fills in.
pub fn of_judge(cfg: &DetectorConfig, warmup_from: From, tolerance_from: From, planned: Option<u64>) -> Evidence {
    let mut settings = BTreeMap::new();
    let mut set = |k: &str, v: String| {
        settings.insert(k.to_string(), v);
    };
    set("warmup_iterations", cfg.warmup_iterations.to_string());
    set("warmup_iterations_from", warmup_from.as_str().to_string());
    set("tolerance", cfg.tolerance.to_string());
    set("tolerance_from", tolerance_from.as_str().to_string());
    set("p_value", cfg.p_value.to_string());
    set("tail_p_value", cfg.tail_p_value.to_string());
    set("min_points", cfg.min_points.to_string());
    set("planned_iterations", planned.map_or_else(|| "none recorded".to_string(), |p| p.to_string()));
    set("live_heap_windows", cfg.live_heap.len().to_string());
    Evidence { detector: version(), settings, constants: constants(), ..Evidence::default() }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_version_names_the_source_and_every_constant_is_finite() {
        let v = super::version();
        assert!(v.starts_with("plateau-detector "), "{v}");
        assert_eq!(v.rsplit('+').next().map(str::len), Some(16), "{v}");
        let c = super::constants();
        assert!(c.len() >= 30, "{} constants", c.len());
        assert!(c.values().all(|x| x.is_finite()));
        assert_eq!(c["overhead::FILL_SHARE"], 0.001);
    }
}
