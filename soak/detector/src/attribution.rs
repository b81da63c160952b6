//! Says where growth is, once the verdict is drawn: in the heap (jemalloc) or outside it (the
//! kernel's view of the process with a heap that is flat or grows far less), which registries
//! moved with a failing gauge, and how many bytes each leaked entry of a per-request registry
//! holds. Names serve here only, after every metric has been judged by its kind.

use plateau_reports::{Kind, MetricVerdict, Samples, Status};

use super::series::fmt_value;
use super::stats::{mann_kendall, theil_sen};
use super::DetectorConfig;

/// The kernel's view of a process's memory: RSS and its parts, mappings, swap, page tables.
fn kernel_family(name: &str) -> bool {
    ["proc.rss", "proc.anon", "proc.shared", "proc.file_bytes", "proc.swap", "proc.pte"]
        .iter()
        .any(|f| name.contains(f))
}

/// The process a metric belongs to: its role prefix (`decode.`, `target.engine_core.`), or "" for
/// this process.
fn process_of(name: &str) -> &str {
    ["jemalloc.", "proc.", "py.", "malloc."].iter().find_map(|f| name.find(f).map(|i| &name[..i])).unwrap_or("")
}

/// Whether a process's Python layers are in the samples (plateau's hook in a Python server):
/// its objects, pymalloc's arenas, malloc in use and malloc's free memory.
fn python_layered(s: &Samples, process: &str) -> bool {
    ["py.object_bytes", "malloc.in_use_bytes"].iter().any(|l| s.header.metrics.contains_key(&format!("{process}{l}")))
}

/// Where a failing gauge of a Python process is, from which of its layers failed: objects it
/// keeps, malloc's heap (larger objects and native memory), pages its allocators keep, or
/// memory outside both heaps.
fn python_location(name: &str, failing: &dyn Fn(&str) -> bool) -> String {
    let p = process_of(name);
    let layer = &name[p.len()..];
    match layer {
        "py.object_bytes" => "Python objects the program keeps (pymalloc's blocks)".into(),
        "malloc.in_use_bytes" => "malloc's heap in use: Python's larger objects or native memory".into(),
        "py.arena_bytes" => "pages pymalloc keeps (its arenas), an overhead on the objects in them".into(),
        "malloc.free_bytes" => "freed memory malloc keeps instead of returning it".into(),
        _ if failing(&format!("{p}py.object_bytes")) => "process memory, with Python objects kept".into(),
        _ if failing(&format!("{p}malloc.in_use_bytes")) => {
            "process memory, with malloc's heap growing (larger objects or native memory)".into()
        }
        _ if failing(&format!("{p}malloc.free_bytes")) || failing(&format!("{p}py.arena_bytes")) => {
            "process memory: pages the allocators keep while what the program holds stays level".into()
        }
        _ => "process memory outside the Python and malloc heaps (other mappings), both level".into(),
    }
}

/// A heap growing at less than this fraction of a process's growth outside it is a side effect
/// (the bookkeeping of the mappings that leak), not where the memory goes.
pub(crate) const HEAP_SHARE: f64 = 0.1;

fn slope_of(ms: &[MetricVerdict], name: &str) -> f64 {
    ms.iter().find(|m| m.name == name).and_then(|m| m.trend.as_ref()).map_or(0.0, |t| t.slope_per_iter)
}

/// Registries (and engine byte gauges) whose own quiescent series rose significantly.
fn moved(s: &Samples, cfg: &DetectorConfig) -> Vec<(String, f64)> {
    s.names
        .iter()
        .enumerate()
        .filter(|(_, n)| {
            // Families after any role prefix (`decode.registry.pd.pulls`).
            let family = ["registry.", "engine."].iter().find_map(|f| n.find(f).map(|i| &n[i..])).unwrap_or("");
            family.starts_with("registry.") || family.starts_with("engine.") && family.ends_with("_bytes")
        })
        .filter(|(_, n)| !matches!(s.header.metrics[*n].kind, Kind::Counter | Kind::Observed))
        .filter_map(|(i, n)| {
            let pts: Vec<(u64, f64)> =
                s.quiescent_series(i).into_iter().filter(|p| p.0 > cfg.warmup_iterations).collect();
            if pts.len() < cfg.min_points {
                return None;
            }
            let x: Vec<f64> = pts.iter().map(|p| p.0 as f64).collect();
            let y: Vec<f64> = pts.iter().map(|p| p.1).collect();
            let sl = theil_sen(&x, &y);
            (sl > 0.0 && mann_kendall(&x, &y, sl).p_increase < cfg.p_value).then(|| (n.clone(), sl))
        })
        .collect()
}

/// Sets each failing gauge's location and returns the run's attribution lines.
pub fn attribute(s: &Samples, metrics: &mut [MetricVerdict], cfg: &DetectorConfig) -> Vec<String> {
    let mut out = Vec::new();
    let regs: Vec<&str> = metrics
        .iter()
        .filter(|m| m.status == Status::Fail && matches!(m.kind.as_str(), "per_request" | "bounded" | "check"))
        .map(|m| m.name.as_str())
        .collect();
    if !regs.is_empty() {
        out.push(format!("registry: {} kept entries past their requests", regs.join(", ")));
    }
    let moved = moved(s, cfg);
    let moved_text: Vec<String> = moved.iter().map(|(n, sl)| format!("{n} (+{sl:.1}/iteration)")).collect();
    let failing = |ms: &[MetricVerdict], name: &str| ms.iter().any(|m| m.name == name && m.status == Status::Fail);
    // Per process: is its growth outside the heap? (Its kernel-view growth is not the heap's.)
    // A process that reports no allocator statistics (a server under test that is not plateau's)
    // cannot have its heap told apart from its other memory.
    let unknown_heap = |name: &str| {
        let p = process_of(name);
        !s.header.metrics.contains_key(&format!("{p}jemalloc.allocated")) && !python_layered(s, p)
    };
    let layered = |name: &str| python_layered(s, process_of(name));
    let snapshot: Vec<Outside> = metrics
        .iter()
        .filter(|m| m.status == Status::Fail && m.kind == "gauge" && kernel_family(&m.name) && !unknown_heap(&m.name))
        .filter(|m| m.location.is_none() && !layered(&m.name))
        .map(|m| {
            let heap = format!("{}jemalloc.allocated", process_of(&m.name));
            let out_rate = m.trend.as_ref().map_or(0.0, |t| t.slope_per_iter);
            let heap_rate = slope_of(metrics, &heap);
            let outside = !failing(metrics, &heap) || heap_rate < HEAP_SHARE * out_rate;
            (m.name.clone(), out_rate, heap_rate, outside)
        })
        .collect();
    let failing_now: Vec<String> =
        metrics.iter().filter(|m| m.status == Status::Fail).map(|m| m.name.clone()).collect();
    let fails = |n: &str| failing_now.iter().any(|f| f == n);
    for m in metrics.iter_mut().filter(|m| m.status == Status::Fail && m.kind == "gauge") {
        let outside = snapshot.iter().find(|x| x.0 == m.name).map(|x| x.3);
        if layered(&m.name) && m.location.is_none() {
            m.location = Some(python_location(&m.name, &fails));
            if !moved_text.is_empty() {
                m.reason.push_str(&format!("; moved with it: {}", moved_text.join(", ")));
            }
            continue;
        }
        // Already named by the overhead rule (the allocator's overhead on a levelled heap).
        let named = m.location.take();
        m.location = Some(match outside {
            _ if named.is_some() => named.unwrap_or_default(),
            None if kernel_family(&m.name) && unknown_heap(&m.name) => {
                "process memory (no allocator statistics from this process: its heap and its other mappings are not told apart)".into()
            }
            Some(true) => {
                "outside the heap: memory the allocator did not make (anonymous, shared or file mappings)".into()
            }
            Some(false) => "process memory (the heap grows as much)".into(),
            None if m.name.contains("jemalloc.") => "heap (jemalloc)".into(),
            None if m.name.contains("gpu.") => "device memory".into(),
            None if m.name.contains("proc.") => "the process (descriptors, threads, mappings)".into(),
            None => "engine".into(),
        });
        if !moved_text.is_empty() {
            m.reason.push_str(&format!("; moved with it: {}", moved_text.join(", ")));
        }
    }
    out.extend(heap_lines(s, metrics, &moved));
    out.extend(outside_lines(metrics, &snapshot));
    out.extend(python_lines(s, metrics));
    let unknown: Vec<&MetricVerdict> = metrics
        .iter()
        .filter(|m| m.status == Status::Fail && m.kind == "gauge" && kernel_family(&m.name) && unknown_heap(&m.name))
        .collect();
    if let Some(lead) = unknown.iter().find(|m| m.name.ends_with("rss_anon")).or(unknown.first()) {
        out.push(format!(
            "process memory: {} grow ({} {}/iteration); the process reports no allocator statistics, so its heap and its other mappings are not told apart",
            unknown.iter().map(|m| m.name.as_str()).collect::<Vec<_>>().join(", "),
            lead.name,
            fmt_value(lead.trend.as_ref().map_or(0.0, |t| t.slope_per_iter), "bytes"),
        ));
    }
    if !moved_text.is_empty() && metrics.iter().any(|m| m.status == Status::Fail && m.kind == "gauge") {
        out.push(format!("moved with the growth: {}", moved_text.join(", ")));
    }
    out
}

/// For each Python process (plateau's hook) with a failing gauge, the line on which of its layers
/// grew: objects it keeps, malloc's heap, pages the allocators keep, or memory outside both.
fn python_lines(s: &Samples, metrics: &[MetricVerdict]) -> Vec<String> {
    let mut processes: Vec<&str> = metrics
        .iter()
        .filter(|m| m.status == Status::Fail && m.kind == "gauge" && python_layered(s, process_of(&m.name)))
        .map(|m| process_of(&m.name))
        .collect();
    processes.sort_unstable();
    processes.dedup();
    processes
        .into_iter()
        .map(|p| {
            let rate = |layer: &str| fmt_value(slope_of(metrics, &format!("{p}{layer}")), "bytes");
            let grew: Vec<&str> = metrics
                .iter()
                .filter(|m| m.status == Status::Fail && process_of(&m.name) == p)
                .map(|m| &m.name[p.len()..])
                .collect();
            let has = |l: &str| grew.contains(&l);
            let who = p.trim_end_matches('.');
            if has("py.object_bytes") {
                format!("{who}: the program keeps Python objects (py.object_bytes {}/iteration)", rate("py.object_bytes"))
            } else if has("malloc.in_use_bytes") {
                format!(
                    "{who}: malloc's heap in use grows ({}/iteration) while Python's small objects stay level: larger objects or native memory",
                    rate("malloc.in_use_bytes")
                )
            } else if has("malloc.free_bytes") || has("py.arena_bytes") {
                format!(
                    "{who}: the allocators keep pages (malloc.free_bytes {}/iteration, py.arena_bytes {}/iteration) while what the program holds stays level",
                    rate("malloc.free_bytes"),
                    rate("py.arena_bytes")
                )
            } else {
                format!(
                    "{who}: {} grow while Python's objects and malloc's heap stay level: memory outside both (other mappings)",
                    grew.join(", ")
                )
            }
        })
        .collect()
}

/// A failing kernel-view gauge of a process with allocator statistics: its name, its rate, its
/// heap's rate, and whether its growth is outside the heap.
type Outside = (String, f64, f64, bool);

/// The heap's line for each failing heap, with bytes per leaked entry of each per-request
/// registry that grew with it.
fn heap_lines(s: &Samples, metrics: &[MetricVerdict], moved: &[(String, f64)]) -> Vec<String> {
    let mut out = Vec::new();
    // The heap, with bytes per leaked entry of each per-request registry that grew with it.
    for heap in metrics.iter().filter(|m| m.status == Status::Fail && m.name.ends_with("jemalloc.allocated")) {
        let rate = heap.trend.as_ref().map_or(0.0, |t| t.slope_per_iter);
        let per_entry: Vec<String> = moved
            .iter()
            .filter(|(n, sl)| *sl >= 1.0 && s.header.metrics[n].kind == Kind::PerRequest)
            .map(|(n, sl)| format!("about {} per entry of {n}", fmt_value(rate / sl, "bytes")))
            .collect();
        let per_entry = if per_entry.is_empty() { String::new() } else { format!(" ({})", per_entry.join(", ")) };
        out.push(format!("heap: {} grows {}/iteration{per_entry}", heap.name, fmt_value(rate, "bytes")));
    }
    out
}

/// Outside the heap, per process: what grows, against that process's heap.
fn outside_lines(metrics: &[MetricVerdict], snapshot: &[Outside]) -> Vec<String> {
    let failing = |ms: &[MetricVerdict], name: &str| ms.iter().any(|m| m.name == name && m.status == Status::Fail);
    let mut out = Vec::new();
    let mut processes: Vec<&str> = snapshot.iter().filter(|x| x.3).map(|x| process_of(&x.0)).collect();
    processes.dedup();
    for p in processes {
        let grown: Vec<&Outside> = snapshot.iter().filter(|x| x.3 && process_of(&x.0) == p).collect();
        let lead = grown.iter().find(|x| x.0.ends_with("anon_outside_heap")).unwrap_or(&grown[0]);
        let heap_name = format!("{p}jemalloc.allocated");
        let heap_says = if failing(metrics, &heap_name) {
            format!("{heap_name} grows only {}/iteration", fmt_value(lead.2, "bytes"))
        } else {
            format!("{heap_name} stays flat ({}/iteration)", fmt_value(lead.2, "bytes"))
        };
        out.push(format!(
            "outside the heap: {} grow ({} {}/iteration) while {heap_says}: mappings made outside the allocator",
            grown.iter().map(|x| x.0.as_str()).collect::<Vec<_>>().join(", "),
            lead.0,
            fmt_value(lead.1, "bytes"),
        ));
    }
    out
}
