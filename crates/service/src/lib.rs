//! The subject of the lab: a real tch inference service with the three leaks of the reference
//! scenario, each switchable on its own ([`variant`]), the leaky and the fixed code side by side
//! ([`causes`]), served over HTTP ([`http`]).
//!
//! The service knows nothing about verdicts or plots: it serves, and it reports its own memory
//! (`/metrics`, `/debug/memory`, per-request samples and memory_viz snapshots).

pub mod api;
pub mod causes;
pub mod fault;
pub mod http;
pub mod metrics;
pub mod pipeline;

pub use http::{app, router, serve, ServiceConfig};

/// A `--device` choice: a device, or `auto` for CUDA when one is visible.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceRequest {
    Cpu,
    Cuda,
    Auto,
}

impl std::str::FromStr for DeviceRequest {
    type Err = String;
    fn from_str(s: &str) -> Result<DeviceRequest, String> {
        match s {
            "cpu" => Ok(DeviceRequest::Cpu),
            "cuda" => Ok(DeviceRequest::Cuda),
            "auto" => Ok(DeviceRequest::Auto),
            other => Err(format!("unknown device `{other}`: use cpu, cuda or auto")),
        }
    }
}

/// The device `request` means on this machine; CUDA asked for and absent is an error that
/// says so, never a crash.
pub fn resolve_device(request: DeviceRequest) -> anyhow::Result<Device> {
    let available = leaklab_probe::cuda::is_available();
    match request {
        DeviceRequest::Cpu => Ok(Device::Cpu),
        DeviceRequest::Auto => Ok(if available { Device::Cuda } else { Device::Cpu }),
        DeviceRequest::Cuda if available => Ok(Device::Cuda),
        DeviceRequest::Cuda => anyhow::bail!("CUDA not available: no CUDA device is visible to this process (use --device cpu or auto)"),
    }
}
pub use leaklab_vocab::{Cause, Device, Mode, RequestSample, Stage, Variant};
pub use pipeline::{Batch, Pipeline, PipelineConfig, SampleDepth};
