//! The CUDA caching allocator: allocated vs reserved, `empty_cache`, history and snapshots.
//!
//! Compiled whenever libtorch ships CUDA (the PyPI wheel does). On a machine without a GPU every
//! call returns [`Error::CudaUnavailable`]; none of them crashes.

use crate::{ffi, Error, Result};

pub use leaklab_vocab::CudaStats;

fn check((rc, msg): (i32, String)) -> Result<()> {
    match rc {
        0 => Ok(()),
        1 => Err(Error::CudaUnavailable(
            msg.trim_start_matches("CUDA not available: ").to_string(),
        )),
        _ => Err(Error::Cuda(msg)),
    }
}

/// Whether the CUDA half of the shim was compiled (false only without CUDA headers).
pub fn compiled() -> bool {
    // SAFETY: returns a constant.
    unsafe { ffi::ll_cuda_compiled() != 0 }
}

/// Visible CUDA devices; 0 on a machine without a GPU or driver.
pub fn device_count() -> usize {
    // SAFETY: c10::cuda::device_count() is noexcept and returns 0 without a driver.
    unsafe { ffi::ll_cuda_device_count().max(0) as usize }
}

pub fn is_available() -> bool {
    device_count() > 0
}

pub fn stats(device: usize) -> Result<CudaStats> {
    let mut raw = ffi::CudaStatsRaw::default();
    // SAFETY: `raw` is a valid out-pointer; the shim guards the call with device_count().
    check(ffi::with_err(|e, n| unsafe {
        ffi::ll_cuda_stats(device as i32, &mut raw, e, n)
    }))?;
    Ok(CudaStats {
        allocated_bytes: raw.allocated_current,
        allocated_peak_bytes: raw.allocated_peak,
        reserved_bytes: raw.reserved_current,
        reserved_peak_bytes: raw.reserved_peak,
        active_bytes: raw.active_current,
        active_peak_bytes: raw.active_peak,
        inactive_split_bytes: raw.inactive_split_current,
        inactive_split_peak_bytes: raw.inactive_split_peak,
        num_alloc_retries: raw.num_alloc_retries,
        num_ooms: raw.num_ooms,
    })
}

/// Returns the cached, unused blocks to the driver (`torch.cuda.empty_cache()`).
pub fn empty_cache() -> Result<()> {
    // SAFETY: guarded in the shim.
    check(ffi::with_err(|e, n| unsafe {
        ffi::ll_cuda_empty_cache(e, n)
    }))
}

pub fn reset_peak(device: usize) -> Result<()> {
    // SAFETY: guarded in the shim.
    check(ffi::with_err(|e, n| unsafe {
        ffi::ll_cuda_reset_peak(device as i32, e, n)
    }))
}

pub fn synchronize(device: usize) -> Result<()> {
    // SAFETY: guarded in the shim.
    check(ffi::with_err(|e, n| unsafe {
        ffi::ll_cuda_synchronize(device as i32, e, n)
    }))
}

/// `torch.cuda.memory._record_memory_history(enabled, max_entries=...)`.
pub fn record_history(enabled: bool, max_entries: usize) -> Result<()> {
    // SAFETY: guarded in the shim.
    check(ffi::with_err(|e, n| unsafe {
        ffi::ll_cuda_record_history(enabled as i32, max_entries, e, n)
    }))
}

/// `torch.cuda.memory._snapshot()` pickled: the file pytorch.org/memory_viz opens.
pub fn snapshot_pickle() -> Result<Vec<u8>> {
    let mut buf: *mut std::ffi::c_char = std::ptr::null_mut();
    let mut len = 0usize;
    // SAFETY: on success the shim mallocs `len` bytes at `buf`; they are copied, then freed.
    check(ffi::with_err(|e, n| unsafe {
        ffi::ll_cuda_snapshot(&mut buf, &mut len, e, n)
    }))?;
    let bytes = unsafe { std::slice::from_raw_parts(buf as *const u8, len) }.to_vec();
    unsafe { ffi::ll_free(buf.cast()) };
    Ok(bytes)
}
