//! `--known FILE` of `run` and `analyze`: a known-growth file read strictly before anything
//! runs (a bad file is exit 2 naming the file, the entry and the field), and recorded in the run
//! directory as known.json, so that every reader judges the run with the entries it ran with.

use std::path::{Path, PathBuf};

use plateau_soak::sites::known::{self, Date, Known, Record, MAX_FILE_BYTES, RECORD_FILE};

use super::USAGE;

/// Today, UTC: the day a run begins, on which its entries' expiry is judged.
pub fn today() -> Date {
    let (y, m, d, ..) = plateau_soak::environment::utc_now_parts();
    Date { year: y as u16, month: m as u8, day: d as u8 }
}

/// The file at `path`, judged on `on`, and its text; errors said, exit 2.
pub fn load(path: &Path, on: Date) -> Result<(Known, String), u8> {
    let name = path.display().to_string();
    let text = plateau_soak::fsutil::read_input_text(path, MAX_FILE_BYTES).map_err(|e| {
        plateau_shell::errln!("plateau: --known {e}");
        USAGE
    })?;
    match known::parse(&text, &name, on) {
        Ok(k) => Ok((k, text)),
        Err(e) => {
            for line in e.lines() {
                plateau_shell::errln!("plateau: --known {line}");
            }
            Err(USAGE)
        }
    }
}

/// `run --known`: the file read, and refused for plateau's own engine (nothing it runs is growth
/// reported upstream, and its injections and plants must fail or pass on their own).
pub fn for_run(path: Option<&PathBuf>, target: bool) -> Result<Option<(Known, String)>, u8> {
    let Some(path) = path else { return Ok(None) };
    let loaded = load(path, today())?;
    if !target {
        plateau_shell::errln!(
            "plateau: --known {}: known growth is a server's (--target, --topology); plateau's own engine has none, and its injections and plants must fail or pass on their own",
            path.display()
        );
        return Err(USAGE);
    }
    // Said first, even with --quiet: a run whose failures known entries may accept says so.
    let k = &loaded.0;
    plateau_shell::errln!(
        "plateau: judged with known growth: {} ({} {}, each accepted only at or under its rate and until its date; as of {})",
        k.file,
        k.entries.len(),
        if k.entries.len() == 1 { "entry" } else { "entries" },
        k.on
    );
    Ok(Some(loaded))
}

/// known.json in the run directory: what every reader judges the run with.
pub fn record(dir: &Path, k: &Known, text: &str) -> Result<(), u8> {
    let r = Record::new(&k.file, k.on, text);
    let json = serde_json::to_string_pretty(&r).map_err(|e| {
        plateau_shell::errln!("plateau: {RECORD_FILE}: {e}");
        super::HARNESS
    })? + "\n";
    let path = dir.join(RECORD_FILE);
    plateau_soak::fsutil::write_atomic(&path, json.as_bytes()).map_err(|e| {
        plateau_shell::errln!("plateau: {}: {e}", path.display());
        super::HARNESS
    })
}
