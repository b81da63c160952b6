//! Printing that survives a closed pipe and never drives the terminal.
//!
//! `println!` panics when its write fails, and a reader that stops early (`plateau list | head -1`,
//! `plateau analyze RUN 2>&1 | head -1`) closes the pipe under it: the panic would end the command
//! with exit 101 and lose the verdict's exit code. These macros write the same text and drop a
//! failed write: what nobody reads any more is not an error, and the command goes on to exit with
//! its own code. (Rust ignores SIGPIPE in its programs, so a closed pipe is a failed write here,
//! never a signal.)
//!
//! What plateau prints quotes what it read (a scenario's name, a server's log line, a run
//! directory's files), and any of it may hold a terminal's escapes: every control character but
//! newline and tab is written escaped (`\u{1b}`), so a run directory can never retitle or clear
//! the terminal that reads about it.

use std::io::Write;

/// Writes `args` to `w` with control characters escaped (see the module); a failed write is
/// dropped.
pub fn write_clean(mut w: impl Write, args: std::fmt::Arguments<'_>) {
    let text = match args.as_str() {
        Some(s) => std::borrow::Cow::Borrowed(s),
        None => std::borrow::Cow::Owned(args.to_string()),
    };
    let _ = w.write_all(clean(&text).as_bytes());
}

/// `text` with every control character but newline and tab escaped.
pub fn clean(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match unsafe_char(c) {
            true => out.extend(c.escape_unicode()),
            false => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

fn unsafe_char(c: char) -> bool {
    c.is_control() && c != '\n' && c != '\t'
}

/// `print!` to stdout (see the module).
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::say::write_clean(::std::io::stdout().lock(), ::std::format_args!($($arg)*))
    };
}

/// `println!` to stdout (see the module).
#[macro_export]
macro_rules! outln {
    () => { $crate::out!("\n") };
    ($($arg:tt)*) => { $crate::out!("{}\n", ::std::format_args!($($arg)*)) };
}

/// `eprint!` to stderr (see the module).
#[macro_export]
macro_rules! err {
    ($($arg:tt)*) => {
        $crate::say::write_clean(::std::io::stderr().lock(), ::std::format_args!($($arg)*))
    };
}

/// `eprintln!` to stderr (see the module).
#[macro_export]
macro_rules! errln {
    () => { $crate::err!("\n") };
    ($($arg:tt)*) => { $crate::err!("{}\n", ::std::format_args!($($arg)*)) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_are_written_visible_and_lines_kept() {
        let raw = "x\u{1b}]0;TITLE\u{7}\u{1b}[2J\tend\r\n";
        let mut out = Vec::new();
        write_clean(&mut out, format_args!("{raw}"));
        let text = String::from_utf8(out).unwrap();
        assert!(!text.chars().any(|c| c == '\u{1b}' || c == '\u{7}' || c == '\r'), "{text:?}");
        assert_eq!(text, "x\\u{1b}]0;TITLE\\u{7}\\u{1b}[2J\tend\\u{d}\n");
        assert!(matches!(clean("plain\ttext\n"), std::borrow::Cow::Borrowed(_)));
    }

    #[test]
    fn a_closed_reader_is_no_error() {
        struct Closed;
        impl Write for Closed {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                Err(std::io::ErrorKind::BrokenPipe.into())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        write_clean(Closed, format_args!("lost {}", 1));
    }
}
