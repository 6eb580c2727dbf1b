//! Raw bindings to the C++ shim in `csrc/` (see `csrc/probe.h` for the contract).

use std::ffi::{c_char, c_int, c_void};

pub const MAX_CONTEXTS: usize = 64;
pub const MAX_FRAMES: usize = 128;
pub const ERR_LEN: usize = 512;

#[repr(C)]
#[derive(Default, Clone, Copy)]
pub struct CpuStatsRaw {
    pub live_bytes: i64,
    pub peak_bytes: i64,
    pub live_blocks: i64,
    pub alloc_count: u64,
    pub free_count: u64,
    pub alloc_bytes_total: u64,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
pub struct EventRaw {
    pub time_us: i64,
    pub addr: u64,
    pub size: u64,
    pub action: i32,
    pub context: i32,
    pub stack: i32,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
pub struct BlockRaw {
    pub addr: u64,
    pub size: u64,
    pub time_us: i64,
    pub context: i32,
    pub stack: i32,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
pub struct CudaStatsRaw {
    pub allocated_current: i64,
    pub allocated_peak: i64,
    pub reserved_current: i64,
    pub reserved_peak: i64,
    pub active_current: i64,
    pub active_peak: i64,
    pub inactive_split_current: i64,
    pub inactive_split_peak: i64,
    pub num_alloc_retries: i64,
    pub num_ooms: i64,
}

extern "C" {
    pub fn ll_cpu_install(err: *mut c_char, errlen: usize) -> c_int;
    pub fn ll_cpu_installed() -> c_int;
    pub fn ll_cpu_stats(out: *mut CpuStatsRaw);
    pub fn ll_cpu_reset_peak();
    pub fn ll_cpu_set_limit(bytes: i64);
    pub fn ll_context_set(id: i32);
    pub fn ll_context_get() -> i32;
    pub fn ll_context_set_default(id: i32);
    pub fn ll_context_get_default() -> i32;
    pub fn ll_cpu_live_by_context(out: *mut i64, n: usize);
    pub fn ll_history_enable(max_entries: usize);
    pub fn ll_history_len() -> usize;
    pub fn ll_history_copy(out: *mut EventRaw, cap: usize) -> usize;
    pub fn ll_live_blocks_copy(out: *mut BlockRaw, cap: usize) -> usize;
    pub fn ll_stacks_enable(depth: c_int);
    pub fn ll_stack_frames(id: i32, out: *mut u64, cap: usize) -> usize;

    pub fn ll_inference_mode_enter(enabled: c_int) -> *mut c_void;
    pub fn ll_inference_mode_exit(guard: *mut c_void);
    pub fn ll_inference_mode_is_enabled() -> c_int;
    pub fn ll_grad_mode_is_enabled() -> c_int;

    pub fn ll_cuda_compiled() -> c_int;
    pub fn ll_cuda_device_count() -> c_int;
    pub fn ll_cuda_stats(
        device: c_int,
        out: *mut CudaStatsRaw,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ll_cuda_empty_cache(err: *mut c_char, errlen: usize) -> c_int;
    pub fn ll_cuda_reset_peak(device: c_int, err: *mut c_char, errlen: usize) -> c_int;
    pub fn ll_cuda_record_history(
        enabled: c_int,
        max_entries: usize,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ll_cuda_snapshot(
        buf: *mut *mut c_char,
        len: *mut usize,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn ll_cuda_synchronize(device: c_int, err: *mut c_char, errlen: usize) -> c_int;
    pub fn ll_free(p: *mut c_void);
}

/// Calls a shim function that reports failure through an error buffer, and returns the
/// status code with the message.
pub fn with_err(f: impl FnOnce(*mut c_char, usize) -> c_int) -> (c_int, String) {
    let mut buf = [0 as c_char; ERR_LEN];
    let rc = f(buf.as_mut_ptr(), ERR_LEN);
    // SAFETY: the shim always NUL-terminates within ERR_LEN, and the buffer starts zeroed.
    let msg = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    (rc, msg)
}
