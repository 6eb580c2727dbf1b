//! Leak checks for tch code in ordinary `cargo test`, on the exact CPU allocator (and RSS and
//! the CUDA allocator when asked): the libtorch-aware face of [`leaklab_detect::LeakCheck`].
//!
//! # What the check sees
//! - Every CPU tensor storage born while the check runs, on **any thread**, and still alive at
//!   each sample: the body's own thread, and the worker threads, pools and `spawn_blocking`
//!   tasks it hands work to. It does so by making its memory context the process-wide default
//!   for threads that have no named context of their own ([`MemoryContext::enter_as_default`]).
//! - Exactly: the verdict is on a byte count, not an estimate.
//!
//! # What it cannot see
//! - Memory from malloc (autograd nodes, Python-free C++ objects): add [`TorchLeakCheck::rss`].
//! - CUDA memory: add [`TorchLeakCheck::cuda`] (process-wide, like `torch.cuda.memory_allocated`).
//! - Memory born on a thread inside a *named* context of its own (a service's request stages):
//!   that memory belongs to that context.
//!
//! # Parallel tests
//! Checks in one process take turns (a process-wide lock), so one check's leak never shows in
//! another's window. Torch work of *other* tests running in parallel, outside any check and any
//! named context, is counted while it lives: allocations freed before the next sample are
//! invisible, and the detector's median slope shrugs off a few that are not. A test that keeps
//! tensors alive for long beside checks should run them in a named context, or the check can be
//! narrowed with [`TorchLeakCheck::current_thread_only`].
//!
//! ```
//! use leaklab_probe::guard::TorchLeakCheck;
//! use tch::{Device, Kind, Tensor};
//!
//! let mut history = Vec::new();
//! let leaky = TorchLeakCheck::new(5, 50).run(|_| {
//!     let y = Tensor::ones([64, 512], (Kind::Float, Device::Cpu)) * 2.0;
//!     history.push(y); // keeps every output alive
//! });
//! assert!(!leaky.passed());
//!
//! let mut peaks = Vec::new();
//! let fixed = TorchLeakCheck::new(5, 50).run(|_| {
//!     let y = Tensor::ones([64, 512], (Kind::Float, Device::Cpu)) * 2.0;
//!     peaks.push(y.max().double_value(&[])); // keeps a number
//! });
//! fixed.assert_no_leak();
//! ```

use crate::context::MemoryContext;
use crate::{cpu, cuda, process};
use leaklab_detect::{LeakCheck, LeakReport};
use std::sync::Mutex;

/// One check at a time per process, since the default context is process-wide. The value is
/// the number of checks run so far: each takes the next of [`ROTATION`] contexts, so memory an
/// earlier check's body kept, freed during a later check, is not counted against it.
static TURN: Mutex<usize> = Mutex::new(0);
const ROTATION: usize = 16;

/// Which threads' allocations a check counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threads {
    /// Every thread outside a named context (the default).
    All,
    /// Only the thread that runs the body.
    Current,
}

/// A leak check over a closure, measured on the exact CPU allocator (budget 0 bytes per
/// iteration), plus RSS and CUDA allocated bytes when asked.
pub struct TorchLeakCheck {
    warmup: usize,
    iterations: usize,
    cpu_budget: f64,
    rss: Option<(f64, f64)>,
    cuda: Option<(usize, f64)>,
    threads: Threads,
}

impl TorchLeakCheck {
    pub fn new(warmup: usize, iterations: usize) -> TorchLeakCheck {
        TorchLeakCheck {
            warmup,
            iterations,
            cpu_budget: 0.0,
            rss: None,
            cuda: None,
            threads: Threads::All,
        }
    }

    /// Bytes per iteration the exact allocator may grow by and still pass (default 0).
    pub fn cpu_budget(mut self, bytes: f64) -> Self {
        self.cpu_budget = bytes;
        self
    }

    /// Also judge RSS, with a budget per iteration and the probe's noise amplitude.
    pub fn rss(mut self, budget_bytes: f64, noise_bytes: f64) -> Self {
        self.rss = Some((budget_bytes, noise_bytes));
        self
    }

    /// Also judge CUDA allocated bytes on `device` (skipped when CUDA is not available).
    pub fn cuda(mut self, device: usize, budget_bytes: f64) -> Self {
        self.cuda = Some((device, budget_bytes));
        self
    }

    /// Counts only what the body's own thread allocates: the narrower, older behaviour, for a
    /// body that is known to stay on one thread beside busy parallel tests.
    pub fn current_thread_only(mut self) -> Self {
        self.threads = Threads::Current;
        self
    }

    pub fn run(self, mut body: impl FnMut(usize)) -> LeakReport {
        cpu::install().expect("the counting allocator installs");
        // A panicking body poisons the lock but leaves nothing inconsistent behind it.
        let mut turn = TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        *turn += 1;
        let ctx = MemoryContext::named(&format!("leak-check-{}", *turn % ROTATION));
        // Memory that a check sixteen turns ago kept may still be in this context: count from here.
        let base = cpu::live_bytes_in(ctx);
        let _default = (self.threads == Threads::All).then(|| ctx.enter_as_default());
        let mut check = LeakCheck::new(self.warmup, self.iterations).probe(
            "cpu allocator (exact)",
            self.cpu_budget,
            0.0,
            move || cpu::live_bytes_in(ctx) - base,
        );
        if let Some((budget, noise)) = self.rss {
            check = check.probe(leaklab_vocab::Probe::Rss.name(), budget, noise, || {
                process::rss_bytes().map_or(0, |b| b as i64)
            });
        }
        if let Some((device, budget)) = self.cuda.filter(|_| cuda::is_available()) {
            check = check.probe("cuda allocated", budget, 0.0, move || {
                cuda::stats(device).map_or(0, |s| s.allocated_bytes)
            });
        }
        check.run(|i| {
            let _in_ctx = ctx.enter();
            body(i)
        })
    }
}

/// Panics with the report when `body` leaks on the exact allocator.
#[track_caller]
pub fn assert_no_leak(warmup: usize, iterations: usize, body: impl FnMut(usize)) {
    TorchLeakCheck::new(warmup, iterations)
        .run(body)
        .assert_no_leak();
}

/// The README's Rust snippets, compiled and run as doc tests so they cannot drift.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeSnippets;

/// The runbook's Rust snippets, likewise.
#[doc = include_str!("../../../docs/runbook.md")]
#[cfg(doctest)]
pub struct RunbookSnippets;
