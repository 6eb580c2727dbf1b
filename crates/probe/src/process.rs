//! Process-level probes: resident set size and the malloc heap.
//!
//! These see what the allocator probe cannot: autograd nodes, C++ objects, Rust heap. They are
//! noisy (arenas, page granularity), so the detector judges them with a noise floor.

use crate::{Error, Result};

/// Resident set size of this process, from `/proc/self/statm` (read by `leaklab-proc`, the one
/// place that reads `/proc`).
pub fn rss_bytes() -> Result<u64> {
    leaklab_proc::rss_of_self().map_err(|source| Error::Io {
        what: "/proc/self/statm",
        source,
    })
}

/// Bytes in use in glibc's malloc heap, all arenas plus mmapped chunks (`mallinfo2`).
pub fn heap_bytes() -> u64 {
    // SAFETY: mallinfo2 only reads the allocator's own bookkeeping.
    let info = unsafe { libc::mallinfo2() };
    (info.uordblks + info.hblkhd) as u64
}
