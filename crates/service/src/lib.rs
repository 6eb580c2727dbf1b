//! The subject of the lab: a real tch inference service with the three leaks of the reference
//! scenario, each switchable on its own ([`variant`](leaklab_vocab::variant)), the leaky and
//! the fixed code side by side ([`causes`]), served over HTTP ([`http`]).
//!
//! The HTTP layer is generic over its [`Handler`]: the lab's [`Pipeline`] is one, and the
//! incident drill (`lab/exercises`) serves each incident's handler through the same layer.
//!
//! The service knows nothing about verdicts or plots: it serves, and it reports its own memory
//! (`/metrics`, `/debug/memory`, per-request samples and memory_viz snapshots).

pub mod api;
pub mod causes;
pub mod fault;
pub mod http;
pub mod metrics;
pub mod pipeline;
pub mod sampler;

pub use api::{Batch, InferError, Inference};
pub use http::{app, router, serve, serve_app, App, Handler, HttpConfig, ServiceConfig};
pub use leaklab_vocab::{Cause, Device, DeviceRequest, Mode, RequestSample, Stage, Variant};
pub use pipeline::{Pipeline, PipelineConfig};
pub use sampler::{SampleDepth, Sampler};

/// The device `request` means on this machine; CUDA asked for and absent is an error that
/// says so, never a crash.
pub fn resolve_device(request: DeviceRequest) -> anyhow::Result<Device> {
    request
        .resolve(leaklab_probe::cuda::is_available())
        .map_err(anyhow::Error::msg)
}
