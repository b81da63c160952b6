//! How a target's Prometheus metrics become plateau metrics: a rule per metric name that says its
//! plateau name, kind and unit, and whether it is an in-flight gauge (zero when the server is
//! quiescent: the soak waits for those before it samples).
//!
//! Rules for vLLM, SGLang, llama.cpp's server and `plateau serve` are built in ([`BUILT_IN`]); a
//! TOML file (`--metrics-map FILE`) adds rules for any other server, or overrides a built-in one:
//!
//! ```toml
//! [[metric]]
//! prometheus = "myserver_active_requests"   # the name /metrics writes (labels are summed)
//! as = "active_requests"                    # plateau's name, prefixed `target.` (default: the
//!                                           # Prometheus name, ':' written '.')
//! kind = "per_request"                      # gauge | per_request | bounded | counter | observed
//! unit = "count"                            # count | bytes (default count)
//! capacity = 4096                           # bounded only: the level it must never pass
//! in_flight = true                          # zero when quiescent (default false)
//! ```
//!
//! `plateau serve`'s `plateau_metric` family describes itself (its `name`, `kind`, `unit`,
//! `capacity` and `quantum` labels). A gauge no rule names is recorded as `observed` (plotted, not
//! judged); counters, histograms and summaries no rule names are left out.

use std::collections::BTreeMap;
use std::path::Path;

use plateau_reports::{Kind, MetricSpec};
use serde::Deserialize;

use super::exposition::{Sample, Type};

/// The prefix of every metric read from the target.
pub const PREFIX: &str = "target.";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub prometheus: String,
    #[serde(rename = "as")]
    pub name: Option<String>,
    pub kind: Kind,
    #[serde(default = "count")]
    pub unit: String,
    pub capacity: Option<u64>,
    #[serde(default)]
    pub in_flight: bool,
}

fn count() -> String {
    "count".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    metric: Vec<Rule>,
}

/// (Prometheus name, kind, capacity, in-flight) of the servers plateau knows. Usage fractions
/// (KV cache) are bounded by 1; running and waiting requests are per-request state and in flight.
pub const BUILT_IN: [(&str, Kind, Option<u64>, bool); 12] = [
    ("vllm:num_requests_running", Kind::PerRequest, None, true),
    ("vllm:num_requests_waiting", Kind::PerRequest, None, true),
    ("vllm:num_requests_swapped", Kind::PerRequest, None, true),
    ("vllm:gpu_cache_usage_perc", Kind::Bounded, Some(1), false),
    ("vllm:kv_cache_usage_perc", Kind::Bounded, Some(1), false),
    ("sglang:num_running_reqs", Kind::PerRequest, None, true),
    ("sglang:num_queue_reqs", Kind::PerRequest, None, true),
    ("sglang:token_usage", Kind::Bounded, Some(1), false),
    ("llamacpp:requests_processing", Kind::PerRequest, None, true),
    ("llamacpp:requests_deferred", Kind::PerRequest, None, true),
    ("plateau_requests_in_flight", Kind::PerRequest, None, true),
    ("plateau_idle_violations", Kind::PerRequest, None, false),
];

/// A metrics map is a page of rules: far under this.
const MAX_MAPPING_BYTES: u64 = 1 << 20;

/// The rules in force: the built-in ones, then a file's (a file's rule for a name replaces the
/// built-in one).
#[derive(Debug, Clone)]
pub struct Mapping {
    rules: BTreeMap<String, Rule>,
}

impl Mapping {
    pub fn built_in() -> Mapping {
        let rules = BUILT_IN
            .iter()
            .map(|&(p, kind, capacity, in_flight)| {
                (p.to_string(), Rule { prometheus: p.into(), name: None, kind, unit: count(), capacity, in_flight })
            })
            .collect();
        Mapping { rules }
    }

    /// The built-in rules and a mapping file's. Errors name the file and line.
    pub fn with_file(path: &Path) -> Result<Mapping, String> {
        let text = plateau_reports::fsutil::read_input_text(path, MAX_MAPPING_BYTES)?;
        Mapping::with_text(&text, &path.display().to_string())
    }

    pub fn with_text(text: &str, file: &str) -> Result<Mapping, String> {
        let parsed: File = toml::from_str(text).map_err(|e| {
            let line = e.span().map(|s| text[..s.start.min(text.len())].lines().count().max(1));
            let place = line.map(|l| format!("{file}:{l}")).unwrap_or_else(|| file.to_string());
            format!("{place}: {}", e.message())
        })?;
        let mut m = Mapping::built_in();
        for (k, r) in parsed.metric.into_iter().enumerate() {
            let at = format!("{file}: metric[{k}] ({})", r.prometheus);
            if !matches!(r.unit.as_str(), "count" | "bytes") {
                return Err(format!("{at}: unit {:?}: write count or bytes", r.unit));
            }
            if (r.kind == Kind::Bounded) != r.capacity.is_some() {
                return Err(format!("{at}: capacity goes with kind = \"bounded\", and only with it"));
            }
            m.rules.insert(r.prometheus.clone(), r);
        }
        Ok(m)
    }

    /// Every metric of a scrape that plateau records, summed over label sets, with its spec, and
    /// the in-flight total (None when no in-flight gauge was there).
    pub fn apply(&self, samples: &[Sample]) -> Scraped {
        let mut out = Scraped::default();
        for s in samples {
            let value = s.value;
            if s.name == plateau_serve::metrics::SETTLED {
                out.settled = Some(value == 1.0);
                continue;
            }
            if s.name == plateau_serve::metrics::FAMILY {
                if let Some((name, spec)) = self_described(&s.labels) {
                    out.add(format!("{PREFIX}{name}"), spec, value);
                }
                continue;
            }
            if let Some(r) = self.rules.get(&s.name) {
                let name = r.name.clone().unwrap_or_else(|| s.name.replace(':', "."));
                let quantum = (r.unit == "count").then_some(1.0);
                let spec = MetricSpec { capacity: r.capacity, quantum, ..MetricSpec::new(r.kind, &r.unit) };
                out.add(format!("{PREFIX}{name}"), spec, value);
                if r.in_flight {
                    *out.in_flight.get_or_insert(0.0) += value;
                }
            } else if s.kind == Type::Gauge {
                out.add(
                    format!("{PREFIX}{}", s.name.replace(':', ".")),
                    MetricSpec::new(Kind::Observed, "count"),
                    value,
                );
            }
        }
        out
    }
}

/// What one scrape gave: values (summed over label sets), their specs, and the in-flight total.
#[derive(Debug, Default)]
pub struct Scraped {
    pub values: BTreeMap<String, f64>,
    pub specs: BTreeMap<String, MetricSpec>,
    pub in_flight: Option<f64>,
    /// What a server that settles its allocator when asked said of this scrape (plateau serve);
    /// None for others.
    pub settled: Option<bool>,
}

impl Scraped {
    fn add(&mut self, name: String, spec: MetricSpec, value: f64) {
        *self.values.entry(name.clone()).or_insert(0.0) += value;
        self.specs.entry(name).or_insert(spec);
    }
}

/// A `plateau_metric` sample's name and spec, from its labels.
fn self_described(labels: &BTreeMap<String, String>) -> Option<(String, MetricSpec)> {
    let get = |k: &str| labels.get(k).map(String::as_str);
    let name = get("name")?;
    let kind = match get("kind")? {
        "gauge" => Kind::Gauge,
        "per_request" => Kind::PerRequest,
        "bounded" => Kind::Bounded,
        "counter" => Kind::Counter,
        _ => Kind::Observed,
    };
    let unit = get("unit").unwrap_or("count");
    let capacity = get("capacity").and_then(|c| c.parse().ok());
    let quantum = get("quantum").and_then(|q| q.parse().ok());
    Some((name.to_string(), MetricSpec { capacity, quantum, ..MetricSpec::new(kind, unit) }))
}

/// Parses Prometheus text (see [`super::exposition`]).
pub fn parse_text(text: &str, source: &str) -> Result<Vec<Sample>, String> {
    super::exposition::parse(text, source)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_servers_map_out_of_the_box() {
        let text = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 2\n\
                    vllm:num_requests_waiting{model_name=\"m\"} 1\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0.25\n\
                    # TYPE process_open_fds gauge\nprocess_open_fds 12\n";
        let s = Mapping::built_in().apply(&parse_text(text, "t").unwrap());
        assert_eq!(s.in_flight, Some(3.0));
        assert_eq!(s.specs["target.vllm.num_requests_running"].kind, Kind::PerRequest);
        assert_eq!(s.specs["target.vllm.kv_cache_usage_perc"].capacity, Some(1));
        assert_eq!(s.specs["target.process_open_fds"].kind, Kind::Observed);
    }

    #[test]
    fn plateau_serve_describes_itself() {
        let text = "plateau_metric{name=\"registry.requests\",kind=\"per_request\",unit=\"count\",quantum=\"1\"} 4\n";
        let s = Mapping::built_in().apply(&parse_text(text, "t").unwrap());
        assert_eq!(s.values["target.registry.requests"], 4.0);
        assert_eq!(s.specs["target.registry.requests"].kind, Kind::PerRequest);
    }

    #[test]
    fn a_mapping_file_with_an_unknown_kind_names_its_line() {
        let text = "[[metric]]\nprometheus = \"x\"\nkind = \"leaky\"\n";
        let e = Mapping::with_text(text, "map.toml").unwrap_err();
        assert!(e.starts_with("map.toml:3:"), "{e}");
        assert!(e.contains("leaky"), "{e}");
    }

    #[test]
    fn garbage_is_not_metrics() {
        let e = parse_text("ok 1\n<html>not found</html>\n", "GET /metrics").unwrap_err();
        assert!(e.contains("line 2"), "{e}");
    }
}
