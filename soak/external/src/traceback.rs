//! The exception a server's process died of, from the server's output: the first Python traceback
//! of the process that is gone, quoted when a run fails because part of the server died. The API
//! server's last lines say only that its engine is dead ("EngineDeadError"); the engine's own
//! traceback, printed earlier by the engine process, says why.
//!
//! A traceback is `Traceback (most recent call last):`, its indented frames, and the exception's
//! line. Servers of several processes prefix each line with the process that wrote it (vLLM V1:
//! `(EngineCore_DP0 pid=4123) `); the prefix before `Traceback` is the block's, and the block is
//! the following lines with that same prefix. Of all blocks, the first that names a process that
//! is gone (`pid=N` in its prefix, or its lines) is quoted, else the first of all.

/// Lines of a traceback quoted at most: a deep stack keeps its last frames and the exception.
pub const MAX_QUOTED_LINES: usize = 24;

/// Bytes of the server's output read at most when looking for a traceback.
pub const MAX_LOG_BYTES: usize = 16 << 20;

const HEAD: &str = "Traceback (most recent call last):";

/// A traceback found in a server's output: the lines it holds (prefix removed) and the prefix
/// that marked them.
#[derive(Debug, Clone, PartialEq)]
pub struct Traceback {
    pub prefix: String,
    pub lines: Vec<String>,
}

impl Traceback {
    /// The exception's own line (the block's last).
    pub fn exception(&self) -> &str {
        self.lines.last().map_or("", String::as_str)
    }

    /// The block as a message quotes it: its last [`MAX_QUOTED_LINES`] lines, each marked.
    pub fn quoted(&self) -> String {
        let skip = self.lines.len().saturating_sub(MAX_QUOTED_LINES);
        let mut out: Vec<String> = Vec::new();
        if skip > 0 {
            out.push(format!("  | ... ({skip} lines of the traceback left out)"));
        }
        out.extend(self.lines[skip..].iter().map(|l| format!("  | {}{l}", self.prefix)));
        out.join("\n")
    }
}

/// Every traceback in `text`, in order. A block ends at its exception's line (the first line of
/// its prefix that is not indented), at a line of another prefix after the exception, or at the
/// end of the text; a block whose exception never came is kept as far as it went.
pub fn tracebacks(text: &str) -> Vec<Traceback> {
    let mut out = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let Some(at) = lines[i].find(HEAD) else {
            i += 1;
            continue;
        };
        let prefix = lines[i][..at].to_string();
        let mut block = vec![HEAD.to_string()];
        let mut j = i + 1;
        while j < lines.len() {
            let Some(rest) = lines[j].strip_prefix(prefix.as_str()) else {
                // Another process's line inside the block (interleaved output): skipped.
                j += 1;
                continue;
            };
            block.push(rest.to_string());
            j += 1;
            if !rest.starts_with(char::is_whitespace) && !rest.is_empty() {
                break;
            }
        }
        out.push(Traceback { prefix, lines: block });
        i = j;
    }
    out
}

/// The traceback of one of `gone` (pids of the server's processes that died), else the first.
pub fn of_the_dead(text: &str, gone: &[i32]) -> Option<Traceback> {
    let all = tracebacks(text);
    let names = |t: &Traceback, pid: i32| {
        let needle = format!("pid={pid}");
        t.prefix.contains(&needle) || t.lines.iter().any(|l| l.contains(&needle))
    };
    all.iter().find(|t| gone.iter().any(|&p| names(t, p))).or(all.first()).cloned()
}

/// The traceback a failed run quotes from the server's output file `log` (its first
/// [`MAX_LOG_BYTES`]), if it holds one.
pub fn from_log(log: &std::path::Path, gone: &[i32]) -> Option<Traceback> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(log).ok()?.take(MAX_LOG_BYTES as u64).read_to_end(&mut bytes).ok()?;
    of_the_dead(&String::from_utf8_lossy(&bytes), gone)
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1: &str = "INFO 12-07 api_server.py:1 starting\n\
(EngineCore_DP0 pid=4123) ERROR core.py:700 EngineCore encountered a fatal error.\n\
(EngineCore_DP0 pid=4123) Traceback (most recent call last):\n\
(EngineCore_DP0 pid=4123)   File \"/v/vllm/v1/engine/core.py\", line 691, in run_engine_core\n\
(APIServer pid=4100) INFO:     127.0.0.1:5 - \"POST /v1/completions HTTP/1.1\" 200 OK\n\
(EngineCore_DP0 pid=4123)     engine_core.run_busy_loop()\n\
(EngineCore_DP0 pid=4123) RuntimeError: CPU Generator does not use offset\n\
(APIServer pid=4100) Traceback (most recent call last):\n\
(APIServer pid=4100)   File \"/v/vllm/entrypoints/openai/serving_completion.py\", line 9, in gen\n\
(APIServer pid=4100) vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.\n";

    #[test]
    fn the_dead_processs_own_traceback_is_quoted_not_the_api_servers() {
        let all = tracebacks(V1);
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].exception(), "RuntimeError: CPU Generator does not use offset");
        assert_eq!(all[0].lines.len(), 4, "{:?}", all[0].lines);
        assert_eq!(all[1].exception(), "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.");
        let t = of_the_dead(V1, &[4123]).unwrap();
        assert!(t.quoted().contains("CPU Generator"), "{}", t.quoted());
        assert!(!t.quoted().contains("POST"), "another process's line is not part of the block");
        // None of the dead named: the first traceback of all.
        assert_eq!(of_the_dead(V1, &[99]).unwrap().exception(), all[0].exception());
        // The API server's own, when it is the one that died.
        assert_eq!(of_the_dead(V1, &[4100]).unwrap().prefix, "(APIServer pid=4100) ");
    }

    #[test]
    fn an_unprefixed_traceback_and_one_cut_short_are_found_and_long_ones_keep_their_end() {
        let text = "x\nTraceback (most recent call last):\n  File \"a.py\", line 1, in <module>\n    f()\nValueError: bad\nnext\n";
        let t = &tracebacks(text)[0];
        assert_eq!((t.prefix.as_str(), t.exception()), ("", "ValueError: bad"));
        let cut = tracebacks("Traceback (most recent call last):\n  File \"a.py\", line 1\n");
        assert_eq!(cut[0].lines.len(), 2);
        let deep: String = std::iter::once("Traceback (most recent call last):\n".to_string())
            .chain((0..100).map(|k| format!("  File \"a.py\", line {k}, in f\n")))
            .chain(std::iter::once("RecursionError: deep\n".to_string()))
            .collect();
        let q = tracebacks(&deep)[0].quoted();
        assert!(q.starts_with("  | ... (78 lines"), "{q}");
        assert!(q.ends_with("  | RecursionError: deep"), "{q}");
        assert!(tracebacks("no traceback here\n").is_empty());
    }
}
