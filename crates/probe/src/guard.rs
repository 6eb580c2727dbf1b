//! Leak checks for tch code in ordinary `cargo test`, on the exact CPU allocator (and RSS and
//! the CUDA allocator when asked): the libtorch-aware face of [`leaklab_detect::LeakCheck`].
//!
//! The body runs in a memory context of its own, so the exact figure counts only the blocks the
//! body allocated and has not freed: other tests running in parallel do not disturb it.
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

const SLOTS: usize = 16;
static BUSY: Mutex<[bool; SLOTS]> = Mutex::new([false; SLOTS]);

/// A memory context reserved for one running check (a small pool keeps the context table
/// bounded however many checks a test suite runs).
struct Slot(usize);

impl Slot {
    fn acquire() -> Slot {
        loop {
            {
                let mut busy = BUSY.lock().expect("slot table poisoned");
                if let Some(i) = busy.iter().position(|b| !b) {
                    busy[i] = true;
                    return Slot(i);
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    fn context(&self) -> MemoryContext {
        MemoryContext::named(&format!("leak-check-{}", self.0))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        BUSY.lock().expect("slot table poisoned")[self.0] = false;
    }
}

/// A leak check over a closure, measured on the exact CPU allocator (budget 0 bytes per
/// iteration), plus RSS and CUDA allocated bytes when asked.
pub struct TorchLeakCheck {
    warmup: usize,
    iterations: usize,
    cpu_budget: f64,
    rss: Option<(f64, f64)>,
    cuda: Option<(usize, f64)>,
}

impl TorchLeakCheck {
    pub fn new(warmup: usize, iterations: usize) -> TorchLeakCheck {
        TorchLeakCheck { warmup, iterations, cpu_budget: 0.0, rss: None, cuda: None }
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

    pub fn run(self, mut body: impl FnMut(usize)) -> LeakReport {
        cpu::install().expect("the counting allocator installs");
        let slot = Slot::acquire();
        let ctx = slot.context();
        let mut check = LeakCheck::new(self.warmup, self.iterations).probe("cpu allocator (exact)", self.cpu_budget, 0.0, || cpu::live_bytes_in(ctx));
        if let Some((budget, noise)) = self.rss {
            check = check.probe("rss", budget, noise, || process::rss_bytes().map_or(0, |b| b as i64));
        }
        if let Some((device, budget)) = self.cuda.filter(|_| cuda::is_available()) {
            check = check.probe("cuda allocated", budget, 0.0, move || cuda::stats(device).map_or(0, |s| s.allocated_bytes));
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
    TorchLeakCheck::new(warmup, iterations).run(body).assert_no_leak();
}

/// The README's Rust snippets, compiled and run as doc tests so they cannot drift.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeSnippets;

/// The runbook's Rust snippets, likewise.
#[doc = include_str!("../../../docs/runbook.md")]
#[cfg(doctest)]
pub struct RunbookSnippets;
