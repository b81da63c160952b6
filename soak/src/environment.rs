//! Collects environment.json for a run: what `plateau run` was built from and ran on. Read once,
//! before the first iteration, so nothing here perturbs the samples.

use plateau_reports::{Environment, ENVIRONMENT_SCHEMA};
use plateau_scenario::Scenario;
use sha2::{Digest, Sha256};

/// What the run was asked to be, beyond the scenario.
pub struct RunIdentity<'a> {
    /// plateau's version and build commit (from the binary).
    pub version: &'a str,
    pub commit: &'a str,
    pub source: &'a str,
    pub seed: u64,
    pub backend: &'a str,
    pub target: Option<&'a str>,
    /// The arguments of `plateau run` that shaped the run (see `Environment::replay_args`).
    pub replay_args: Vec<String>,
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path).map(|s| s.trim().to_string()).unwrap_or_else(|_| "unknown".into())
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|p| p.1.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

fn memory_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

/// The first GPU's name and memory through NVML, or why there is none.
fn gpu() -> String {
    let nvml = match nvml_wrapper::Nvml::init() {
        Ok(n) => n,
        Err(e) => return format!("not available (NVML: {e})"),
    };
    let Ok(n) = nvml.device_count() else { return "not available (NVML cannot count devices)".into() };
    if n == 0 {
        return "none (NVML sees no device)".into();
    }
    match nvml.device_by_index(0) {
        Ok(d) => {
            let name = d.name().unwrap_or_else(|_| "unknown GPU".into());
            let mem = d
                .memory_info()
                .map(|m| format!(", {:.0} GiB", m.total as f64 / (1u64 << 30) as f64))
                .unwrap_or_default();
            format!("{n} x {name}{mem}")
        }
        Err(e) => format!("not available (NVML: {e})"),
    }
}

/// UTC now as (year, month, day, hour, minute, second).
pub fn utc_now_parts() -> (i64, i64, i64, u64, u64, u64) {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let (y, m, d) = civil_from_days(days);
    (y, m, d, rem / 3600, rem / 60 % 60, rem % 60)
}

/// UTC now as `2026-12-01T01:33:33Z`.
pub fn utc_now() -> String {
    let (y, m, d, hh, mm, ss) = utc_now_parts();
    format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}Z")
}

/// Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
pub fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

pub fn collect(s: &Scenario, id: &RunIdentity) -> Environment {
    let source = if id.source.starts_with("<shipped ") {
        format!("shipped:{}", id.source.trim_start_matches("<shipped ").trim_end_matches('>'))
    } else {
        id.source.to_string()
    };
    Environment {
        schema: ENVIRONMENT_SCHEMA.into(),
        version: id.version.into(),
        commit: id.commit.into(),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        started_utc: utc_now(),
        scenario: s.name.clone(),
        scenario_source: source,
        scenario_sha256: format!("{:x}", Sha256::digest(s.text.as_bytes())),
        seed: id.seed,
        backend: id.backend.into(),
        model: if id.target.is_some() { "the target's (see /v1/models)".into() } else { s.engine.preset.clone() },
        target: id.target.map(String::from),
        dialect: None,
        host: read_trimmed("/proc/sys/kernel/hostname"),
        kernel: read_trimmed("/proc/sys/kernel/osrelease"),
        cpu_model: cpu_model(),
        cpus: std::thread::available_parallelism().map_or(0, |n| n.get() as u64),
        memory_bytes: memory_bytes(),
        gpu: gpu(),
        address_layout: Some(plateau_probes::layout::describe_current()),
        replay_args: id.replay_args.clone(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn civil_dates() {
        assert_eq!(super::civil_from_days(0), (1970, 1, 1));
        assert_eq!(super::civil_from_days(20_788), (2026, 12, 1));
    }
}
