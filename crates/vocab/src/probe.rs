//! One name per memory series: how to read it from a sample, how noisy it is, and which one
//! decides a verdict on which device. Every report, plot, metric and check names probes
//! through [`Probe`], never through a string of its own.

use crate::sample::MemorySample;
use serde::{Deserialize, Serialize};

/// A memory series a service's samples carry. It serialises as its [`Probe::name`], the one
/// place each name is written (tidy checks that no other source spells one out).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Probe {
    /// Live bytes of libtorch's CPU tensor storage, counted exactly by the counting allocator.
    CpuAllocator,
    /// Resident set size of the process.
    Rss,
    /// The malloc heap in use (`mallinfo2`): autograd nodes and other C++ objects live here.
    MallocHeap,
    /// `torch.cuda.memory_allocated()`: bytes held by live CUDA tensors, exact.
    CudaAllocated,
    /// `torch.cuda.memory_reserved()`: what the caching allocator holds from the driver.
    CudaReserved,
    /// GPU memory of this process as NVML sees it (the caching allocator, plus CUDA context,
    /// cuBLAS workspaces and any other library).
    NvmlProcess,
}

impl Probe {
    pub const ALL: [Probe; 6] = [
        Probe::CpuAllocator,
        Probe::Rss,
        Probe::MallocHeap,
        Probe::CudaAllocated,
        Probe::CudaReserved,
        Probe::NvmlProcess,
    ];

    /// The series' name in reports, plots, JSON and Prometheus labels.
    pub fn name(self) -> &'static str {
        match self {
            Probe::CpuAllocator => "cpu_allocator_live",
            Probe::Rss => "rss",
            Probe::MallocHeap => "malloc_heap",
            Probe::CudaAllocated => "cuda_allocated",
            Probe::CudaReserved => "cuda_reserved",
            Probe::NvmlProcess => "nvml_process",
        }
    }

    /// The series' value in `sample`, when the sample carries it.
    pub fn read(self, sample: &MemorySample) -> Option<i64> {
        match self {
            Probe::CpuAllocator => Some(sample.cpu.live_bytes),
            Probe::Rss => Some(sample.rss_bytes as i64),
            Probe::MallocHeap => Some(sample.heap_bytes as i64),
            Probe::CudaAllocated => sample.cuda.map(|c| c.allocated_bytes),
            Probe::CudaReserved => sample.cuda.map(|c| c.reserved_bytes),
            Probe::NvmlProcess => sample
                .nvml
                .and_then(|n| n.process_used_bytes)
                .map(|b| b as i64),
        }
    }

    /// The amplitude of the probe's noise in bytes, for the detector: 0 for the exact
    /// allocators; pages and arenas for RSS and the heap; segments for the caching allocator.
    pub fn noise_bytes(self) -> f64 {
        match self {
            Probe::CpuAllocator | Probe::CudaAllocated => 0.0,
            Probe::Rss => 8e6,
            Probe::MallocHeap => 4e6,
            // The CUDA caching allocator reserves in segments of 2 MB and 20 MB and rounds large blocks.
            Probe::CudaReserved | Probe::NvmlProcess => 64e6,
        }
    }
}

impl Serialize for Probe {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for Probe {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Probe, D::Error> {
        let name = String::deserialize(deserializer)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

impl std::str::FromStr for Probe {
    type Err = String;
    fn from_str(s: &str) -> Result<Probe, String> {
        Probe::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown probe `{s}`: one of {}",
                    Probe::ALL.map(Probe::name).join(", ")
                )
            })
    }
}

impl std::fmt::Display for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::CudaStats;

    #[test]
    fn each_probe_reads_its_own_figure_and_serialises_as_its_name() {
        let sample = MemorySample {
            rss_bytes: 3,
            heap_bytes: 4,
            cuda: Some(CudaStats {
                allocated_bytes: 5,
                reserved_bytes: 6,
                ..Default::default()
            }),
            ..Default::default()
        };
        let read: Vec<_> = Probe::ALL.iter().map(|p| p.read(&sample)).collect();
        assert_eq!(read, [Some(0), Some(3), Some(4), Some(5), Some(6), None]);
        for p in Probe::ALL {
            assert_eq!(serde_json::to_value(p).unwrap(), p.name());
            assert_eq!(serde_json::from_value::<Probe>(p.name().into()).unwrap(), p);
        }
        assert!(serde_json::from_value::<Probe>("rss_live".into())
            .unwrap_err()
            .to_string()
            .contains("unknown probe `rss_live`"));
    }
}
