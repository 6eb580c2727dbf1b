//! [`Probes`]: every probe read at once, into a [`MemorySample`].

use crate::cpu;
use crate::cuda;
use crate::nvml::NvmlProbe;
use crate::{process, Result};
pub use leaklab_vocab::MemorySample;

/// Whether a sample reads NVML (a driver call, slow) or leaves it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nvml {
    Read,
    Skip,
}

/// Which probes to read. Build it once (NVML initialisation is slow) and sample often.
pub struct Probes {
    cuda_device: Option<usize>,
    nvml: Option<NvmlProbe>,
    /// Why NVML is off, when it is; reported once instead of failing every sample.
    pub nvml_unavailable: Option<String>,
}

impl Probes {
    /// CPU allocator and process probes only.
    pub fn cpu() -> Probes {
        Probes {
            cuda_device: None,
            nvml: None,
            nvml_unavailable: Some("not requested".into()),
        }
    }

    /// Adds the CUDA allocator and NVML for `device`; fails when CUDA is not available.
    pub fn cuda(device: usize) -> Result<Probes> {
        cuda::stats(device)?;
        let (nvml, nvml_unavailable) = match NvmlProbe::new() {
            Ok(p) => (Some(p), None),
            Err(e) => (None, Some(e.to_string())),
        };
        Ok(Probes {
            cuda_device: Some(device),
            nvml,
            nvml_unavailable,
        })
    }

    pub fn cuda_device(&self) -> Option<usize> {
        self.cuda_device
    }

    /// The allocator figures (CPU, and CUDA when enabled) read now; RSS, heap and NVML carried
    /// over from `previous`. The allocators are atomics; `mallinfo2` walks every malloc arena
    /// and `/proc` is a file read, which on a hot path cost more than the 2 % the lab allows,
    /// so services read those every N requests (`sample`) and this in between.
    pub fn sample_allocators(&self, previous: &MemorySample) -> MemorySample {
        MemorySample {
            cpu: cpu::stats(),
            cuda: self.cuda_device.and_then(|d| cuda::stats(d).ok()),
            ..previous.clone()
        }
    }

    /// Reads every enabled probe. NVML is the slow one (a driver call); pass [`Nvml::Skip`] on
    /// hot paths and read it every N requests instead.
    pub fn sample(&self, nvml: Nvml) -> MemorySample {
        let cuda = self.cuda_device.and_then(|d| cuda::stats(d).ok());
        let nvml = match (&self.nvml, self.cuda_device) {
            (Some(p), Some(d)) if nvml == Nvml::Read => p.read(d as u32).ok(),
            _ => None,
        };
        MemorySample {
            cpu: cpu::stats(),
            rss_bytes: process::rss_bytes().unwrap_or(0),
            heap_bytes: process::heap_bytes(),
            cuda,
            nvml,
        }
    }
}
