//! Files the harness writes and reads beside its runs: outputs written whole or not at all, and
//! the project's own sources, read to name the function a line belongs to.

use std::path::Path;

/// Writes `bytes` to `path` whole or not at all: into a temporary file beside it, then renamed.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!(
        "{}.tmp{}",
        path.extension().and_then(|e| e.to_str()).unwrap_or(""),
        std::process::id()
    ));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// The file that marks a directory as a plateau run's: a run writes (and clears what an earlier
/// run left) only in a directory that has it, or an empty one.
pub const RUN_MARKER: &str = ".plateau-run";

/// Makes `dir` a run directory, or refuses: a directory that does not exist is created, an empty
/// one or one with [`RUN_MARKER`] is taken; one holding anything else is the user's, and a run
/// would delete and overwrite files there (its report, its replay/), so it is refused, nothing
/// touched. The marker is written in every directory taken.
pub fn claim_run_dir(dir: &Path) -> Result<(), String> {
    let marker = dir.join(RUN_MARKER);
    if dir.exists() && !marker.exists() {
        let mut entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        if entries.next().is_some() {
            return Err(format!(
                "{}: a directory plateau did not make (it holds files and no {RUN_MARKER}): a run writes only into a new or empty directory or one of its own run directories, where it replaces an earlier run's report and replay/; give another --out (a directory an older plateau wrote: `touch {}` makes it a run directory)",
                dir.display(),
                marker.display()
            ));
        }
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !marker.exists() {
        std::fs::write(&marker, b"a plateau run directory: `plateau run --out` writes here\n")
            .map_err(|e| format!("{}: {e}", marker.display()))?;
    }
    Ok(())
}

/// The bytes of a file the user or a run named as input, at most `max_bytes`: a FIFO would block
/// and a device such as /dev/zero never ends, so anything but a regular file is refused before
/// it is opened, and so is one past the limit. The error names the path.
pub fn read_input(path: &Path, max_bytes: u64) -> Result<Vec<u8>, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("{}: not a regular file (a directory, FIFO or device)", path.display()));
    }
    if meta.len() > max_bytes {
        return Err(format!("{}: {} bytes, past the {max_bytes} this input may hold", path.display(), meta.len()));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    let f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    std::io::Read::read_to_end(&mut std::io::Read::take(f, max_bytes + 1), &mut bytes)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if bytes.len() as u64 > max_bytes {
        return Err(format!(
            "{}: grew past the {max_bytes} bytes this input may hold while it was read",
            path.display()
        ));
    }
    Ok(bytes)
}

/// [`read_input`] of a text file: its bytes as UTF-8, or an error naming the path.
pub fn read_input_text(path: &Path, max_bytes: u64) -> Result<String, String> {
    String::from_utf8(read_input(path, max_bytes)?).map_err(|e| format!("{}: not UTF-8 ({e})", path.display()))
}

/// JSON the user or a run gave, read as an input ([`read_input`]): errors name the file and the
/// line.
pub fn read_input_json<T: serde::de::DeserializeOwned>(path: &Path, max_bytes: u64) -> Result<T, String> {
    let bytes = read_input(path, max_bytes)?;
    serde_json::from_slice(&bytes).map_err(|e| format!("{}: line {}: {e}", path.display(), e.line()))
}

/// The JSON a run left beside its samples (residues, growth sites, mappings, its verdict), if it
/// is there and reads: at most [`RUN_FILE_BYTES`]. What cannot be read is left out, as absent.
pub fn read_run_json<T: serde::de::DeserializeOwned>(path: &Path) -> Option<T> {
    read_input(path, RUN_FILE_BYTES).ok().and_then(|b| serde_json::from_slice(&b).ok())
}

/// A run's own JSON files stay far under this: a mapping snapshot of a process with thousands
/// of mappings is a few MiB.
pub const RUN_FILE_BYTES: u64 = 256 << 20;

/// The function a source line is in, read from the source when it is at hand (the tree plateau
/// was built from): the nearest `fn NAME` at or above the line.
pub fn source_function(file: &str, line: u32) -> Option<String> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent()?;
    let text = std::fs::read_to_string(root.join(file)).ok()?;
    let lines: Vec<&str> = text.lines().take(line as usize).collect();
    lines.iter().rev().find_map(|l| {
        let after =
            l.split("fn ").nth(1).filter(|_| l.trim_start().starts_with("pub") || l.trim_start().starts_with("fn"))?;
        let name: String = after.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        (!name.is_empty()).then_some(name)
    })
}
