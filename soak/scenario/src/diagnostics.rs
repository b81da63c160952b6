//! Where a scenario error is: file, line, column and field, with the closest known name for a
//! typo. serde's errors carry a byte span; a phase's errors are located by reading that phase
//! alone again, since its `kind` tag hides where in the phase the error is.

use super::phases::{Batch, Pressure, Sleep};

/// A scenario error: where (file:line:column), which field, what, and a suggestion.
#[derive(Debug, thiserror::Error)]
#[error("{file}:{line}:{column}: {message}")]
pub struct ScenarioError {
    pub file: String,
    pub line: usize,
    pub column: usize,
    pub message: String,
}

/// Where a value sits in the file: (section, index of a repeated section), key.
#[derive(Debug, Clone, Copy)]
pub(super) struct Place<'a> {
    pub section: Option<(&'a str, usize)>,
    pub key: &'a str,
}

/// A phase is read through its `kind` tag, which hides where in the phase an error is. When
/// `line` falls in a `[[phase]]`, that phase's body alone is read again as its own kind, with
/// the `kind` line blanked so line numbers stay, to find the exact line, column and field.
pub(super) fn phase_error(text: &str, line: usize) -> Option<(usize, usize, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let start = (0..line.min(lines.len())).rev().find(|&i| lines[i].trim().starts_with('['))?;
    if lines[start].trim() != "[[phase]]" {
        return None;
    }
    let end = (start + 1..lines.len()).find(|&i| lines[i].trim().starts_with('[')).unwrap_or(lines.len());
    let mut kind = None;
    let mut body = String::new();
    for (i, l) in lines.iter().enumerate() {
        let in_phase = i > start && i < end;
        let is_kind = in_phase && l.split('=').next().is_some_and(|k| k.trim() == "kind");
        if is_kind {
            kind = l.split_once('=').map(|(_, v)| v.trim().trim_matches('"').to_string());
        }
        body.push_str(if in_phase && !is_kind { l } else { "" });
        body.push('\n');
    }
    let err = match kind.as_deref()? {
        "batch" => toml::from_str::<Batch>(&body).err(),
        "pressure" => toml::from_str::<Pressure>(&body).err(),
        "sleep" => toml::from_str::<Sleep>(&body).err(),
        _ => None,
    }?;
    let (l, c) = err.span().map(|sp| line_col(&body, sp.start)).unwrap_or((start + 1, 1));
    let key = lines.get(l - 1).and_then(|t| t.split('=').next()).map(str::trim).unwrap_or("");
    let index = lines[..start].iter().filter(|t| t.trim() == "[[phase]]").count();
    let msg = explain(err.message());
    let field = if key.is_empty() || msg.contains('`') { String::new() } else { format!("phase[{index}].{key}: ") };
    Some((l, c, format!("{field}{msg}")))
}

pub(super) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    (line, column)
}

/// The line of `place.key` in its section (1-based), or of the section header, or 0.
pub(super) fn locate(text: &str, place: Place) -> usize {
    let mut in_section = place.section.is_none();
    let mut seen = 0usize;
    let mut header_line = 0;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.starts_with('[') {
            let name = line.trim_matches(|c| c == '[' || c == ']').trim();
            in_section = match place.section {
                Some((sec, idx)) if name == sec => {
                    let hit = seen == idx;
                    seen += 1;
                    if hit {
                        header_line = i + 1;
                    }
                    hit
                }
                _ => false,
            };
            continue;
        }
        if in_section {
            if let Some(k) = line.split('=').next() {
                if k.trim() == place.key {
                    return i + 1;
                }
            }
        }
    }
    header_line
}

/// Rewrites serde's message, adding the closest known name to an unknown one.
pub(super) fn explain(msg: &str) -> String {
    let msg = msg.trim();
    let names: Vec<&str> = msg.split('`').skip(1).step_by(2).collect();
    if (msg.starts_with("unknown field") || msg.starts_with("unknown variant")) && names.len() >= 2 {
        let (unknown, known) = (names[0], &names[1..]);
        let what = if msg.starts_with("unknown field") { "field" } else { "value" };
        if let Some(best) = closest(unknown, known) {
            return format!("unknown {what} `{unknown}`; did you mean `{best}`? (known: {})", known.join(", "));
        }
        return format!("unknown {what} `{unknown}` (known: {})", known.join(", "));
    }
    msg.to_string()
}

/// The known name nearest to `word` by edit distance, if it is near enough to be a typo.
pub fn closest<'a>(word: &str, known: &[&'a str]) -> Option<&'a str> {
    known
        .iter()
        .map(|k| (levenshtein(word, k), *k))
        .filter(|(d, k)| *d <= (k.len().max(word.len()) / 3).max(2))
        .min()
        .map(|(_, k)| k)
}

fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for j in 0..b.len() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != b[j])).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// The line of `key` in `[section]` (1-based; the section's header when the key is not written;
/// 0 without the section): for errors about sections other crates read (`[sim]`).
pub fn locate_key(text: &str, section: &'static str, key: &'static str) -> usize {
    locate(text, Place { section: Some((section, 0)), key })
}
