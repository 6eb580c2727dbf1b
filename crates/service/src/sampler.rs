//! A process's memory, read after each request: the allocators every time (atomics, cheap), the
//! process probes and NVML every so often (file reads and driver calls, slow), carried over in
//! between. Every handler the HTTP layer serves samples through one of these.

use leaklab_probe::{MemorySample, Nvml, Probes};

/// How much a per-request sample reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampleDepth {
    /// Every probe, NVML included.
    Full,
    /// The allocators (atomics, cheap); the process probes are carried over.
    Allocators,
}

/// The probes of this process and the last full reading, which cheap samples carry over.
pub struct Sampler {
    probes: Probes,
    last_full: MemorySample,
}

impl Sampler {
    pub fn new(probes: Probes) -> Sampler {
        Sampler {
            last_full: probes.sample(Nvml::Skip),
            probes,
        }
    }

    pub fn probes(&self) -> &Probes {
        &self.probes
    }

    /// The allocators read now; at [`SampleDepth::Full`] also RSS, the malloc heap and NVML,
    /// else those carried from the last full sample.
    pub fn memory(&mut self, depth: SampleDepth) -> MemorySample {
        match depth {
            SampleDepth::Full => {
                self.last_full = self.probes.sample(Nvml::Read);
                self.last_full.clone()
            }
            SampleDepth::Allocators => self.probes.sample_allocators(&self.last_full),
        }
    }
}
