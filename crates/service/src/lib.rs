//! The subject of the lab: a real tch inference service with the three leaks of the reference
//! scenario, each switchable on its own ([`variant`]), the leaky and the fixed code side by side
//! ([`causes`]), served over HTTP ([`http`]).
//!
//! The service knows nothing about verdicts or plots: it serves, and it reports its own memory
//! (`/metrics`, `/debug/memory`, per-request samples and memory_viz snapshots).

pub mod api;
pub mod causes;
pub mod http;
pub mod metrics;
pub mod pipeline;
pub mod variant;

pub use http::{app, router, serve, ServiceConfig};
pub use pipeline::{Batch, DeviceChoice, Pipeline, PipelineConfig, RequestSample, Stage};
pub use variant::{Cause, Mode, Variant};
