//! Memory contexts: labels such as a request stage, attached to every CPU allocation.
//!
//! The counting allocator records the calling thread's current context on each block it hands
//! out and keeps live bytes per context, so "which stage's memory does not come back" is an
//! exact question. Contexts are thread-local, like libtorch's own modes: set them on the thread
//! that does the work. One context at a time can also be the process-wide default, which the
//! allocator uses for threads that have none of their own (how a leak check sees every thread).

use crate::ffi;
use std::sync::Mutex;

/// An interned label; at most 63 distinct names per process besides the default `other`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MemoryContext(i32);

static NAMES: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());

impl MemoryContext {
    /// Context 0, where every allocation made outside a named context is counted.
    pub const OTHER: MemoryContext = MemoryContext(0);

    /// The context with this name, registered on first use. Past the table's 64 slots every
    /// new name maps to `other`, which keeps the allocator's counters fixed-size.
    pub fn named(name: &str) -> MemoryContext {
        let mut names = NAMES.lock().expect("context table poisoned");
        if names.is_empty() {
            names.push("other");
        }
        if let Some(i) = names.iter().position(|n| *n == name) {
            return MemoryContext(i as i32);
        }
        if names.len() >= ffi::MAX_CONTEXTS {
            return MemoryContext::OTHER;
        }
        names.push(Box::leak(name.to_owned().into_boxed_str()));
        MemoryContext(names.len() as i32 - 1)
    }

    pub fn name(self) -> &'static str {
        NAMES
            .lock()
            .expect("context table poisoned")
            .get(self.0 as usize)
            .copied()
            .unwrap_or("other")
    }

    pub fn id(self) -> i32 {
        self.0
    }

    pub(crate) fn from_id(id: i32) -> MemoryContext {
        MemoryContext(id)
    }

    /// This thread's current context.
    pub fn current() -> MemoryContext {
        // SAFETY: reads a thread-local int in the shim.
        MemoryContext(unsafe { ffi::ll_context_get() })
    }

    /// Makes this the calling thread's context until the guard drops (then the previous one).
    pub fn enter(self) -> ContextGuard {
        let previous = MemoryContext::current();
        // SAFETY: writes a thread-local int in the shim; ids are checked there too.
        unsafe { ffi::ll_context_set(self.0) };
        ContextGuard {
            previous,
            _not_send: std::marker::PhantomData,
        }
    }

    /// Makes this the context of every allocation made, on any thread, outside a named
    /// context, until the guard drops (then the previous default). This is how a leak check
    /// sees what its body hands to worker threads. Process-wide: one owner at a time.
    pub fn enter_as_default(self) -> DefaultContextGuard {
        // SAFETY: an atomic store in the shim; ids are checked there.
        let previous = MemoryContext(unsafe { ffi::ll_context_get_default() });
        unsafe { ffi::ll_context_set_default(self.0) };
        DefaultContextGuard { previous }
    }

    /// All registered contexts, in id order.
    pub fn all() -> Vec<MemoryContext> {
        let n = NAMES.lock().expect("context table poisoned").len().max(1);
        (0..n as i32).map(MemoryContext).collect()
    }
}

/// Restores the previous context on drop; not `Send`, since contexts are per thread.
#[must_use = "the context ends when the guard drops"]
pub struct ContextGuard {
    previous: MemoryContext,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for ContextGuard {
    fn drop(&mut self) {
        // SAFETY: as in `enter`.
        unsafe { ffi::ll_context_set(self.previous.0) };
    }
}

/// Restores the previous process-wide default context on drop.
#[must_use = "the default context ends when the guard drops"]
pub struct DefaultContextGuard {
    previous: MemoryContext,
}

impl Drop for DefaultContextGuard {
    fn drop(&mut self) {
        // SAFETY: as in `enter_as_default`.
        unsafe { ffi::ll_context_set_default(self.previous.0) };
    }
}
