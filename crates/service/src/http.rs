//! The HTTP server: axum on tokio, one variant per process.
//!
//! Requests are parsed and validated on the async side; the pipeline runs on a blocking thread
//! while holding the worker lock, so libtorch's thread-local modes stay on one thread and the
//! per-request memory sample is taken at the same point of every request.

use crate::api::{validate, ApiError, InferRequest, InferResponse};
use crate::metrics::Metrics;
use crate::pipeline::{Pipeline, PipelineConfig, SampleDepth};
use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use leaklab_probe::{cpu, cuda, snapshot};
use leaklab_vocab::{Device, RequestSample, Scale, Variant};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ServiceConfig {
    pub variant: Variant,
    pub pipeline: PipelineConfig,
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
}

impl ServiceConfig {
    pub fn new(variant: Variant, pipeline: PipelineConfig) -> ServiceConfig {
        ServiceConfig {
            variant,
            pipeline,
            max_batch: 1024,
            body_limit_bytes: pipeline.model.json_body_bytes(1024).max(1 << 20),
            request_timeout: Duration::from_secs(30),
            debug_endpoints: false,
            sample_log_capacity: 200_000,
            memory_history_entries: 0,
            process_probe_every: 10,
            memory_budget_bytes: None,
            crash_after: None,
        }
    }

    /// The service of `variant` at `scale` on `device`, sized the way `leaklab-serve` sizes it:
    /// the fixed cache holds 32 batches, the body limit fits the largest batch.
    pub fn for_scale(variant: Variant, scale: Scale, device: Device) -> ServiceConfig {
        let model = scale.config();
        let mut pipeline = PipelineConfig::new(model, device);
        pipeline.cache_capacity_bytes = 32 * model.input_bytes(scale.batch()) as usize;
        ServiceConfig::new(variant, pipeline)
    }

    /// Sets the most rows per request, and a body limit that fits them.
    pub fn with_max_batch(mut self, rows: usize) -> ServiceConfig {
        self.max_batch = rows;
        self.body_limit_bytes = self.body_limit_bytes.max(self.pipeline.model.json_body_bytes(rows));
        self
    }
}

struct Worker {
    pipeline: Pipeline,
    samples: VecDeque<RequestSample>,
}

pub struct App {
    worker: Arc<Mutex<Worker>>,
    metrics: Metrics,
    config: ServiceConfig,
}

/// Builds the service state: the model, the variant's caches and the probes.
pub fn app(config: ServiceConfig) -> anyhow::Result<Arc<App>> {
    let pipeline = Pipeline::new(config.variant, config.pipeline)?;
    if let (Some(budget), None) = (config.memory_budget_bytes, pipeline.probes().cuda_device()) {
        cpu::set_limit(Some(budget));
    }
    if config.debug_endpoints && config.memory_history_entries > 0 {
        cpu::record_history(config.memory_history_entries);
        if pipeline.probes().cuda_device().is_some() {
            cuda::record_history(true, config.memory_history_entries)?;
        }
    }
    let samples = VecDeque::with_capacity(config.sample_log_capacity.min(1 << 16));
    Ok(Arc::new(App { worker: Arc::new(Mutex::new(Worker { pipeline, samples })), metrics: Metrics::new(config.variant.name()), config }))
}

pub fn router(app: Arc<App>) -> Router {
    let timeout = app.config.request_timeout;
    Router::new()
        .route("/v1/infer", post(infer))
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/debug/memory", get(memory))
        .route("/debug/memory/samples", get(samples))
        .route("/debug/memory/snapshot", get(memory_snapshot))
        .layer(DefaultBodyLimit::max(app.config.body_limit_bytes))
        .layer(tower_http::timeout::TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, timeout))
        .with_state(app)
}

/// Binds `addr` (127.0.0.1 unless told otherwise), prints the address it got, serves until
/// SIGINT or SIGTERM.
pub async fn serve(config: ServiceConfig, addr: SocketAddr) -> anyhow::Result<()> {
    let app = app(config)?;
    let variant = app.config.variant;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    // The lab driver reads this line to learn the port when it asked for port 0.
    println!("leaklab-service {variant} listening on http://{local}");
    axum::serve(listener, router(app)).with_graceful_shutdown(shutdown()).await?;
    Ok(())
}

async fn shutdown() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
}

async fn infer(State(app): State<Arc<App>>, body: Result<Json<InferRequest>, JsonRejection>) -> Result<Json<InferResponse>, ApiError> {
    let started = Instant::now();
    let result = run_infer(&app, body).await;
    app.metrics.latency.observe(started.elapsed().as_secs_f64());
    app.metrics.count(match &result {
        Ok(_) => "ok",
        Err(e) if e.status.is_client_error() => "client_error",
        Err(_) => "server_error",
    });
    result.map(Json)
}

async fn run_infer(app: &Arc<App>, body: Result<Json<InferRequest>, JsonRejection>) -> Result<InferResponse, ApiError> {
    let Json(request) = body?;
    let batch = validate(request, app.config.pipeline.model.input as usize, app.config.max_batch)?;
    let need = app.config.pipeline.model.request_bytes_estimate(batch.rows as i64).max(0) as u64;
    if let Some(budget) = app.config.memory_budget_bytes {
        if need > budget {
            return Err(ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, format!("a batch of {} rows needs about {need} bytes, more than the memory budget of {budget}", batch.rows)));
        }
    }
    let mut worker = app.worker.clone().lock_owned().await;
    if let Some(budget) = app.config.memory_budget_bytes {
        // Only the allocators matter here; the slow process probes stay off this path.
        let sample = worker.pipeline.probes().sample_allocators(&leaklab_probe::MemorySample::default());
        let in_use = sample.cuda.map_or(sample.cpu.live_bytes, |c| c.allocated_bytes).max(0) as u64;
        if in_use + need > budget {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("memory budget exhausted: {in_use} of {budget} bytes in use, this batch needs about {need} more; retry later"),
            ));
        }
    }
    let (capacity, every, crash_after) = (app.config.sample_log_capacity, app.config.process_probe_every.max(1), app.config.crash_after);
    let (result, sample) = tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let result = worker.pipeline.infer(&batch);
        if crash_after.is_some_and(|n| worker.pipeline.requests() >= n) {
            eprintln!("leaklab-service: crashing on purpose after {} requests (LEAKLAB_CRASH_AFTER)", worker.pipeline.requests());
            std::process::abort();
        }
        let latency_us = started.elapsed().as_micros() as u64;
        let depth = if worker.pipeline.requests() % every == 0 { SampleDepth::Full } else { SampleDepth::Allocators };
        let sample = worker.pipeline.sample(latency_us, depth);
        if result.is_ok() && capacity > 0 {
            if worker.samples.len() == capacity {
                worker.samples.pop_front();
            }
            worker.samples.push_back(sample.clone());
        }
        (result, sample)
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("the inference worker failed: {e}")))?;
    app.metrics.record(&sample);
    let inference = result?;
    Ok(InferResponse { request: inference.request, variant: app.config.variant.to_string(), cached: inference.cached, outputs: inference.outputs })
}

async fn metrics(State(app): State<Arc<App>>) -> impl IntoResponse {
    let sample = {
        let mut worker = app.worker.lock().await;
        worker.pipeline.sample(0, SampleDepth::Full)
    };
    app.metrics.record(&sample);
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], app.metrics.encode())
}

/// `GET /debug/memory`: what the probes read now.
#[derive(Debug, Serialize, Deserialize)]
pub struct MemoryReport {
    pub variant: String,
    pub requests: u64,
    pub history_len: usize,
    pub cache_entries: usize,
    pub mean_output: f64,
    pub cuda_devices: usize,
    pub nvml: Option<String>,
    pub sample: RequestSample,
}

async fn memory(State(app): State<Arc<App>>) -> Json<MemoryReport> {
    let mut worker = app.worker.lock().await;
    let sample = worker.pipeline.sample(0, SampleDepth::Full);
    let p = &worker.pipeline;
    Json(MemoryReport {
        variant: app.config.variant.to_string(),
        requests: p.requests(),
        history_len: p.history_len(),
        cache_entries: p.cache_entries(),
        mean_output: p.mean_output(),
        cuda_devices: cuda::device_count(),
        nvml: p.probes().nvml_unavailable.clone(),
        sample,
    })
}

fn debug_enabled(app: &App) -> Result<(), ApiError> {
    if app.config.debug_endpoints {
        Ok(())
    } else {
        Err(ApiError::new(StatusCode::NOT_FOUND, "debug endpoints are off; start the service with --debug-endpoints"))
    }
}

#[derive(Debug, Deserialize)]
struct Since {
    since: Option<u64>,
}

/// `GET /debug/memory/samples?since=N`: the per-request samples after request N.
async fn samples(State(app): State<Arc<App>>, Query(q): Query<Since>) -> Result<Json<Vec<RequestSample>>, ApiError> {
    debug_enabled(&app)?;
    let since = q.since.unwrap_or(0);
    let worker = app.worker.lock().await;
    Ok(Json(worker.samples.iter().filter(|s| s.request > since).cloned().collect()))
}

/// `GET /debug/memory/snapshot`: the memory_viz pickle (CUDA allocator on CUDA, the counting
/// CPU allocator otherwise).
async fn memory_snapshot(State(app): State<Arc<App>>) -> Result<impl IntoResponse, ApiError> {
    debug_enabled(&app)?;
    let on_cuda = app.worker.lock().await.pipeline.probes().cuda_device().is_some();
    let bytes = tokio::task::spawn_blocking(move || if on_cuda { cuda::snapshot_pickle() } else { snapshot::cpu_snapshot_pickle() })
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok((
        [(header::CONTENT_TYPE, "application/octet-stream"), (header::CONTENT_DISPOSITION, "attachment; filename=\"memory_snapshot.pickle\"")],
        bytes,
    ))
}
