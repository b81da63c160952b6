//! The CUDA device as the backend uses it: detection that never panics, and the device allocator
//! every device buffer goes through.
//!
//! Lifecycle of a device buffer: `DeviceAllocator::alloc` checks the request against the driver's
//! free memory (an out-of-memory error names both figures), allocates on the backend's stream and
//! counts the bytes under one category; dropping the `DeviceBuf` frees it and takes the bytes off
//! that category. Weights and the KV pool live until sleep releases them; activations and
//! workspace live for one forward pass; staging buffers for one KV transfer. After `release`,
//! `trim` hands the freed memory back from the stream-ordered allocator's pool to the driver, so
//! the driver's own figure comes down too.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};

use crate::error::{ModelError, Result};

/// What a device buffer is for: the allocator counts live bytes and buffers per category.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Category {
    Weights,
    KvCache,
    Activations,
    Workspace,
    Staging,
}

impl Category {
    pub const ALL: [Category; 5] =
        [Category::Weights, Category::KvCache, Category::Activations, Category::Workspace, Category::Staging];

    pub fn name(self) -> &'static str {
        match self {
            Category::Weights => "weights",
            Category::KvCache => "kv_cache",
            Category::Activations => "activations",
            Category::Workspace => "workspace",
            Category::Staging => "staging",
        }
    }
}

/// What `probe` found.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    pub name: String,
    pub compute_capability: (i32, i32),
    pub total_bytes: u64,
}

/// Whether a usable CUDA device is here, without ever panicking: the libraries are checked before
/// anything calls into them (cudarc panics when a library is missing). The answer is found once
/// per process (it opens a context) and remembered: backend resolution and every backend ask.
pub fn probe() -> std::result::Result<DeviceInfo, String> {
    static FOUND: std::sync::OnceLock<std::result::Result<DeviceInfo, String>> = std::sync::OnceLock::new();
    FOUND.get_or_init(find_device).clone()
}

fn find_device() -> std::result::Result<DeviceInfo, String> {
    // SAFETY: these only try to dlopen the libraries.
    let (driver, nvrtc, cublas) = unsafe {
        (
            cudarc::driver::sys::is_culib_present(),
            cudarc::nvrtc::sys::is_culib_present(),
            cudarc::cublas::sys::is_culib_present(),
        )
    };
    if !driver {
        return Err("no CUDA driver found (libcuda.so.1 cannot be loaded)".into());
    }
    if !nvrtc {
        return Err("CUDA driver found but not NVRTC (libnvrtc.so cannot be loaded)".into());
    }
    if !cublas {
        return Err("CUDA driver found but not cuBLAS (libcublas.so cannot be loaded)".into());
    }
    cudarc::driver::result::init().map_err(|e| format!("the CUDA driver failed to start: {e}"))?;
    let count = CudaContext::device_count().map_err(|e| format!("the CUDA driver cannot count devices: {e}"))?;
    if count < 1 {
        return Err("the CUDA driver reports no device".into());
    }
    let ctx = CudaContext::new(0).map_err(|e| format!("cannot open CUDA device 0: {e}"))?;
    Ok(DeviceInfo {
        name: ctx.name().unwrap_or_else(|_| "unknown".into()),
        compute_capability: ctx.compute_capability().map_err(|e| e.to_string())?,
        total_bytes: ctx.total_mem().map_err(|e| e.to_string())? as u64,
    })
}

#[derive(Debug, Default)]
struct Counts {
    bytes: [AtomicU64; 5],
    buffers: [AtomicU64; 5],
}

/// A device buffer, counted under its category until dropped.
pub struct DeviceBuf {
    slice: CudaSlice<u8>,
    category: Category,
    counts: Arc<Counts>,
}

impl std::fmt::Debug for DeviceBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBuf({} bytes, {})", self.slice.len(), self.category.name())
    }
}

impl DeviceBuf {
    pub fn bytes(&self) -> usize {
        self.slice.len()
    }

    /// The raw device address, for kernel arguments and cuBLAS.
    pub fn ptr(&self) -> u64 {
        let (p, _sync) = self.slice.device_ptr(self.slice.stream());
        p
    }

    /// Copies host values into the start of the buffer.
    pub fn write<T: Copy>(&mut self, data: &[T]) -> Result<()> {
        let bytes = as_bytes(data);
        if bytes.len() > self.slice.len() {
            return Err(ModelError::Backend(format!("{} bytes into a {}-byte buffer", bytes.len(), self.slice.len())));
        }
        let stream = self.slice.stream().clone();
        let mut view = self.slice.slice_mut(..bytes.len());
        stream.memcpy_htod(bytes, &mut view).map_err(driver_err)
    }

    /// Reads `len` values of `T` from the start of the buffer (synchronises the stream).
    pub fn read<T: Copy + Default>(&self, len: usize) -> Result<Vec<T>> {
        let mut out = vec![T::default(); len];
        let n = std::mem::size_of_val(out.as_slice());
        if n > self.slice.len() {
            return Err(ModelError::Backend(format!("{n} bytes out of a {}-byte buffer", self.slice.len())));
        }
        // SAFETY: `out` is `n` bytes of plain values; every bit pattern the device wrote is one the
        // caller's `T` (f32, u16, i32) accepts.
        let dst = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u8>(), n) };
        let stream = self.slice.stream().clone();
        stream.memcpy_dtoh(&self.slice.slice(..n), dst).map_err(driver_err)?;
        stream.synchronize().map_err(driver_err)?;
        Ok(out)
    }

    pub fn zero(&mut self) -> Result<()> {
        let stream = self.slice.stream().clone();
        stream.memset_zeros(&mut self.slice).map_err(driver_err)
    }
}

impl Drop for DeviceBuf {
    fn drop(&mut self) {
        let i = self.category as usize;
        self.counts.bytes[i].fetch_sub(self.slice.len() as u64, Ordering::Relaxed);
        self.counts.buffers[i].fetch_sub(1, Ordering::Relaxed);
    }
}

pub fn as_bytes<T: Copy>(data: &[T]) -> &[u8] {
    // SAFETY: plain values viewed as their bytes, same lifetime.
    unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data)) }
}

pub fn driver_err(e: cudarc::driver::DriverError) -> ModelError {
    ModelError::Backend(format!("CUDA: {e}"))
}

/// Every device buffer of a backend goes through one of these.
pub struct DeviceAllocator {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    counts: Arc<Counts>,
}

impl DeviceAllocator {
    pub fn new(ctx: Arc<CudaContext>, stream: Arc<CudaStream>) -> Self {
        DeviceAllocator { ctx, stream, counts: Arc::new(Counts::default()) }
    }

    /// The driver's (free, total) device memory, in bytes.
    pub fn driver_memory(&self) -> Result<(u64, u64)> {
        let (free, total) = self.ctx.mem_get_info().map_err(driver_err)?;
        Ok((free as u64, total as u64))
    }

    /// `bytes` of uninitialised device memory for `what` (named in an out-of-memory error).
    pub fn alloc(&self, category: Category, bytes: usize, what: &str) -> Result<DeviceBuf> {
        let bytes = bytes.max(1);
        if bytes >= 1 << 26 {
            let (free, _) = self.driver_memory()?;
            if bytes as u64 > free {
                return Err(oom(what, bytes as u64, free));
            }
        }
        // SAFETY: the memory is uninitialised; every user writes before it reads.
        let slice = unsafe { self.stream.alloc::<u8>(bytes) }.map_err(|e| {
            let free = self.driver_memory().map(|f| f.0).unwrap_or(0);
            ModelError::Backend(format!("{} ({e})", oom(what, bytes as u64, free)))
        })?;
        let i = category as usize;
        self.counts.bytes[i].fetch_add(bytes as u64, Ordering::Relaxed);
        self.counts.buffers[i].fetch_add(1, Ordering::Relaxed);
        Ok(DeviceBuf { slice, category, counts: self.counts.clone() })
    }

    /// A buffer holding `data`.
    pub fn upload<T: Copy>(&self, category: Category, data: &[T], what: &str) -> Result<DeviceBuf> {
        let mut b = self.alloc(category, std::mem::size_of_val(data), what)?;
        if !data.is_empty() {
            b.write(data)?;
        }
        Ok(b)
    }

    pub fn live_bytes(&self, c: Category) -> u64 {
        self.counts.bytes[c as usize].load(Ordering::Relaxed)
    }

    pub fn live_buffers(&self, c: Category) -> u64 {
        self.counts.buffers[c as usize].load(Ordering::Relaxed)
    }

    /// Returns memory freed into the stream-ordered pool to the driver.
    pub fn trim(&self) -> Result<()> {
        self.stream.synchronize().map_err(driver_err)?;
        // SAFETY: the pool is the device's default one; trimming only releases unused memory.
        unsafe {
            let mut pool = std::ptr::null_mut();
            let dev = self.ctx.cu_device();
            if cudarc::driver::sys::cuDeviceGetDefaultMemPool(&mut pool, dev)
                == cudarc::driver::sys::CUresult::CUDA_SUCCESS
            {
                cudarc::driver::sys::cuMemPoolTrimTo(pool, 0);
            }
        }
        Ok(())
    }
}

fn oom(what: &str, asked: u64, free: u64) -> ModelError {
    ModelError::Backend(format!(
        "out of device memory for {what}: asked {asked} bytes ({:.2} GiB), {free} bytes ({:.2} GiB) free",
        asked as f64 / (1u64 << 30) as f64,
        free as f64 / (1u64 << 30) as f64
    ))
}
