//! GPU memory of the target's processes, through NVML (the NVIDIA driver's management library,
//! loaded at run time). Where there is no GPU or no driver, the probe says so once and records
//! nothing: a run without it is judged on everything else, and says what it could not see.

use std::collections::BTreeMap;

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::Nvml;
use plateau_reports::{Kind, MetricSpec};

use super::mapping::PREFIX;

/// The metric: bytes of GPU memory the tree's processes hold, over every device.
pub const METRIC: &str = "gpu.memory";

/// The step GPU memory moves in: the CUDA caching allocators of PyTorch and of the driver reserve
/// in blocks of 2 MiB, so smaller moves are not growth.
const QUANTUM: f64 = 2.0 * 1024.0 * 1024.0;

pub struct GpuProbe {
    nvml: Nvml,
}

impl GpuProbe {
    /// The probe, or why GPU memory per process is not available here.
    pub fn open() -> Result<GpuProbe, String> {
        let nvml = Nvml::init().map_err(|e| format!("NVML: {e}"))?;
        match nvml.device_count() {
            Ok(0) => Err("no GPU".into()),
            Ok(_) => Ok(GpuProbe { nvml }),
            Err(e) => Err(format!("NVML: {e}")),
        }
    }

    pub fn specs() -> BTreeMap<String, MetricSpec> {
        GpuProbe::specs_as(PREFIX)
    }

    /// The spec under `prefix` (`decode.target.` for one role of a deployment).
    pub fn specs_as(prefix: &str) -> BTreeMap<String, MetricSpec> {
        let spec = MetricSpec { quantum: Some(QUANTUM), ..MetricSpec::new(Kind::Gauge, "bytes") };
        BTreeMap::from([(format!("{prefix}{METRIC}"), spec)])
    }

    /// The GPU memory `pids` hold, summed over devices, into `values`.
    pub fn sample(&self, pids: &[i32], values: &mut BTreeMap<String, f64>) {
        self.sample_as(PREFIX, pids, values)
    }

    /// The same under `prefix`.
    pub fn sample_as(&self, prefix: &str, pids: &[i32], values: &mut BTreeMap<String, f64>) {
        let mut bytes = 0.0;
        let count = self.nvml.device_count().unwrap_or(0);
        for i in 0..count {
            let Ok(dev) = self.nvml.device_by_index(i) else { continue };
            for p in dev.running_compute_processes().unwrap_or_default() {
                if let (true, UsedGpuMemory::Used(b)) = (pids.contains(&(p.pid as i32)), p.used_gpu_memory) {
                    bytes += b as f64;
                }
            }
        }
        values.insert(format!("{prefix}{METRIC}"), bytes);
    }
}
