//! Prometheus text exposition (format 0.0.4), read: the samples of a /metrics page with their
//! family's type.
//!
//! Written here because the parsers at hand reject the names the servers plateau soaks use: metric
//! names may hold `:` (`vllm:num_requests_running`, `llamacpp:requests_processing`), which
//! prometheus-parse 0.2.5 (its sample pattern is `\w+`) and openmetrics-parser 0.4.4 (lower-case
//! letters, digits and `_` only) both refuse. A line that is neither a comment nor a sample is an
//! error naming the line, never skipped.

use std::collections::BTreeMap;

/// A family's `# TYPE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Type {
    Gauge,
    Counter,
    Histogram,
    Summary,
    Untyped,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
    /// The type of the sample's family (a histogram's `_bucket`, `_sum` and `_count` included).
    pub kind: Type,
}

/// Lines of a page read at most: a bound on the work one scrape can cost.
const MAX_LINES: usize = 1_000_000;

/// The samples of `text`; `source` names it in errors (`GET http://.../metrics`).
pub fn parse(text: &str, source: &str) -> Result<Vec<Sample>, String> {
    let mut types: BTreeMap<&str, Type> = BTreeMap::new();
    let mut out = Vec::new();
    for (k, raw) in text.lines().enumerate() {
        if k >= MAX_LINES {
            return Err(format!("{source}: more than {MAX_LINES} lines"));
        }
        let line = raw.trim();
        let at =
            || format!("{source} line {}: not Prometheus text: {}", k + 1, line.chars().take(80).collect::<String>());
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let mut words = comment.split_whitespace();
            if words.next() == Some("TYPE") {
                let (Some(name), Some(t)) = (words.next(), words.next()) else { return Err(at()) };
                let t = match t {
                    "gauge" => Type::Gauge,
                    "counter" => Type::Counter,
                    "histogram" => Type::Histogram,
                    "summary" => Type::Summary,
                    "untyped" | "unknown" => Type::Untyped,
                    _ => return Err(at()),
                };
                types.insert(name, t);
            }
            continue;
        }
        let (name, rest) = split_name(line).ok_or_else(at)?;
        let (labels, rest) = match rest.strip_prefix('{') {
            Some(r) => labels(r).ok_or_else(at)?,
            None => (BTreeMap::new(), rest),
        };
        let value = rest.split_whitespace().next().and_then(number).ok_or_else(at)?;
        let family = ["_bucket", "_sum", "_count", "_total", "_created"]
            .iter()
            .filter_map(|s| name.strip_suffix(s))
            .find(|f| types.contains_key(f))
            .unwrap_or(name);
        let kind = types.get(name).or_else(|| types.get(family)).copied().unwrap_or(Type::Untyped);
        out.push(Sample { name: name.to_string(), labels, value, kind });
    }
    Ok(out)
}

/// A metric name (`[a-zA-Z_:][a-zA-Z0-9_:]*`) and what follows it.
fn split_name(line: &str) -> Option<(&str, &str)> {
    let end = line.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')).unwrap_or(line.len());
    let name = &line[..end];
    let first = name.chars().next()?;
    (!first.is_ascii_digit()).then_some((name, &line[end..]))
}

/// `a="x",b="y\"z"}` and what follows the brace.
fn labels(mut s: &str) -> Option<(BTreeMap<String, String>, &str)> {
    let mut out = BTreeMap::new();
    loop {
        s = s.trim_start();
        if let Some(rest) = s.strip_prefix('}') {
            return Some((out, rest));
        }
        let eq = s.find('=')?;
        let key = s[..eq].trim();
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return None;
        }
        let mut chars = s[eq + 1..].trim_start().char_indices();
        let body = s[eq + 1..].trim_start();
        if chars.next()?.1 != '"' {
            return None;
        }
        let mut value = String::new();
        let mut end = None;
        let mut escaped = false;
        for (i, c) in chars {
            match (escaped, c) {
                (true, 'n') => value.push('\n'),
                (true, c) => value.push(c),
                (false, '\\') => {}
                (false, '"') => {
                    end = Some(i);
                    break;
                }
                (false, c) => value.push(c),
            }
            escaped = !escaped && c == '\\';
        }
        out.insert(key.to_string(), value);
        s = body[end? + 1..].trim_start();
        s = s.strip_prefix(',').unwrap_or(s);
    }
}

fn number(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => s.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_with_colons_labels_with_escapes_and_types() {
        let text = "# HELP vllm:num_requests_running Running.\n# TYPE vllm:num_requests_running gauge\n\
                    vllm:num_requests_running{model_name=\"a,b\",x=\"q\\\"t\"} 2 1700000000\n\
                    # TYPE lat histogram\nlat_bucket{le=\"+Inf\"} 3\nlat_sum 1.5\nup 1\n";
        let s = parse(text, "t").unwrap();
        assert_eq!(s[0].name, "vllm:num_requests_running");
        assert_eq!(s[0].labels["model_name"], "a,b");
        assert_eq!(s[0].labels["x"], "q\"t");
        assert_eq!((s[0].value, s[0].kind), (2.0, Type::Gauge));
        assert_eq!(s[1].kind, Type::Histogram);
        assert_eq!(s[2].kind, Type::Histogram);
        assert_eq!(s[3].kind, Type::Untyped);
    }

    #[test]
    fn garbage_names_its_line() {
        for bad in ["<html>", "up", "up x", "up{a=b} 1", "9up 1", "# TYPE up sideways"] {
            let e = parse(&format!("ok 1\n{bad}\n"), "GET /metrics").unwrap_err();
            assert!(e.starts_with("GET /metrics line 2:"), "{bad}: {e}");
        }
    }
}
