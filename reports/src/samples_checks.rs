//! What a samples file must hold, line by line: a consistent header, samples in order, values a
//! level can be. Each check names the field at fault and why.

use super::{Header, Kind, Row, SampleLine, SamplesError, MAX_VALUE, UNITS};

/// The header's own consistency: every field a metric needs, every figure a number it can be.
pub(super) fn check_header(header: &Header) -> Result<(), (String, String)> {
    for (name, spec) in &header.metrics {
        if spec.kind == Kind::Bounded && spec.capacity.is_none() {
            return Err((format!("metrics.{name}.capacity"), "a bounded metric needs a capacity".into()));
        }
        if !UNITS.contains(&spec.unit.as_str()) {
            return Err((
                format!("metrics.{name}.unit"),
                format!("`{}` is not a unit this format takes: write values in `bytes` or as a `count`", spec.unit),
            ));
        }
        if spec.quantum.is_some_and(|q| !(q.is_finite() && q > 0.0 && q <= MAX_VALUE)) {
            return Err((format!("metrics.{name}.quantum"), "must be a positive number".into()));
        }
        let related = spec.within.iter().chain(&spec.overhead_of).chain(&spec.overhead_with).chain(&spec.reserved_by);
        for other in related {
            if !header.metrics.contains_key(other) {
                return Err((
                    format!("metrics.{name}"),
                    format!("names `{other}` as a related metric, but the header has no such metric"),
                ));
            }
        }
    }
    if header.planned_duration_s.is_some_and(|d| !(d.is_finite() && d > 0.0)) {
        return Err(("planned_duration_s".into(), "must be a positive number of seconds".into()));
    }
    Ok(())
}

pub(super) fn bad_line(err: &impl Fn(usize, &str, String) -> SamplesError, n: usize, line: &str) -> SamplesError {
    let v: serde_json::Value = match serde_json::from_str(line) {
        Ok(v) => v,
        Err(e) => return err(n, "sample", format!("not JSON: {e}")),
    };
    let Some(o) = v.as_object() else {
        return err(n, "sample", "not a JSON object".into());
    };
    type Check = (&'static str, fn(&serde_json::Value) -> bool, &'static str);
    let checks: [Check; 4] = [
        ("t", |x| x.is_number(), "a number of seconds"),
        ("iter", |x| x.is_u64(), "a non-negative integer"),
        ("quiescent", |x| x.is_boolean(), "true or false"),
        ("values", |x| x.is_object(), "an object of metric values"),
    ];
    for (field, ok, want) in checks {
        match o.get(field) {
            None => return err(n, field, "missing".into()),
            Some(x) if !ok(x) => return err(n, field, format!("{x} is not {want}")),
            Some(_) => {}
        }
    }
    for (name, x) in o["values"].as_object().expect("checked") {
        if !x.is_number() {
            return err(n, &format!("values.{name}"), format!("{x} is not a number"));
        }
    }
    err(n, "sample", "unreadable".into())
}

pub(super) fn header_field(msg: &str) -> String {
    for f in ["scenario", "seed", "backend", "metrics", "kind", "unit", "capacity", "quantum"] {
        if msg.contains(&format!("`{f}`")) {
            return f.to_string();
        }
    }
    "header".into()
}

/// A sample's time and iteration against the sample before it, and its time as a number: the
/// field at fault and why, else nothing.
pub(super) fn check_order(s: &SampleLine, prev: Option<&Row>) -> Result<(), (&'static str, String)> {
    if let Some(prev) = prev {
        if s.t.partial_cmp(&prev.t) != Some(std::cmp::Ordering::Greater) {
            return Err(("t", format!("{} does not increase (the sample before has {})", s.t, prev.t)));
        }
        if s.iter < prev.iter {
            return Err(("iter", format!("{} is below the sample before's {}", s.iter, prev.iter)));
        }
    }
    if !s.t.is_finite() {
        return Err(("t", format!("{} is not a finite number of seconds", s.t)));
    }
    Ok(())
}

/// A sample's values: finite, within what a level can be, and never negative for bytes or counts;
/// the field at fault and why, else nothing.
pub(super) fn check_values(s: &SampleLine, header: &Header) -> Result<(), (String, String)> {
    for (name, v) in &s.values {
        if !(v.is_finite() && v.abs() <= MAX_VALUE) {
            return Err((
                format!("values.{name}"),
                format!(
                    "{v} is past what a level of bytes or a count can be (at most 2^53, where every integer is exact)"
                ),
            ));
        }
        let unit = header.metrics.get(name).map(|m| m.unit.as_str());
        if *v < 0.0 && matches!(unit, Some("bytes" | "count")) && !crate::derived::is_derived(name) {
            return Err((
                format!("values.{name}"),
                format!("{v} is negative, and an amount of {} cannot be", unit.unwrap_or("")),
            ));
        }
    }
    Ok(())
}
