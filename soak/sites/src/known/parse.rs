//! A known-growth file read strictly: every entry names its process, its sites, its rate, its
//! reason and its expiry, or the file is refused naming the entry and the field.

use plateau_reports::{Per, Tolerance};

use super::{Date, Entry, Known};

/// Entries a file may hold: far more than a team's open upstream reports, and a bound on the
/// work of matching every growing site against every entry.
pub const MAX_ENTRIES: usize = 256;

/// Errors listed at most for one file (the rest are counted).
const MAX_ERRORS: usize = 20;

const FIELDS: [&str; 5] = ["process", "site", "max_per_request", "reason", "until"];

/// The entries of `text`, the file `file` (named in every error), judged on `on`.
pub fn parse(text: &str, file: &str, on: Date) -> Result<Known, String> {
    let table: toml::Table = toml::from_str(text).map_err(|e| format!("{file}: {}", e.to_string().trim_end()))?;
    if let Some(k) = table.keys().find(|k| k.as_str() != "known") {
        return Err(format!("{file}: `{k}`: not a known-growth setting; the file holds `[[known]]` entries only"));
    }
    let list = match table.get("known") {
        None => return Err(format!("{file}: no `[[known]]` entry: an empty file accepts nothing; remove --known")),
        Some(toml::Value::Array(a)) => a,
        Some(_) => return Err(format!("{file}: `known`: write each entry as a `[[known]]` table")),
    };
    if list.len() > MAX_ENTRIES {
        return Err(format!("{file}: {} entries, more than {MAX_ENTRIES}", list.len()));
    }
    let mut entries = Vec::new();
    let mut errors = Vec::new();
    for (i, v) in list.iter().enumerate() {
        let number = i + 1;
        match v.as_table() {
            None => errors.push(format!("{file}: entry {number}: not a table: write it as `[[known]]`")),
            Some(t) => match entry(t, number) {
                Ok(e) => entries.push(e),
                Err(es) => errors.extend(es.into_iter().map(|e| format!("{file}: entry {number}: {e}"))),
            },
        }
    }
    if !errors.is_empty() {
        let more = errors.len().saturating_sub(MAX_ERRORS);
        errors.truncate(MAX_ERRORS);
        if more > 0 {
            errors.push(format!("{file}: and {more} more"));
        }
        return Err(errors.join("\n"));
    }
    Ok(Known { file: file.to_string(), on, entries })
}

/// One `[[known]]` table, or every field that is wrong in it.
fn entry(t: &toml::Table, number: usize) -> Result<Entry, Vec<String>> {
    let mut errors = Vec::new();
    for k in t.keys().filter(|k| !FIELDS.contains(&k.as_str())) {
        errors.push(format!("`{k}`: not a field of an entry (they are {})", FIELDS.join(", ")));
    }
    let text = |field: &str, errors: &mut Vec<String>, why: &str| -> Option<String> {
        match t.get(field) {
            Some(toml::Value::String(s)) if !s.trim().is_empty() => Some(s.clone()),
            Some(toml::Value::String(_)) | None => {
                errors.push(format!("`{field}` is required: {why}"));
                None
            }
            Some(other) => {
                errors.push(format!("`{field}`: a string, not {}", other.type_str()));
                None
            }
        }
    };
    let process = text("process", &mut errors, "a process role (`engine_core`, `worker`, `target`) or `*`");
    let site = text("site", &mut errors, "a regular expression on the site names a verdict gives");
    let site_re = site.as_deref().and_then(|s| match regex::Regex::new(s) {
        Ok(r) => Some(r),
        Err(e) => {
            errors.push(format!("`site`: {s:?} is not a regular expression: {}", one_line(&e.to_string())));
            None
        }
    });
    let reason = text("reason", &mut errors, "why the growth is known (the upstream issue)");
    let max = match t.get("max_per_request") {
        None => {
            errors.push("`max_per_request` is required: the bytes a request may keep (`1KiB`, `80B`)".into());
            None
        }
        Some(v) => rate(v).map_err(|e| errors.push(format!("`max_per_request`: {e}"))).ok(),
    };
    let until = match t.get("until") {
        None => {
            errors.push(
                "`until` is required: the date the entry expires (`2027-03-31`): known growth is looked at again"
                    .into(),
            );
            None
        }
        Some(v) => date(v).map_err(|e| errors.push(format!("`until`: {e}"))).ok(),
    };
    match (process, site, site_re, reason, max, until) {
        (Some(process), Some(site_text), Some(site), Some(reason), Some((max_text, max)), Some(until))
            if errors.is_empty() =>
        {
            Ok(Entry { number, process, site, site_text, max_per_request: max, max_text, reason, until })
        }
        _ => Err(errors),
    }
}

/// Bytes per request as `--tolerance` writes them (`1KiB`, `80B`, `1KiB/request`), or a number
/// of bytes.
fn rate(v: &toml::Value) -> Result<(String, f64), String> {
    let text = match v {
        toml::Value::String(s) => s.trim().to_string(),
        toml::Value::Integer(n) if *n >= 0 => format!("{n}B"),
        toml::Value::Float(x) if x.is_finite() && *x >= 0.0 => format!("{x}B"),
        other => return Err(format!("bytes per request (`1KiB`), not {}", other.type_str())),
    };
    let per = if text.contains('/') { text.clone() } else { format!("{text}/request") };
    let t: Tolerance = per.parse()?;
    if t.per != Per::Request {
        return Err(format!(
            "`{text}`: known growth is accepted per request (a rate per iteration depends on the scenario)"
        ));
    }
    Ok((text, t.bytes))
}

/// A calendar day: a TOML date (`until = 2027-03-31`) or the same as a string.
fn date(v: &toml::Value) -> Result<Date, String> {
    match v {
        toml::Value::Datetime(d) => Date::from_datetime(*d),
        toml::Value::String(s) => s.parse(),
        other => Err(format!("a date (YYYY-MM-DD), not {}", other.type_str())),
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
