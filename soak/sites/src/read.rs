//! sites.jsonl read back (its format: `record.rs`): processes, sites, quiescent points and each
//! site's changes, its series forward-filled at the points where its process was read, and the
//! sites of one name in one process and layer made one.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::Path;

use serde::Deserialize;

use super::record::{Domain, Process, SiteDef, MAX_FILE_BYTES, MAX_SITES, SITES_SCHEMA};

/// One quiescent point of a log: its iteration, and the processes unknown there.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub iter: u64,
    pub t: f64,
    pub missing: Vec<String>,
}

/// A sites.jsonl read back: its processes, sites and points, each site's changes by point.
#[derive(Debug, Clone, Default)]
pub struct SiteLog {
    pub processes: Vec<Process>,
    pub sites: Vec<SiteDef>,
    pub points: Vec<Point>,
    /// For each site (by id), its changes: (point index, bytes, objects).
    pub changes: Vec<Vec<(usize, i64, i64)>>,
    pub notes: Vec<String>,
}

#[derive(Deserialize)]
struct NameIn {
    id: u32,
    name: String,
    #[serde(default)]
    stack: Vec<String>,
}

#[derive(Deserialize)]
struct LineIn {
    schema: Option<String>,
    process: Option<Process>,
    site: Option<SiteDef>,
    name: Option<NameIn>,
    note: Option<String>,
    iter: Option<u64>,
    t: Option<f64>,
    #[serde(default)]
    bytes: BTreeMap<String, i64>,
    #[serde(default)]
    objects: BTreeMap<String, i64>,
    #[serde(default)]
    missing: Vec<String>,
}

impl SiteLog {
    /// Reads a sites file; errors name the file, line and field.
    pub fn read(path: &Path) -> Result<SiteLog, String> {
        let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
        if !meta.is_file() {
            return Err(format!("{}: not a regular file", path.display()));
        }
        if meta.len() > MAX_FILE_BYTES {
            return Err(format!(
                "{}: {} bytes, past the {MAX_FILE_BYTES} a sites file may hold",
                path.display(),
                meta.len()
            ));
        }
        let f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        SiteLog::parse(std::io::BufReader::new(f)).map_err(|e| format!("{}:{e}", path.display()))
    }

    /// Parses a sites log; an error is `LINE: FIELD: what`. A last line cut short (a run killed
    /// mid-write) is dropped.
    pub fn parse(r: impl BufRead) -> Result<SiteLog, String> {
        let mut log = SiteLog::default();
        let lines: Vec<String> = r.lines().collect::<Result<_, _>>().map_err(|e| format!("0: file: {e}"))?;
        for (k, text) in lines.iter().enumerate() {
            let n = k + 1;
            if text.trim().is_empty() {
                continue;
            }
            let l: LineIn = match serde_json::from_str(text) {
                Ok(l) => l,
                Err(_) if n == lines.len() && k > 0 => break,
                Err(e) => return Err(format!("{n}: line: {e}")),
            };
            if n == 1 {
                match l.schema.as_deref() {
                    Some(SITES_SCHEMA) => continue,
                    other => return Err(format!("1: schema: {other:?}, want {SITES_SCHEMA:?}")),
                }
            }
            log.take(n, l)?;
        }
        Ok(log.merged())
    }

    /// The log with the sites of one name (in one process and layer) made one: their values
    /// summed at every point.
    fn merged(self) -> SiteLog {
        let mut order: Vec<(String, Domain, String)> = Vec::new();
        let mut groups: BTreeMap<(String, Domain, String), Vec<usize>> = BTreeMap::new();
        for (id, d) in self.sites.iter().enumerate() {
            let key = (d.prefix.clone(), d.domain, d.name.clone());
            let g = groups.entry(key.clone()).or_default();
            if g.is_empty() {
                order.push(key);
            }
            g.push(id);
        }
        if order.len() == self.sites.len() {
            return self;
        }
        let mut out =
            SiteLog { processes: self.processes, points: self.points, notes: self.notes, ..SiteLog::default() };
        for key in order {
            let members = &groups[&key];
            let first = &self.sites[members[0]];
            out.sites.push(SiteDef { id: out.sites.len() as u32, ..first.clone() });
            out.changes.push(sum_changes(members.iter().map(|&m| &self.changes[m][..]).collect()));
        }
        out
    }

    fn take(&mut self, n: usize, l: LineIn) -> Result<(), String> {
        if let Some(p) = l.process {
            self.processes.push(p);
        } else if let Some(named) = l.name {
            let site =
                self.sites.get_mut(named.id as usize).ok_or_else(|| format!("{n}: name.id: no site {}", named.id))?;
            site.name = named.name;
            site.stack = named.stack;
        } else if let Some(s) = l.site {
            if s.id as usize != self.sites.len() {
                return Err(format!("{n}: site.id: {}, want {} (ids count up from 0)", s.id, self.sites.len()));
            }
            if self.sites.len() >= MAX_SITES {
                return Err(format!("{n}: site: more than {MAX_SITES} sites"));
            }
            self.sites.push(s);
            self.changes.push(Vec::new());
        } else if let Some(note) = l.note {
            self.notes.push(note);
        } else if let Some(iter) = l.iter {
            let at = self.points.len();
            if self.points.last().is_some_and(|p| p.iter > iter) {
                return Err(format!("{n}: iter: {iter} after {}", self.points.last().map_or(0, |p| p.iter)));
            }
            for (key, &b) in &l.bytes {
                let id: usize = key.parse().map_err(|_| format!("{n}: bytes.{key}: not a site id"))?;
                if id >= self.sites.len() {
                    return Err(format!("{n}: bytes.{key}: no site {id} defined before it"));
                }
                if b < 0 {
                    return Err(format!("{n}: bytes.{key}: {b}: a site holds no negative bytes"));
                }
                let o = l.objects.get(key).copied().unwrap_or(0).max(0);
                self.changes[id].push((at, b, o));
            }
            self.points.push(Point { iter, t: l.t.unwrap_or(0.0), missing: l.missing });
        } else {
            return Err(format!("{n}: line: none of process, site, note, iter"));
        }
        Ok(())
    }

    /// Site `id`'s live bytes at each point where its process was read: (iteration, bytes).
    pub fn series(&self, id: usize) -> Vec<(u64, f64)> {
        let prefix = &self.sites[id].prefix;
        let mut out = Vec::with_capacity(self.points.len());
        let mut changes = self.changes[id].iter().peekable();
        let mut value = 0i64;
        for (k, p) in self.points.iter().enumerate() {
            while let Some(&&(at, b, _)) = changes.peek() {
                if at > k {
                    break;
                }
                value = b;
                changes.next();
            }
            if !p.missing.contains(prefix) {
                out.push((p.iter, value as f64));
            }
        }
        out
    }
}

/// The changes of several sites' series as one series of their sums.
fn sum_changes(members: Vec<&[(usize, i64, i64)]>) -> Vec<(usize, i64, i64)> {
    let mut events: Vec<(usize, usize, i64, i64)> =
        members.iter().enumerate().flat_map(|(m, c)| c.iter().map(move |&(at, b, o)| (at, m, b, o))).collect();
    events.sort();
    let mut current = vec![(0i64, 0i64); members.len()];
    let mut out: Vec<(usize, i64, i64)> = Vec::new();
    let mut k = 0;
    while k < events.len() {
        let at = events[k].0;
        while k < events.len() && events[k].0 == at {
            current[events[k].1] = (events[k].2, events[k].3);
            k += 1;
        }
        let sum = current.iter().fold((0, 0), |a, c| (a.0 + c.0, a.1 + c.1));
        if out.last().map(|l| (l.1, l.2)) != Some(sum) {
            out.push((at, sum.0, sum.1));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_lines_are_named_and_a_cut_last_line_is_dropped() {
        let head = format!("{{\"schema\":\"{SITES_SCHEMA}\"}}\n");
        let parse = |body: &str| SiteLog::parse(format!("{head}{body}").as_bytes());
        assert!(parse("{\"iter\":1,\"bytes\":{\"0\":5}}\n").unwrap_err().starts_with("2: bytes.0: no site 0"));
        let site = r#"{"site":{"id":0,"prefix":"","domain":"jemalloc","name":"x.rs:1 f"}}"#;
        assert!(parse(&format!("{site}\n{{\"iter\":1,\"bytes\":{{\"0\":-5}}}}\n")).unwrap_err().contains("negative"));
        assert!(parse(r#"{"site":{"id":3,"prefix":"","domain":"malloc","name":"x"}}"#)
            .unwrap_err()
            .contains("site.id"));
        assert!(parse("{\"hello\":1}\n{\"iter\":1}\n").unwrap_err().starts_with("2: line: none of"));
        assert!(SiteLog::parse("{\"schema\":\"other\"}\n".as_bytes()).unwrap_err().starts_with("1: schema"));
        let log = parse(&format!("{site}\n{{\"iter\":1,\"bytes\":{{\"0\":5}}}}\n{{\"iter\":2,\"by")).unwrap();
        assert_eq!(log.series(0), vec![(1, 5.0)]);
    }
}
