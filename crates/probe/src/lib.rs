//! Memory probes on real libtorch, for the lab and for anyone's own `cargo test`.
//!
//! tch exposes no inference mode, no allocator statistics and no `empty_cache`; this crate
//! reaches them through a small C++ shim compiled against the provisioned libtorch:
//! - [`cpu`]: a counting allocator registered with `c10::SetCPUAllocator` that sees every CPU
//!   tensor storage, exactly (the CPU twin of `torch.cuda.memory_allocated()`), with per-context
//!   attribution ([`context`]) and an optional alloc/free history.
//! - [`mode`]: `c10::InferenceMode` as a guard and a closure, beside tch's no_grad.
//! - [`cuda`]: the CUDA caching allocator's statistics, `empty_cache`, history and snapshots.
//! - [`process`] (RSS, malloc heap) and [`nvml`] (GPU memory as the driver sees it).
//! - [`snapshot`]: the CPU history written in the pickle format that pytorch.org/memory_viz opens,
//!   each allocation with its native stack, resolved to lines by [`symbols`].
//! - [`MemorySample`]: every probe at once, cheap enough for every request.

pub mod context;
pub mod cpu;
pub mod cuda;
mod ffi;
pub mod guard;
pub mod mode;
pub mod nvml;
mod pickle;
pub mod process;
mod sample;
pub mod snapshot;
pub mod symbols;

pub use context::{ContextGuard, DefaultContextGuard, MemoryContext};
pub use cpu::CpuStats;
pub use cuda::CudaStats;
pub use mode::{inference_mode, InferenceModeGuard};
pub use sample::{MemorySample, Nvml, Probes};

/// What can go wrong when probing memory.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("CUDA not available: {0}")]
    CudaUnavailable(String),
    #[error("CUDA allocator call failed: {0}")]
    Cuda(String),
    #[error("NVML unavailable: {0}")]
    NvmlUnavailable(String),
    #[error("NVML query failed: {0}")]
    Nvml(String),
    #[error("the counting CPU allocator could not be installed: {0}")]
    Install(String),
    #[error("cannot read {what}: {source}")]
    Io {
        what: &'static str,
        source: std::io::Error,
    },
}

pub type Result<T> = std::result::Result<T, Error>;
