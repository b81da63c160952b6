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
