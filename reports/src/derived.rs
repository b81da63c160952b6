//! Gauges a writer derives as the difference of two measures rather than measures: where such a
//! value may be read negative (older files), and how that is said.

use std::collections::BTreeMap;

/// Counts a sample's negative derived values: (first line, samples) per gauge.
pub(crate) fn note_negative(values: &BTreeMap<String, f64>, line: usize, seen: &mut BTreeMap<String, (usize, usize)>) {
    for (name, v) in values {
        if *v < 0.0 && is_derived(name) {
            seen.entry(name.clone()).or_insert((line, 0)).1 += 1;
        }
    }
}

/// Gauges plateau computes as the difference of two measures, not measured: `proc.anon_outside_heap`
/// (RssAnon less the allocator's own anonymous memory). Older plateaus wrote it negative (it was
/// RssAnon less jemalloc's `resident`, which counts pages RssAnon does not); such a value is read
/// (with a warning, `Samples::warnings`) while a negative measured amount stays bad input.
pub const DERIVED_GAUGES: [&str; 1] = ["proc.anon_outside_heap"];

/// Whether `name` (with any role prefix) is one of [`DERIVED_GAUGES`].
pub(crate) fn is_derived(name: &str) -> bool {
    DERIVED_GAUGES.iter().any(|d| name == *d || name.strip_suffix(d).is_some_and(|p| p.ends_with('.')))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_derived_gauge_is_known_under_any_role_and_nothing_else_is() {
        assert!(super::is_derived("proc.anon_outside_heap"));
        assert!(super::is_derived("decode.target.proc.anon_outside_heap"));
        assert!(!super::is_derived("target.xproc.anon_outside_heap"));
        assert!(!super::is_derived("proc.rss_anon"));
    }
}
