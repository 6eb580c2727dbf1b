//! The counting CPU allocator: exact live and peak bytes of libtorch's CPU tensor storage.
//!
//! [`install`] registers it with `c10::SetCPUAllocator` (priority 100, above the default). From
//! then on every CPU storage libtorch allocates is counted; storages allocated earlier are freed
//! by their own deleter and never miscounted. Only tensor storage is seen: autograd nodes and
//! other C++ objects come from malloc, which [`crate::process`] watches.

use crate::context::MemoryContext;
use crate::{ffi, Error, Result};

/// Counters of the CPU allocator since [`install`] (the CPU twin of
/// `torch.cuda.memory_allocated()`, `max_memory_allocated()` and friends).
pub use leaklab_vocab::CpuStats;

/// Registers the counting allocator (idempotent). Call it before the tensors you want counted
/// are created; the service and the leak harness do so at start.
pub fn install() -> Result<()> {
    // SAFETY: the shim writes at most `errlen` bytes into the buffer.
    let (rc, msg) = ffi::with_err(|e, n| unsafe { ffi::ll_cpu_install(e, n) });
    if rc == 0 {
        Ok(())
    } else {
        Err(Error::Install(msg))
    }
}

pub fn is_installed() -> bool {
    // SAFETY: reads an atomic flag.
    unsafe { ffi::ll_cpu_installed() != 0 }
}

pub fn stats() -> CpuStats {
    let mut raw = ffi::CpuStatsRaw::default();
    // SAFETY: `raw` is a valid out-pointer of the declared layout.
    unsafe { ffi::ll_cpu_stats(&mut raw) };
    CpuStats {
        live_bytes: raw.live_bytes,
        peak_bytes: raw.peak_bytes,
        live_blocks: raw.live_blocks,
        alloc_count: raw.alloc_count,
        free_count: raw.free_count,
        alloc_bytes_total: raw.alloc_bytes_total,
    }
}

/// Sets the peak to the current live bytes, like `torch.cuda.reset_peak_memory_stats()`.
pub fn reset_peak() {
    // SAFETY: stores to atomics.
    unsafe { ffi::ll_cpu_reset_peak() }
}

/// Caps live bytes: an allocation that would pass `bytes` fails inside libtorch with
/// `c10::OutOfMemoryError`, exactly like a real out-of-memory (`None` lifts the cap). The
/// service uses it as a hard budget; tests use it to force an allocation failure.
pub fn set_limit(bytes: Option<u64>) {
    // SAFETY: stores to an atomic.
    unsafe { ffi::ll_cpu_set_limit(bytes.map_or(0, |b| b as i64)) }
}

/// Live bytes of the blocks born in `context` (whichever thread frees them later).
pub fn live_bytes_in(context: MemoryContext) -> i64 {
    live_by_context()
        .into_iter()
        .find(|(c, _)| *c == context)
        .map(|(_, b)| b)
        .unwrap_or(0)
}

/// Live bytes per registered context.
pub fn live_by_context() -> Vec<(MemoryContext, i64)> {
    let mut out = [0i64; ffi::MAX_CONTEXTS];
    // SAFETY: `out` holds MAX_CONTEXTS slots, the count passed.
    unsafe { ffi::ll_cpu_live_by_context(out.as_mut_ptr(), out.len()) };
    MemoryContext::all()
        .into_iter()
        .map(|c| (c, out[c.id() as usize]))
        .collect()
}

/// One alloc or free, as recorded while the history is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub time_us: i64,
    pub addr: u64,
    pub size: u64,
    pub kind: EventKind,
    pub context: MemoryContext,
    /// The native stack that allocated the block, when stacks were recorded.
    pub stack: Option<StackId>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Alloc,
    Free,
}

/// A block alive now, as a snapshot lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveBlock {
    pub addr: u64,
    pub size: u64,
    pub time_us: i64,
    pub context: MemoryContext,
    pub stack: Option<StackId>,
}

/// An interned native call stack (see [`stack_addresses`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackId(i32);

impl StackId {
    fn from_raw(id: i32) -> Option<StackId> {
        (id > 0).then_some(StackId(id))
    }
}

/// Native frames each allocation records while the history is on, by default: deep enough to
/// reach the caller's code through libtorch's dispatcher, tch and the closures around it.
pub const DEFAULT_STACK_DEPTH: usize = 64;

/// Starts (or, with 0, stops and clears) the alloc/free history, keeping the newest
/// `max_entries` events, like `torch.cuda.memory._record_memory_history(max_entries=...)`,
/// with each allocation's native stack ([`DEFAULT_STACK_DEPTH`] frames).
pub fn record_history(max_entries: usize) {
    record_history_with_stacks(max_entries, DEFAULT_STACK_DEPTH);
}

/// The history with `stack_depth` native frames per allocation (0: no stacks, the cheapest).
/// Only return addresses are captured at allocation time; [`crate::symbols`] turns them into
/// function, file and line when a snapshot is written.
pub fn record_history_with_stacks(max_entries: usize, stack_depth: usize) {
    let depth = if max_entries == 0 {
        0
    } else {
        stack_depth.min(ffi::MAX_FRAMES)
    };
    // SAFETY: both take the shim's lock or store to an atomic; the depth is clamped.
    unsafe {
        ffi::ll_stacks_enable(depth as i32);
        ffi::ll_history_enable(max_entries);
    }
}

/// The return addresses of stack `id`, innermost first.
pub fn stack_addresses(id: StackId) -> Vec<u64> {
    let mut out = vec![0u64; ffi::MAX_FRAMES];
    // SAFETY: the copy is bounded by the buffer's length.
    let n = unsafe { ffi::ll_stack_frames(id.0, out.as_mut_ptr(), out.len()) };
    out.truncate(n);
    out
}

pub fn history() -> Vec<Event> {
    // SAFETY: the length is read first, and the copy is bounded by the buffer's capacity.
    let cap = unsafe { ffi::ll_history_len() };
    let mut raw = vec![ffi::EventRaw::default(); cap];
    let n = unsafe { ffi::ll_history_copy(raw.as_mut_ptr(), cap) };
    raw.truncate(n);
    raw.into_iter()
        .map(|e| Event {
            time_us: e.time_us,
            addr: e.addr,
            size: e.size,
            kind: if e.action == 0 {
                EventKind::Alloc
            } else {
                EventKind::Free
            },
            context: MemoryContext::from_id(e.context),
            stack: StackId::from_raw(e.stack),
        })
        .collect()
}

/// Every block alive now, oldest first.
pub fn live_blocks() -> Vec<LiveBlock> {
    loop {
        // Blocks may come and go between the count and the copy: leave slack, retry if full.
        let cap = stats().live_blocks.max(0) as usize + 1024;
        let mut raw = vec![ffi::BlockRaw::default(); cap];
        // SAFETY: the copy is bounded by `cap`, the buffer's length.
        let n = unsafe { ffi::ll_live_blocks_copy(raw.as_mut_ptr(), cap) };
        if n < cap {
            raw.truncate(n);
            return raw
                .into_iter()
                .map(|b| LiveBlock {
                    addr: b.addr,
                    size: b.size,
                    time_us: b.time_us,
                    context: MemoryContext::from_id(b.context),
                    stack: StackId::from_raw(b.stack),
                })
                .collect();
        }
    }
}
