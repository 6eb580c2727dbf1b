//! Where tensors live, and what a user may ask for on the command line: a device, or `auto`.
//! The request travels as this type from `leaklab run-lab --device` through the run-lab driver
//! to `leaklab-service`; only the service, which links libtorch, can tell what `auto` means.

use crate::probe::Probe;
use serde::{Deserialize, Serialize};

/// Where tensors live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    Cpu,
    Cuda,
}

impl Device {
    pub fn name(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Cuda => "cuda",
        }
    }

    /// The probe whose verdict decides on this device: the allocator that holds the tensors.
    pub fn primary_probe(self) -> Probe {
        match self {
            Device::Cpu => Probe::CpuAllocator,
            Device::Cuda => Probe::CudaAllocated,
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Device {
    type Err = String;
    fn from_str(s: &str) -> Result<Device, String> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda),
            other => Err(format!("unknown device `{other}`: use `cpu` or `cuda`")),
        }
    }
}

/// A `--device` choice: a device, or `auto` for CUDA when one is visible.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceRequest {
    Cpu,
    Cuda,
    Auto,
}

impl DeviceRequest {
    pub const ALL: [DeviceRequest; 3] =
        [DeviceRequest::Cpu, DeviceRequest::Cuda, DeviceRequest::Auto];

    /// The flag's value, as `--device` takes it.
    pub fn name(self) -> &'static str {
        match self {
            DeviceRequest::Cpu => "cpu",
            DeviceRequest::Cuda => "cuda",
            DeviceRequest::Auto => "auto",
        }
    }

    /// The device this request means where `cuda_available` says whether a CUDA device is
    /// visible; CUDA asked for and absent is an error that says what to do instead.
    pub fn resolve(self, cuda_available: bool) -> Result<Device, String> {
        match self {
            DeviceRequest::Cpu => Ok(Device::Cpu),
            DeviceRequest::Auto => Ok(if cuda_available { Device::Cuda } else { Device::Cpu }),
            DeviceRequest::Cuda if cuda_available => Ok(Device::Cuda),
            DeviceRequest::Cuda => Err("CUDA not available: no CUDA device is visible to this process (use --device cpu or auto)".into()),
        }
    }
}

impl std::fmt::Display for DeviceRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DeviceRequest {
    type Err = String;
    fn from_str(s: &str) -> Result<DeviceRequest, String> {
        DeviceRequest::ALL
            .into_iter()
            .find(|r| r.name() == s)
            .ok_or_else(|| format!("unknown device `{s}`: use cpu, cuda or auto"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_device_has_its_primary_probe() {
        assert_eq!(Device::Cuda.primary_probe(), Probe::CudaAllocated);
        assert_eq!(Device::Cpu.primary_probe(), Probe::CpuAllocator);
    }

    #[test]
    fn requests_parse_by_name_and_resolve_only_to_what_is_there() {
        for r in DeviceRequest::ALL {
            assert_eq!(r.name().parse::<DeviceRequest>(), Ok(r));
        }
        assert_eq!(
            "gpu".parse::<DeviceRequest>().unwrap_err(),
            "unknown device `gpu`: use cpu, cuda or auto"
        );
        assert_eq!(DeviceRequest::Auto.resolve(false), Ok(Device::Cpu));
        assert_eq!(DeviceRequest::Auto.resolve(true), Ok(Device::Cuda));
        assert_eq!(DeviceRequest::Cpu.resolve(true), Ok(Device::Cpu));
        assert!(DeviceRequest::Cuda
            .resolve(false)
            .unwrap_err()
            .contains("use --device cpu or auto"));
    }
}
