//! Inference mode (`c10::InferenceMode`) beside tch's no_grad.
//!
//! Inference mode is no_grad and more: tensors made inside are inference tensors, which carry
//! no version counter and can never join an autograd graph, so a forward pass inside it cannot
//! keep a graph alive however its outputs are stored. Like no_grad it is thread-local: enter and
//! leave it on one thread, around synchronous work, never across an `.await`.

use crate::ffi;
use std::marker::PhantomData;

/// RAII guard over `c10::InferenceMode`; restores the previous mode on drop. Not `Send`.
#[must_use = "inference mode ends when the guard drops"]
pub struct InferenceModeGuard {
    raw: *mut std::ffi::c_void,
    _not_send: PhantomData<*const ()>,
}

impl InferenceModeGuard {
    pub fn new() -> InferenceModeGuard {
        InferenceModeGuard::with_enabled(true)
    }

    /// `InferenceMode(false)`: lets a region inside inference mode record graphs again.
    pub fn with_enabled(enabled: bool) -> InferenceModeGuard {
        // SAFETY: the shim allocates a c10::InferenceMode; `Drop` deletes it on this thread.
        let raw = unsafe { ffi::ll_inference_mode_enter(enabled as i32) };
        // Constructing the guard only fails when C++ cannot allocate a few bytes; the process
        // is then out of memory, and going on outside inference mode would hide it.
        assert!(
            !raw.is_null(),
            "c10::InferenceMode could not be entered (out of memory)"
        );
        InferenceModeGuard {
            raw,
            _not_send: PhantomData,
        }
    }
}

impl Default for InferenceModeGuard {
    fn default() -> Self {
        InferenceModeGuard::new()
    }
}

impl Drop for InferenceModeGuard {
    fn drop(&mut self) {
        // SAFETY: `raw` came from ll_inference_mode_enter and is deleted exactly once.
        unsafe { ffi::ll_inference_mode_exit(self.raw) }
    }
}

/// Runs `f` in inference mode.
pub fn inference_mode<T>(f: impl FnOnce() -> T) -> T {
    let _guard = InferenceModeGuard::new();
    f()
}

pub fn is_inference_mode_enabled() -> bool {
    // SAFETY: reads a thread-local flag.
    unsafe { ffi::ll_inference_mode_is_enabled() != 0 }
}

/// Whether autograd records operations on this thread (`torch.is_grad_enabled()`).
pub fn is_grad_enabled() -> bool {
    // SAFETY: reads a thread-local flag.
    unsafe { ffi::ll_grad_mode_is_enabled() != 0 }
}
