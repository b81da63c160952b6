//! Lines of a text input read with a bound on each: a file that is one endless line (a device, a
//! binary file given by mistake) ends in an error, never in memory without end.

use std::io::{BufRead, Read};

/// One line may hold at most this many bytes: thousands of metrics with their names fit in a
/// few hundred KiB; a line past it is not a samples file's.
pub const MAX_LINE_BYTES: usize = 8 << 20;

/// Lines of at most [`MAX_LINE_BYTES`] each, without their line ending; a longer one, or one that
/// is not UTF-8, is an error (as text, for the caller to place).
pub struct BoundedLines<R> {
    inner: R,
    done: bool,
}

impl<R: BufRead> BoundedLines<R> {
    pub fn new(inner: R) -> Self {
        BoundedLines { inner, done: false }
    }
}

impl<R: BufRead> Iterator for BoundedLines<R> {
    type Item = Result<String, String>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let mut buf = Vec::new();
        let read = (&mut self.inner).take(MAX_LINE_BYTES as u64 + 1).read_until(b'\n', &mut buf);
        match read {
            Err(e) => {
                self.done = true;
                Some(Err(e.to_string()))
            }
            Ok(0) => None,
            Ok(_) if buf.len() > MAX_LINE_BYTES => {
                self.done = true;
                Some(Err(format!("a line longer than {} MiB: not a samples file", MAX_LINE_BYTES >> 20)))
            }
            Ok(_) => {
                if buf.last() == Some(&b'\n') {
                    buf.pop();
                    if buf.last() == Some(&b'\r') {
                        buf.pop();
                    }
                }
                Some(String::from_utf8(buf).map_err(|_| {
                    self.done = true;
                    "not UTF-8 text".to_string()
                }))
            }
        }
    }
}
