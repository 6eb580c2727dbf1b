//! The HTTP layer: axum on tokio, generic over the [`Handler`] it serves. The lab's service
//! serves its [`Pipeline`] through it; the incident drill serves each incident's handler through
//! it too, so both answer with one validation, one error body, one panic answer, one
//! `/metrics` and one snapshot route.
//!
//! Requests are parsed and validated on the async side; the handler runs on a blocking thread
//! while holding the worker lock, so libtorch's thread-local modes stay on one thread and the
//! per-request memory sample is taken at the same point of every request.

use crate::api::{validate, ApiError, Batch, InferError, InferRequest, InferResponse, Inference};
use crate::metrics::{Metrics, Outcome, OwnGauge};
use crate::pipeline::{Pipeline, PipelineConfig};
use crate::sampler::SampleDepth;
use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use leaklab_model::ModelConfig;
use leaklab_probe::{cpu, cuda, snapshot, Probes};
use leaklab_vocab::{Device, RequestSample, Scale, Variant};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

/// What the HTTP layer serves: the lab's [`Pipeline`], and each handler of the incident drill.
///
/// The layer validates every request against [`Handler::model`] before the handler sees it,
/// runs [`Handler::infer`] on a blocking thread while holding the one worker lock, and answers
/// a panic in it with 500; the service goes on.
pub trait Handler: Send + 'static {
    /// What `GET /debug/memory` says about the handler, beside the sample: a struct, whose
    /// fields the report flattens in.
    type State: Serialize + Send + 'static;
    /// What the answers and the metrics' `variant` label call this service.
    fn name(&self) -> &'static str;
    /// The model behind it: the width every row must have, and the memory a batch needs.
    fn model(&self) -> ModelConfig;
    /// Serves one validated batch.
    fn infer(&mut self, batch: &Batch) -> Result<Inference, InferError>;
    /// Requests served so far.
    fn requests(&self) -> u64;
    /// This process's probes (the allocators for the memory budget, CUDA for the snapshot).
    fn probes(&self) -> &Probes;
    /// Memory now, after a request (its latency) or for a scrape (latency 0).
    fn sample(&mut self, latency_us: u64, depth: SampleDepth) -> RequestSample;
    /// Whether requests run under the stage contexts, so a sample's bytes by stage mean something
    /// (`leaklab_stage_live_bytes` is exported only then).
    fn stages(&self) -> bool;
    fn state(&self) -> Self::State;
    /// The handler's own gauges, read at every scrape: always the same names.
    fn gauges(&self) -> Vec<OwnGauge> {
        Vec::new()
    }
}

/// How the layer serves any handler: limits, debug endpoints, sampling, the memory budget.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct HttpConfig {
    /// Most rows in one request.
    pub max_batch: usize,
    pub body_limit_bytes: usize,
    pub request_timeout: Duration,
    /// Turns on `/debug/memory/samples` and `/debug/memory/snapshot` (off by default: they expose
    /// internals and the snapshot can be large).
    pub debug_endpoints: bool,
    /// Per-request samples kept for `/debug/memory/samples`.
    pub sample_log_capacity: usize,
    /// Alloc/free events recorded for the snapshot (0: none), like `max_entries` in PyTorch.
    pub memory_history_entries: usize,
    /// Read the slow probes (RSS, malloc heap, NVML) every this many requests; the allocators
    /// and per-stage bytes are read on every request.
    pub process_probe_every: u64,
    /// Memory the service may use (CPU allocator bytes, or CUDA allocated bytes on CUDA). A
    /// request whose estimated need does not fit is refused before anything is allocated; on
    /// CPU the budget is also a hard cap in the allocator, so an estimate that falls short ends
    /// in a caught allocation failure (503), never in an OOM kill.
    pub memory_budget_bytes: Option<u64>,
    /// Fault injection for the lab's own tests: abort the process after this many requests,
    /// as a crash would (set through `LEAKLAB_CRASH_AFTER=<variant>:<n>`).
    pub crash_after: Option<u64>,
    /// Fault injection for the lab's own tests: answer HTTP 500 to every request after this
    /// many, each still run (set through `LEAKLAB_FAIL_AFTER=<variant>:<n>`).
    pub fail_after: Option<u64>,
}

impl HttpConfig {
    /// The defaults for `model`: 1024 rows a request, a body limit that fits them.
    pub fn new(model: ModelConfig) -> HttpConfig {
        HttpConfig {
            max_batch: 1024,
            body_limit_bytes: model.json_body_bytes(1024).max(1 << 20),
            request_timeout: Duration::from_secs(30),
            debug_endpoints: false,
            sample_log_capacity: 200_000,
            memory_history_entries: 0,
            process_probe_every: 10,
            memory_budget_bytes: None,
            crash_after: None,
            fail_after: None,
        }
    }

    /// Sets the most rows per request, and a body limit that fits them.
    pub fn with_max_batch(mut self, model: ModelConfig, rows: usize) -> HttpConfig {
        self.max_batch = rows;
        self.body_limit_bytes = self.body_limit_bytes.max(model.json_body_bytes(rows));
        self
    }
}

/// The lab's service: one variant's pipeline, and how it is served.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ServiceConfig {
    pub variant: Variant,
    pub pipeline: PipelineConfig,
    pub http: HttpConfig,
}

impl ServiceConfig {
    pub fn new(variant: Variant, pipeline: PipelineConfig) -> ServiceConfig {
        ServiceConfig {
            variant,
            pipeline,
            http: HttpConfig::new(pipeline.model),
        }
    }

    /// The service of `variant` at `scale` on `device`, sized the way `leaklab-service serve` sizes it:
    /// the fixed cache holds 32 batches, the body limit fits the largest batch.
    pub fn for_scale(variant: Variant, scale: Scale, device: Device) -> ServiceConfig {
        let model = scale.config();
        let mut pipeline = PipelineConfig::new(model, device);
        pipeline.cache_capacity_bytes = 32 * model.input_bytes(scale.batch()) as usize;
        ServiceConfig::new(variant, pipeline)
    }

    /// Sets the most rows per request, and a body limit that fits them.
    pub fn with_max_batch(mut self, rows: usize) -> ServiceConfig {
        self.http = self.http.with_max_batch(self.pipeline.model, rows);
        self
    }
}

struct Worker<H> {
    handler: H,
    samples: VecDeque<RequestSample>,
}

/// A handler and how it is served: the state every route shares.
pub struct App<H> {
    worker: Arc<Mutex<Worker<H>>>,
    metrics: Metrics,
    config: HttpConfig,
    name: &'static str,
    model: ModelConfig,
    stages: bool,
}

impl<H: Handler> App<H> {
    /// Serves `handler` as `config` says: sets the CPU allocator's cap to the memory budget (off
    /// CUDA) and starts recording allocation history for the snapshot route when asked.
    pub fn new(handler: H, config: HttpConfig) -> anyhow::Result<Arc<App<H>>> {
        let on_cuda = handler.probes().cuda_device().is_some();
        if let (Some(budget), false) = (config.memory_budget_bytes, on_cuda) {
            cpu::set_limit(Some(budget));
        }
        if config.debug_endpoints && config.memory_history_entries > 0 {
            cpu::record_history(config.memory_history_entries);
            if on_cuda {
                cuda::record_history(true, config.memory_history_entries)?;
            }
        }
        let (name, model, stages) = (handler.name(), handler.model(), handler.stages());
        let metrics = Metrics::new(name, &handler.gauges());
        let samples = VecDeque::with_capacity(config.sample_log_capacity.min(1 << 16));
        Ok(Arc::new(App {
            worker: Arc::new(Mutex::new(Worker { handler, samples })),
            metrics,
            config,
            name,
            model,
            stages,
        }))
    }
}

/// The lab's service of `config`: its variant's pipeline behind the layer.
pub fn app(config: ServiceConfig) -> anyhow::Result<Arc<App<Pipeline>>> {
    App::new(Pipeline::new(config.variant, config.pipeline)?, config.http)
}

/// Every route of the layer: `/v1/infer`, `/metrics`, `/healthz`, `/debug/memory`, and (with
/// the debug endpoints on) `/debug/memory/samples` and `/debug/memory/snapshot`.
pub fn router<H: Handler>(app: Arc<App<H>>) -> Router {
    let timeout = app.config.request_timeout;
    Router::new()
        .route("/v1/infer", post(infer::<H>))
        .route("/metrics", get(metrics::<H>))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/debug/memory", get(memory::<H>))
        .route("/debug/memory/samples", get(samples::<H>))
        .route("/debug/memory/snapshot", get(memory_snapshot::<H>))
        .layer(DefaultBodyLimit::max(app.config.body_limit_bytes))
        .layer(tower_http::timeout::TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            timeout,
        ))
        .with_state(app)
}

/// Binds `addr`, tells `started` the address it got, serves until SIGINT or SIGTERM.
pub async fn serve_app<H: Handler>(
    app: Arc<App<H>>,
    addr: SocketAddr,
    started: impl FnOnce(SocketAddr),
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    started(listener.local_addr()?);
    axum::serve(listener, router(app))
        .with_graceful_shutdown(shutdown())
        .await?;
    Ok(())
}

/// The lab's service: binds `addr` (127.0.0.1 unless told otherwise), prints the address it
/// got, serves until SIGINT or SIGTERM.
pub async fn serve(config: ServiceConfig, addr: SocketAddr) -> anyhow::Result<()> {
    let variant = config.variant;
    // The lab driver reads this line to learn the port when it asked for port 0.
    serve_app(app(config)?, addr, |local| {
        println!("leaklab-service {variant} listening on http://{local}")
    })
    .await
}

async fn shutdown() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
}

async fn infer<H: Handler>(
    State(app): State<Arc<App<H>>>,
    body: Result<Json<InferRequest>, JsonRejection>,
) -> Result<Json<InferResponse>, ApiError> {
    let started = Instant::now();
    let result = run_infer(&app, body).await;
    app.metrics.latency.observe(started.elapsed().as_secs_f64());
    app.metrics.count(match &result {
        Ok(_) => Outcome::Ok,
        Err(e) if e.status.is_client_error() => Outcome::ClientError,
        Err(_) => Outcome::ServerError,
    });
    result.map(Json)
}

async fn run_infer<H: Handler>(
    app: &Arc<App<H>>,
    body: Result<Json<InferRequest>, JsonRejection>,
) -> Result<InferResponse, ApiError> {
    let Json(request) = body?;
    let batch = validate(request, app.model.input as usize, app.config.max_batch)?;
    let need = app.model.request_bytes_estimate(batch.rows as i64).max(0) as u64;
    if let Some(budget) = app.config.memory_budget_bytes {
        if need > budget {
            return Err(ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, format!("a batch of {} rows needs about {need} bytes, more than the memory budget of {budget}", batch.rows)));
        }
    }
    let mut worker = app.worker.clone().lock_owned().await;
    if let Some(budget) = app.config.memory_budget_bytes {
        // Only the allocators matter here; the slow process probes stay off this path.
        let sample = worker
            .handler
            .probes()
            .sample_allocators(&leaklab_probe::MemorySample::default());
        let in_use = sample
            .cuda
            .map_or(sample.cpu.live_bytes, |c| c.allocated_bytes)
            .max(0) as u64;
        if in_use + need > budget {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("memory budget exhausted: {in_use} of {budget} bytes in use, this batch needs about {need} more; retry later"),
            ));
        }
    }
    let (capacity, every, crash_after, fail_after) = (
        app.config.sample_log_capacity,
        app.config.process_probe_every.max(1),
        app.config.crash_after,
        app.config.fail_after,
    );
    let (result, sample) = tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let result = catch_unwind(AssertUnwindSafe(|| worker.handler.infer(&batch))).map_err(|panic| ApiError::panicked(panic.as_ref()));
        let requests = worker.handler.requests();
        if crash_after.is_some_and(|n| requests >= n) {
            eprintln!("leaklab-service: crashing on purpose after {requests} requests (LEAKLAB_CRASH_AFTER)");
            std::process::abort();
        }
        let result = match fail_after {
            Some(n) if requests > n => Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("failing on purpose after {n} requests (LEAKLAB_FAIL_AFTER)"))),
            _ => result,
        };
        let latency_us = started.elapsed().as_micros() as u64;
        let depth = if requests % every == 0 { SampleDepth::Full } else { SampleDepth::Allocators };
        let sample = worker.handler.sample(latency_us, depth);
        if matches!(result, Ok(Ok(_))) && capacity > 0 {
            if worker.samples.len() == capacity {
                worker.samples.pop_front();
            }
            worker.samples.push_back(sample.clone());
        }
        (result, sample)
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("the inference worker failed: {e}")))?;
    app.metrics.record(&sample, app.stages);
    let inference = result??;
    Ok(InferResponse {
        request: inference.request,
        variant: app.name.to_string(),
        cached: inference.cached,
        outputs: inference.outputs,
    })
}

async fn metrics<H: Handler>(State(app): State<Arc<App<H>>>) -> impl IntoResponse {
    let (sample, own) = {
        let mut worker = app.worker.lock().await;
        (
            worker.handler.sample(0, SampleDepth::Full),
            worker.handler.gauges(),
        )
    };
    app.metrics.record(&sample, app.stages);
    app.metrics.record_own(&own);
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        app.metrics.encode(),
    )
}

/// `GET /debug/memory`: what the probes read now, and the handler's state.
#[derive(Debug, Serialize)]
pub struct MemoryReport<S> {
    pub variant: String,
    pub requests: u64,
    #[serde(flatten)]
    pub state: S,
    pub cuda_devices: usize,
    pub nvml: Option<String>,
    pub sample: RequestSample,
}

async fn memory<H: Handler>(State(app): State<Arc<App<H>>>) -> Json<MemoryReport<H::State>> {
    let mut worker = app.worker.lock().await;
    let sample = worker.handler.sample(0, SampleDepth::Full);
    let h = &worker.handler;
    Json(MemoryReport {
        variant: app.name.to_string(),
        requests: h.requests(),
        state: h.state(),
        cuda_devices: cuda::device_count(),
        nvml: h.probes().nvml_unavailable.clone(),
        sample,
    })
}

fn debug_enabled<H>(app: &App<H>) -> Result<(), ApiError> {
    if app.config.debug_endpoints {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "debug endpoints are off; start the service with --debug-endpoints",
        ))
    }
}

#[derive(Debug, Deserialize)]
struct Since {
    since: Option<u64>,
}

/// `GET /debug/memory/samples?since=N`: the per-request samples after request N.
async fn samples<H: Handler>(
    State(app): State<Arc<App<H>>>,
    Query(q): Query<Since>,
) -> Result<Json<Vec<RequestSample>>, ApiError> {
    debug_enabled(&app)?;
    let since = q.since.unwrap_or(0);
    let worker = app.worker.lock().await;
    Ok(Json(
        worker
            .samples
            .iter()
            .filter(|s| s.request > since)
            .cloned()
            .collect(),
    ))
}

/// `GET /debug/memory/snapshot`: the memory_viz pickle (CUDA allocator on CUDA, the counting
/// CPU allocator otherwise).
async fn memory_snapshot<H: Handler>(
    State(app): State<Arc<App<H>>>,
) -> Result<impl IntoResponse, ApiError> {
    debug_enabled(&app)?;
    let on_cuda = app
        .worker
        .lock()
        .await
        .handler
        .probes()
        .cuda_device()
        .is_some();
    let bytes = tokio::task::spawn_blocking(move || {
        if on_cuda {
            cuda::snapshot_pickle()
        } else {
            Ok(snapshot::cpu_snapshot_pickle())
        }
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream"),
            (
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"memory_snapshot.pickle\"",
            ),
        ],
        bytes,
    ))
}
