//! Return addresses of a heap profile to functions and source lines, from this binary's own
//! debug information (line tables: release builds keep them, `debug = "line-tables-only"`).
//!
//! A profile's addresses are where this process ran; the binary is position-independent, so an
//! address minus the start of the binary's first mapping (its load bias, from the profile's copy
//! of /proc/<pid>/maps) is an address in the file. Each address gives the frames inlined at it
//! (innermost first) and the function they are inlined into; line tables name inlined functions
//! briefly, so the outer function's name comes from the symbol table, demangled.

use std::borrow::Cow;
use std::path::Path;

/// One frame of a stack: a function and, where known, its file and line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub function: String,
    /// Relative to the workspace for the project's own files (`engine/src/output.rs`); as the
    /// debug information says for the rest (the standard library, dependencies).
    pub file: Option<String>,
    pub line: Option<u32>,
    /// Code of the program being profiled, as its symbolizer tells it from the runtime, the
    /// standard library and dependencies: where a site is looked for first.
    pub own: bool,
}

impl Frame {
    /// A frame of plateau's own Rust code: `file` is relative to the workspace (not the standard
    /// library, a dependency, or C built into target/).
    pub fn plateau_code(function: String, file: Option<String>, line: Option<u32>) -> Frame {
        let own = file.as_deref().is_some_and(|f| {
            !f.starts_with('/') && !f.starts_with("library/") && !f.starts_with("target/") && f.ends_with(".rs")
        });
        Frame { function, file, line, own }
    }

    /// A frame of the profiled program's own code (see `own`).
    pub fn is_project(&self) -> bool {
        self.own
    }

    /// A frame of the allocator or of allocation plumbing, never the site of a leak.
    pub fn is_allocator(&self) -> bool {
        let f = self.function.as_str();
        ["_rjem_", "je_", "malloc", "mallocx", "rallocx", "calloc", "realloc", "__rust_", "__rustc::", "prof_"]
            .iter()
            .any(|p| f.starts_with(p))
            || f.contains("tikv_jemallocator")
    }
}

pub struct Symbolizer {
    loader: addr2line::Loader,
    bias: u64,
    root: String,
}

impl Symbolizer {
    /// A symbolizer for `exe` as it was mapped in the process whose /proc/<pid>/maps is `maps`.
    pub fn new(exe: &Path, maps: &str) -> Result<Symbolizer, String> {
        let canonical = std::fs::canonicalize(exe).map_err(|e| format!("{}: {e}", exe.display()))?;
        let path = canonical.to_string_lossy();
        let bias = maps
            .lines()
            .filter(|l| l.trim_end().ends_with(path.as_ref()))
            .find_map(|l| {
                let mut f = l.split_whitespace();
                let range = f.next()?;
                let offset = u64::from_str_radix(f.nth(1)?, 16).ok()?;
                (offset == 0).then(|| u64::from_str_radix(range.split('-').next()?, 16).ok()).flatten()
            })
            .ok_or_else(|| format!("the profile's mappings do not show {path} (a profile of another binary?)"))?;
        let loader = addr2line::Loader::new(&canonical).map_err(|e| format!("{}: {e}", canonical.display()))?;
        // The workspace's root, two levels above this crate (soak/profile): the project's own
        // files are named from there (`engine/src/output.rs`).
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .ancestors()
            .nth(2)
            .map(|p| format!("{}/", p.display()))
            .unwrap_or_default();
        Ok(Symbolizer { loader, bias, root })
    }

    /// The frames at return address `addr`, innermost first (inlined frames, then their function).
    pub fn frames(&self, addr: u64) -> Vec<Frame> {
        // A return address points after the call: one byte back is inside it.
        let probe = addr.wrapping_sub(self.bias).wrapping_sub(1);
        let mut out = Vec::new();
        if let Ok(mut it) = self.loader.find_frames(probe) {
            while let Ok(Some(f)) = it.next() {
                let function = f
                    .function
                    .as_ref()
                    .and_then(|n| n.demangle().ok().map(Cow::into_owned))
                    .unwrap_or_else(|| "?".to_string());
                let (file, line) = f.location.map_or((None, None), |l| (l.file.map(|p| self.relative(p)), l.line));
                out.push(Frame::plateau_code(function, file, line));
            }
        }
        // The outermost frame's name from the symbol table: qualified, where the line tables
        // have a bare name.
        if let (Some(last), Some(sym)) = (out.last_mut(), self.loader.find_symbol(probe)) {
            last.function = addr2line::demangle_auto(Cow::Borrowed(sym), None).into_owned();
        }
        if out.is_empty() {
            out.push(Frame { function: format!("{addr:#x}"), file: None, line: None, own: false });
        }
        out
    }

    fn relative(&self, path: &str) -> String {
        path.strip_prefix(&self.root).unwrap_or(path).to_string()
    }
}

/// Strips a demangled name's hash and generic arguments for display: `a::b::c<T>::d::h1234` ->
/// `a::b::c::d`.
pub fn short_name(name: &str) -> String {
    // `<Type<T> as Trait<U>>::method` -> `<Type as Trait>::method`: the trait stays, so a trait
    // method is not mistaken for the type's inherent method of the same name; `<Type<T>>::f` ->
    // `Type::f`.
    if let Some(rest) = name.strip_prefix('<') {
        let mut depth = 1usize;
        let close = rest.char_indices().find_map(|(i, c)| {
            match c {
                '<' => depth += 1,
                '>' => depth -= 1,
                _ => {}
            }
            (depth == 0).then_some(i)
        });
        if let Some(close) = close {
            let inner = without_generics(&rest[..close]);
            let head = if inner.contains(" as ") { format!("<{inner}>") } else { inner };
            return without_hash(head + &without_generics(&rest[close + 1..]));
        }
    }
    without_hash(without_generics(name))
}

/// `a::B<T>::c` -> `a::B::c`.
fn without_generics(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut depth = 0usize;
    for ch in name.chars() {
        match ch {
            '<' => depth += 1,
            '>' => depth = depth.saturating_sub(1),
            _ if depth == 0 => out.push(ch),
            _ => {}
        }
    }
    out
}

/// `a::b::h0123456789abcdef` (a legacy mangled name's hash) -> `a::b`.
fn without_hash(name: String) -> String {
    match name.rsplit_once("::h") {
        Some((head, hash)) if hash.len() == 16 && hash.chars().all(|c| c.is_ascii_hexdigit()) => head.to_string(),
        _ => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names() {
        assert_eq!(
            short_name("plateau_engine::output::OutputProcessor::finalize"),
            "plateau_engine::output::OutputProcessor::finalize"
        );
        assert_eq!(short_name("alloc::vec::Vec<T,A>::push::h0123456789abcdef"), "alloc::vec::Vec::push");
        assert_eq!(
            short_name("<alloc::vec::Vec<u32> as core::iter::FromIterator<u32>>::from_iter"),
            "<alloc::vec::Vec as core::iter::FromIterator>::from_iter"
        );
        assert_eq!(
            short_name("<plateau_engine::engine::Engine as plateau_soak::system::System>::step::h0123456789abcdef"),
            "<plateau_engine::engine::Engine as plateau_soak::system::System>::step"
        );
        assert_eq!(
            short_name("<plateau_engine::registry::TrackedMap<K, V>>::insert"),
            "plateau_engine::registry::TrackedMap::insert"
        );
        assert_eq!(short_name("<unclosed"), "");
    }

    #[test]
    fn frames_of_this_binary() {
        // This test's own code, symbolized through its own mappings.
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let exe = std::env::current_exe().unwrap();
        let s = Symbolizer::new(&exe, &maps).unwrap();
        let addr = frames_of_this_binary as *const () as usize as u64 + 1;
        let frames = s.frames(addr);
        let last = frames.last().unwrap();
        assert!(last.function.contains("frames_of_this_binary"), "{frames:?}");
        assert_eq!(last.file.as_deref(), Some("soak/profile/src/symbolize.rs"), "{frames:?}");
    }
}
