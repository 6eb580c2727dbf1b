//! GPU memory as the driver sees it, through NVML (`nvml-wrapper`).
//!
//! NVML counts what the CUDA allocator reserved plus the CUDA context itself, so it is the
//! figure an orchestrator's OOM killer and `nvidia-smi` see. Without a driver, [`NvmlProbe::new`]
//! returns [`Error::NvmlUnavailable`].

use crate::{Error, Result};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::Nvml;

pub struct NvmlProbe {
    nvml: Nvml,
}

pub use leaklab_vocab::NvmlReading;

impl NvmlProbe {
    pub fn new() -> Result<NvmlProbe> {
        Nvml::init()
            .map(|nvml| NvmlProbe { nvml })
            .map_err(|e| Error::NvmlUnavailable(e.to_string()))
    }

    pub fn read(&self, device: u32) -> Result<NvmlReading> {
        let dev = self
            .nvml
            .device_by_index(device)
            .map_err(|e| Error::Nvml(e.to_string()))?;
        let info = dev.memory_info().map_err(|e| Error::Nvml(e.to_string()))?;
        let pid = std::process::id();
        let process_used_bytes = dev.running_compute_processes().ok().and_then(|procs| {
            procs
                .into_iter()
                .find(|p| p.pid == pid)
                .and_then(|p| match p.used_gpu_memory {
                    UsedGpuMemory::Used(bytes) => Some(bytes),
                    UsedGpuMemory::Unavailable => None,
                })
        });
        Ok(NvmlReading {
            process_used_bytes,
            device_used_bytes: info.used,
            device_total_bytes: info.total,
        })
    }
}
