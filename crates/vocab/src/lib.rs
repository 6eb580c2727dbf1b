//! leaklab's vocabulary: the types that cross a process boundary or a file.
//!
//! The service writes them (its per-request samples, its JSON bodies), the run-lab driver,
//! the detector's callers and the instrument read them. Keeping them here, with no libtorch,
//! no async runtime and no HTTP, is what lets the driver and the instrument install without a
//! torch install.
//!
//! - [`variant`]: the ten variants, their causes and modes, and the rows of their requests.
//! - [`stage`]: the four request stages, and live bytes per stage by name.
//! - [`sample`]: one memory sample as plain data (allocator, CUDA, NVML, process figures).
//! - [`device`]: where tensors live, and a `--device` request (`auto` included).
//! - [`probe`]: one name per memory series, how to read it from a sample, its noise, and which
//!   one decides on which device.
//! - [`api`]: the service's request and response bodies, and the synthetic requests.
//! - [`scale`]: the model's shapes at the CPU scale and at the reference (seed) scale.
//! - [`rng`]: the one seeded generator behind weights and synthetic inputs.

pub mod api;
pub mod device;
pub mod probe;
pub mod rng;
pub mod sample;
pub mod scale;
pub mod stage;
pub mod variant;

pub use api::{synthetic_request, ErrorBody, InferRequest, InferResponse};
pub use device::{Device, DeviceRequest};
pub use probe::Probe;
pub use rng::SeededRng;
pub use sample::{CpuStats, CudaStats, MemorySample, NvmlReading, RequestSample};
pub use scale::{ModelConfig, Scale};
pub use stage::{Stage, StageBytes};
pub use variant::{Cause, Mode, Variant};
