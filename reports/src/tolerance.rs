//! The growth a user accepts, in units of the work: bytes per request or per iteration, never per
//! wall hour (a verdict must not depend on how fast the machine is) and never an absolute amount
//! over the run (a run's power must not depend on its length). Part of a verdict's contract, as the
//! warm-up is ([`DEFAULT_WARMUP_ITERATIONS`]): a scenario declares both, the detector judges with
//! them, verdict.json records them, so they live here, below all three.

/// Warm-up when neither the user nor the scenario or samples header says: the engine's caches
/// (prefix cache, encoder cache, allocator size classes) fill within the first few iterations of
/// every shipped scenario, and 20 leaves 180 judged points in a default 200-iteration run.
pub const DEFAULT_WARMUP_ITERATIONS: u64 = 20;

use std::fmt;
use std::str::FromStr;

/// Per what unit of work a tolerance is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Per {
    Request,
    Iteration,
}

/// Growth of a byte gauge at or below this rate passes. Count gauges (descriptors, threads,
/// mappings) are judged exactly and take no tolerance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    pub bytes: f64,
    pub per: Per,
}

impl Default for Tolerance {
    /// One byte per request. Near zero on purpose: a million requests a day then cost under a
    /// mebibyte a day, weeks of uptime before anyone would notice, while the smallest real
    /// per-request leaks (an id left in a map, 16 to 64 bytes) are well above it.
    fn default() -> Self {
        Tolerance { bytes: 1.0, per: Per::Request }
    }
}

impl Tolerance {
    /// Bytes per iteration, given the requests an iteration adds (None: the run counts none).
    pub fn per_iteration(&self, requests_per_iter: Option<f64>) -> Option<f64> {
        match self.per {
            Per::Iteration => Some(self.bytes),
            Per::Request => requests_per_iter.map(|r| self.bytes * r),
        }
    }
}

impl fmt::Display for Tolerance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let per = match self.per {
            Per::Request => "request",
            Per::Iteration => "iteration",
        };
        let b = self.bytes;
        if b >= 1024.0 * 1024.0 && b % (1024.0 * 1024.0) == 0.0 {
            write!(f, "{}MiB/{per}", b / 1024.0 / 1024.0)
        } else if b >= 1024.0 && b % 1024.0 == 0.0 {
            write!(f, "{}KiB/{per}", b / 1024.0)
        } else {
            write!(f, "{b}B/{per}")
        }
    }
}

impl FromStr for Tolerance {
    type Err = String;

    /// `64B/request`, `1KiB/iteration`, `0.5B/request`, `2MiB/iteration`; `0` for none.
    fn from_str(s: &str) -> Result<Tolerance, String> {
        let t = s.trim();
        if t == "0" {
            return Ok(Tolerance { bytes: 0.0, per: Per::Iteration });
        }
        let (amount, per) = t.split_once('/').ok_or_else(|| {
            format!("`{s}`: write an amount per request or per iteration, such as 64B/request or 1KiB/iteration")
        })?;
        let per = match per.trim() {
            "request" | "req" => Per::Request,
            "iteration" | "iter" => Per::Iteration,
            "hour" | "h" | "s" | "second" | "min" | "day" => {
                return Err(format!(
                    "`{s}`: a tolerance per unit of time would make the verdict depend on the machine's speed; give it per request or per iteration"
                ))
            }
            other => return Err(format!("`{s}`: `{other}` is not `request` or `iteration`")),
        };
        let amount = amount.trim();
        if amount.starts_with('-') || amount.starts_with('+') {
            return Err(format!("`{s}`: a tolerance is an amount of bytes, zero or more, written without a sign"));
        }
        let split = amount.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(amount.len());
        let (num, unit) = amount.split_at(split);
        let num: f64 = num.parse().map_err(|_| format!("`{s}`: `{num}` is not a number"))?;
        let scale = match unit.trim() {
            "B" | "b" | "" => 1.0,
            "KiB" | "K" | "k" | "KB" | "kB" => 1024.0,
            "MiB" | "M" | "MB" => 1024.0 * 1024.0,
            "GiB" | "G" | "GB" => 1024.0 * 1024.0 * 1024.0,
            other => return Err(format!("`{s}`: `{other}` is not a unit of bytes (B, KiB, MiB, GiB)")),
        };
        let bytes = num * scale;
        if !(bytes.is_finite() && bytes >= 0.0) {
            return Err(format!("`{s}`: must be a finite amount of bytes, zero or more"));
        }
        Ok(Tolerance { bytes, per })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_per_request_and_per_iteration() {
        assert_eq!("64B/request".parse(), Ok(Tolerance { bytes: 64.0, per: Per::Request }));
        assert_eq!("1KiB/iteration".parse(), Ok(Tolerance { bytes: 1024.0, per: Per::Iteration }));
        assert_eq!("0".parse(), Ok(Tolerance { bytes: 0.0, per: Per::Iteration }));
        let e = "-1B/request".parse::<Tolerance>().unwrap_err();
        assert!(e.contains("zero or more, written without a sign"), "{e}");
        assert_eq!(Tolerance::default().to_string(), "1B/request");
        assert_eq!("1KiB/iteration".parse::<Tolerance>().unwrap().to_string(), "1KiB/iteration");
    }

    #[test]
    fn refuses_time_and_nonsense() {
        assert!("1MiB/hour".parse::<Tolerance>().unwrap_err().contains("machine's speed"));
        assert!("64".parse::<Tolerance>().unwrap_err().contains("per request or per iteration"));
        assert!("64XB/request".parse::<Tolerance>().unwrap_err().contains("`XB`"));
        assert!("-1B/request".parse::<Tolerance>().is_err());
    }

    #[test]
    fn converts_with_the_request_rate() {
        let t: Tolerance = "2B/request".parse().unwrap();
        assert_eq!(t.per_iteration(Some(20.0)), Some(40.0));
        assert_eq!(t.per_iteration(None), None);
    }
}
