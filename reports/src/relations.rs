//! Relations between metrics: evidence the detector weighs beside a gauge's own series, declared
//! in the samples header (`within`, `overhead_of` with `overhead_with`, `reserved_by`).
//!
//! - `within`: a level that lives inside another (resident file pages inside the file mappings).
//!   Growth under a bound that levelled off is pages brought in, a fill towards a ceiling.
//! - `overhead_of`: the allocator's bookkeeping and pages, the page tables and the anonymous pages
//!   are overheads on the live heap. While the heap levels off, their growth is fragmentation or
//!   bookkeeping, which must slow down; `overhead_with` names the other levels the gauge holds
//!   (memory outside the heap, file and shared pages), which must level off too.
//! - `reserved_by`: an address space the allocator reserves inside (jemalloc's `mapped` and
//!   `retained` inside the process's anonymous address space): growth that is all the
//!   allocator's, while the rest stays level, is addresses kept for reuse.
//!
//! The detector reads relations from the header only. plateau's own writers declare them with
//! [`v1_relations`]; for a file whose writer declared none, the reader fills in what the samples v1
//! families define (their names are part of the format) and says so in a warning, once per file.

use crate::{Header, MetricSpec};

/// The relations of a samples v1 family: (family, within, overhead_of, overhead_with,
/// reserved_by), each name relative to the same role prefix.
type FamilyRelations =
    (&'static str, Option<&'static str>, Option<&'static str>, &'static [&'static str], &'static [&'static str]);

const HEAP: &str = "jemalloc.allocated";
const OUTSIDE: &str = "proc.anon_outside_heap";

const V1: [FamilyRelations; 9] = [
    ("proc.rss_file", Some("proc.file_bytes"), None, &[], &[]),
    ("jemalloc.active", None, Some(HEAP), &[], &[]),
    ("jemalloc.resident", None, Some(HEAP), &[], &[]),
    ("jemalloc.mapped", None, Some(HEAP), &[], &[]),
    ("jemalloc.metadata", None, Some(HEAP), &[], &[]),
    ("proc.pte", None, Some(HEAP), &[OUTSIDE], &[]),
    ("proc.rss_anon", None, Some(HEAP), &[OUTSIDE], &[]),
    ("proc.rss", None, Some(HEAP), &[OUTSIDE, "proc.rss_file", "proc.rss_shmem"], &[]),
    ("proc.anon_bytes", None, None, &[], &["jemalloc.mapped", "jemalloc.retained"]),
];

/// The relations the samples v1 family of `name` defines, given the metrics the file holds
/// (`has`): a relation whose metrics are not all there is left out. None for a name outside
/// those families.
pub fn v1_relations(name: &str, has: &dyn Fn(&str) -> bool) -> Option<MetricSpec> {
    let (prefix, (_, within, overhead_of, with, reserved)) = V1.iter().find_map(|f| {
        let prefix = name.strip_suffix(f.0)?;
        (prefix.is_empty() || prefix.ends_with('.')).then_some((prefix, f))
    })?;
    let full = |n: &str| format!("{prefix}{n}");
    let all_there = |names: &[&str]| names.iter().all(|n| has(&full(n)));
    let mut spec = MetricSpec::new(crate::Kind::Gauge, "bytes");
    spec.within = within.filter(|w| has(&full(w))).map(full);
    if let Some(heap) = overhead_of.filter(|h| has(&full(h)) && all_there(with)) {
        spec.overhead_of = Some(full(heap));
        spec.overhead_with = with.iter().map(|w| full(w)).collect();
    }
    if all_there(reserved) {
        spec.reserved_by = reserved.iter().map(|r| full(r)).collect();
    }
    Some(spec)
}

/// Declares, on every metric of `metrics` that declares none, the relations its samples v1
/// family defines among the metrics there: what plateau's writers put in their headers.
pub fn declare_v1(metrics: &mut std::collections::BTreeMap<String, MetricSpec>) {
    let names: Vec<String> = metrics.keys().cloned().collect();
    let has = |n: &str| names.iter().any(|x| x == n);
    for name in &names {
        let Some(r) = v1_relations(name, &has) else { continue };
        let spec = metrics.get_mut(name).expect("a name of the map");
        if !spec.declares_relations() {
            declare(spec, r);
        }
    }
}

/// Copies the relations of `from` onto `to`.
pub fn declare(to: &mut MetricSpec, from: MetricSpec) {
    to.within = from.within;
    to.overhead_of = from.overhead_of;
    to.overhead_with = from.overhead_with;
    to.reserved_by = from.reserved_by;
}

/// Fills in the v1 families' relations of a header whose writer declared none at all, and returns
/// the warning that says which (none when the header declared some or none apply).
pub fn imply_v1(header: &mut Header) -> Option<String> {
    if header.metrics.values().any(MetricSpec::declares_relations) {
        return None;
    }
    let names: Vec<String> = header.metrics.keys().cloned().collect();
    let has = |n: &str| names.iter().any(|x| x == n);
    let mut implied = Vec::new();
    for name in &names {
        let Some(r) = v1_relations(name, &has).filter(MetricSpec::declares_relations) else { continue };
        implied.push(describe(name, &r));
        declare(header.metrics.get_mut(name).expect("a name of the header"), r);
    }
    (!implied.is_empty()).then(|| {
        format!(
            "the header declares no relation between metrics; the samples v1 families define these: {}",
            implied.join("; ")
        )
    })
}

/// "proc.rss_file within proc.file_bytes".
fn describe(name: &str, r: &MetricSpec) -> String {
    let mut parts = Vec::new();
    if let Some(w) = &r.within {
        parts.push(format!("within {w}"));
    }
    if let Some(h) = &r.overhead_of {
        let with =
            if r.overhead_with.is_empty() { String::new() } else { format!(" with {}", r.overhead_with.join(", ")) };
        parts.push(format!("an overhead of {h}{with}"));
    }
    if !r.reserved_by.is_empty() {
        parts.push(format!("reserved by {}", r.reserved_by.join(" and ")));
    }
    format!("{name} {}", parts.join(", "))
}

/// A cycle among the metrics' relations (`within`, `overhead_of`, `overhead_with`,
/// `reserved_by`), as the names along it back to the first, if there is one. Each relation
/// judges a gauge against others: a gauge that ends up judged against itself would explain its
/// own growth away.
pub(crate) fn cycle(header: &Header) -> Option<Vec<String>> {
    let next = |name: &str| -> Vec<&String> {
        header.metrics.get(name).map_or_else(Vec::new, |spec| {
            spec.within.iter().chain(&spec.overhead_of).chain(&spec.overhead_with).chain(&spec.reserved_by).collect()
        })
    };
    // Depth-first from each metric in name order; `done` holds those with no cycle beneath.
    let mut done = std::collections::BTreeSet::new();
    for start in header.metrics.keys() {
        let mut path: Vec<String> = Vec::new();
        let mut stack: Vec<(String, usize)> = vec![(start.clone(), 0)];
        while let Some((name, k)) = stack.pop() {
            if k == 0 {
                if let Some(at) = path.iter().position(|p| *p == name) {
                    let mut cycle = path[at..].to_vec();
                    cycle.push(name);
                    return Some(cycle);
                }
                if done.contains(&name) {
                    continue;
                }
                path.push(name.clone());
            }
            let outs = next(&name);
            match outs.get(k) {
                Some(other) => {
                    stack.push((name, k + 1));
                    stack.push(((*other).clone(), 0));
                }
                None => {
                    path.pop();
                    done.insert(name);
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Kind;

    fn header(names: &[&str]) -> Header {
        Header {
            metrics: names.iter().map(|n| (n.to_string(), MetricSpec::new(Kind::Gauge, "bytes"))).collect(),
            ..Header::default()
        }
    }

    #[test]
    fn the_v1_families_relations_are_implied_only_where_none_is_declared_and_all_parts_exist() {
        let mut h = header(&["decode.proc.rss_file", "decode.proc.file_bytes", "proc.rss", "jemalloc.allocated"]);
        let said = imply_v1(&mut h).expect("a relation applies");
        assert_eq!(h.metrics["decode.proc.rss_file"].within.as_deref(), Some("decode.proc.file_bytes"));
        // proc.rss's other parts are not in the file: no overhead relation for it.
        assert_eq!(h.metrics["proc.rss"].overhead_of, None);
        assert!(said.contains("decode.proc.rss_file within decode.proc.file_bytes"), "{said}");
        let mut declared = header(&["proc.rss_file", "proc.file_bytes", "jemalloc.metadata", "jemalloc.allocated"]);
        declared.metrics.get_mut("jemalloc.metadata").unwrap().overhead_of = Some("jemalloc.allocated".into());
        assert_eq!(imply_v1(&mut declared), None);
        assert_eq!(
            declared.metrics["proc.rss_file"].within, None,
            "a writer that declares relations is taken at its word"
        );
    }

    #[test]
    fn names_outside_the_families_have_none() {
        assert!(v1_relations("registry.requests", &|_| true).is_none());
        assert!(v1_relations("xproc.rss_file", &|_| true).is_none());
        let r = v1_relations("proc.anon_bytes", &|_| true).unwrap();
        assert_eq!(r.reserved_by, vec!["jemalloc.mapped", "jemalloc.retained"]);
    }
}
