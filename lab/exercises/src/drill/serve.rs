//! The incident's service over HTTP, as the learner meets it: `POST /v1/infer` (the lab
//! service's request and answer bodies), `GET /metrics` (every memory probe, exact allocator
//! included, and the handler's own gauges), `GET /debug/memory/snapshot` (the memory_viz
//! pickle, each block with the native stack that allocated it) and `GET /healthz`.
//!
//! It binds loopback only. The handler runs on a blocking thread while holding the one worker
//! lock, so inference mode (thread-local) stays on one thread; a handler that panics answers
//! 500 and the service goes on.

use super::{Incident, Stats, FEATURES};
use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use leaklab_model::{Mlp, Scale};
use leaklab_probe::{cpu, snapshot, Nvml, Probes};
use leaklab_vocab::{ErrorBody, InferRequest, Probe};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

/// The most rows one request may carry.
pub const MAX_ROWS: usize = 1024;

/// The flags of `cargo xtask lab incident`, shared by the steps it runs (each takes its own).
#[derive(Debug, Clone, clap::Args)]
pub struct IncidentArgs {
    /// Start another incident, replacing lab/exercises/src/incident.rs.
    #[arg(long)]
    pub new: bool,
    /// Start the incident this seed picks (for instructors and tests).
    #[arg(long)]
    pub seed: Option<u64>,
    /// The loopback port to serve on (0: any free one).
    #[arg(long, default_value_t = 8100)]
    pub port: u16,
    /// Alloc/free events the snapshot's trace keeps.
    #[arg(long, default_value_t = 100_000)]
    pub history: usize,
}

/// What the learner reads when the incident's service is up: the page, the service, and the
/// instrument's commands with this service's address and PID filled in.
pub fn briefing(addr: SocketAddr) -> String {
    let root = super::workspace_root();
    let relative = |p: std::path::PathBuf| p.canonicalize().ok().and_then(|p| p.strip_prefix(&root).ok().map(|r| r.display().to_string())).unwrap_or_else(|| p.display().to_string());
    let leaklab = std::env::current_exe().map(|e| relative(e.with_file_name("leaklab"))).unwrap_or_else(|_| "leaklab".into());
    let traffic = relative(super::traffic_dir());
    let (pid, base) = (std::process::id(), format!("http://{addr}"));
    format!(
        "leaklab-incident listening on {base}

PAGE  inference-api: memory has climbed on every pod since the last deploy. Each pod has a
      16 GiB memory limit and takes about 40 requests a second. Will it run out, when, why?

  the service   POST {base}/v1/infer  {{\"inputs\": [[512 numbers], ...]}}   (pid {pid})
                GET  {base}/metrics    GET {base}/debug/memory/snapshot
  its handler   lab/exercises/src/incident.rs   (the file you fix)
  traffic       {traffic}/   ({n} request bodies captured from production)

In another terminal, at the repository's root:

  1. Is it a leak, how fast, and when does a pod run out?
     {leaklab} scan {base}/v1/infer --body {traffic} \\
         --header 'content-type: application/json' --vary --pid {pid} \\
         --metrics {base}/metrics --series 'leaklab_memory_bytes{{probe=\"cpu_allocator_live\"}}' \\
         --capacity 16GiB --rate 40 --snapshot {base}/debug/memory/snapshot
  2. Which lines hold it? (The scan's report names them; for the whole stacks:) a snapshot,
     more traffic (the scan again, with --requests 200), a second snapshot, the difference:
     curl -s {base}/debug/memory/snapshot -o before.pickle
     curl -s {base}/debug/memory/snapshot -o after.pickle
     {leaklab} snapshot diff before.pickle after.pickle --stacks
  3. Fix lab/exercises/src/incident.rs, then: cargo xtask lab check incident
     (Ctrl-C here and `cargo xtask lab incident` again serves your fixed copy, to scan it.)
  4. cargo xtask lab reveal    says what it was.

",
        n = super::traffic::CAPTURED
    )
}

struct Worker {
    handler: Box<dyn Incident>,
    model: Mlp,
}

struct App {
    worker: Arc<Mutex<Worker>>,
    probes: Probes,
}

#[derive(serde::Serialize)]
struct Answers {
    outputs: Vec<Vec<f32>>,
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(ErrorBody { error: message.into() })).into_response()
}

/// Serves `handler` on 127.0.0.1 until interrupted; `started` hears the bound address first.
pub fn run(handler: Box<dyn Incident>, args: &IncidentArgs, started: impl FnOnce(SocketAddr)) -> anyhow::Result<()> {
    cpu::install()?;
    cpu::record_history(args.history);
    let model = Mlp::new(Scale::Default.config(), tch::Device::Cpu);
    let app = Arc::new(App { worker: Arc::new(Mutex::new(Worker { handler, model })), probes: Probes::cpu() });
    let port = args.port;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port))).await?;
        started(listener.local_addr()?);
        let router = Router::new()
            .route("/v1/infer", post(infer))
            .route("/metrics", get(metrics))
            .route("/healthz", get(|| async { "ok\n" }))
            .route("/debug/memory/snapshot", get(memory_snapshot))
            .layer(DefaultBodyLimit::max(16 << 20))
            .with_state(app);
        axum::serve(listener, router).with_graceful_shutdown(async { tokio::signal::ctrl_c().await.ok(); }).await?;
        Ok(())
    })
}

/// Runs `work` with the worker on a blocking thread; a panic in the handler becomes a 500.
async fn with_worker<T: Send + 'static>(app: &App, work: impl FnOnce(&mut Worker) -> T + Send + 'static) -> Result<T, Response> {
    let worker = app.worker.clone();
    tokio::task::spawn_blocking(move || {
        let mut w = worker.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(&mut w)))
    })
    .await
    .map_err(|e| error(StatusCode::INTERNAL_SERVER_ERROR, format!("the worker failed: {e}")))?
    .map_err(|panic| {
        let why = panic.downcast_ref::<String>().cloned().or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default();
        error(StatusCode::INTERNAL_SERVER_ERROR, format!("the handler panicked: {}", why.lines().next().unwrap_or("")))
    })
}

async fn infer(State(app): State<Arc<App>>, body: Result<Json<InferRequest>, JsonRejection>) -> Response {
    let request = match body {
        Ok(Json(r)) => r,
        Err(e) => return error(e.status(), e.body_text()),
    };
    let rows = request.inputs.len();
    if rows == 0 || rows > MAX_ROWS {
        return error(StatusCode::UNPROCESSABLE_ENTITY, format!("`inputs` must hold 1 to {MAX_ROWS} rows; it holds {rows}"));
    }
    if let Some((i, row)) = request.inputs.iter().enumerate().find(|(_, r)| r.len() != FEATURES as usize) {
        return error(StatusCode::UNPROCESSABLE_ENTITY, format!("row {i} has {} values; the model takes {FEATURES}", row.len()));
    }
    let values: Vec<f32> = request.inputs.concat();
    match with_worker(&app, move |w| w.handler.handle(&w.model, rows, &values)).await {
        Ok(Ok(flat)) => {
            let width = flat.len() / rows;
            Json(Answers { outputs: flat.chunks(width.max(1)).map(<[f32]>::to_vec).collect() }).into_response()
        }
        Ok(Err(reason)) => error(StatusCode::UNPROCESSABLE_ENTITY, reason),
        Err(response) => response,
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProbeLabel {
    probe: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: String,
}

/// Prometheus text: `leaklab_memory_bytes{probe=...}` under the lab's probe names, and the
/// handler's gauges.
fn encode(memory: &leaklab_probe::MemorySample, stats: Stats) -> String {
    let mut registry = Registry::with_prefix("leaklab");
    let bytes = Family::<ProbeLabel, Gauge>::default();
    registry.register("memory_bytes", "Memory as each probe sees it (cpu_allocator_live is exact)", bytes.clone());
    for p in Probe::ALL {
        if let Some(v) = p.read(memory) {
            bytes.get_or_create(&ProbeLabel { probe: p.name().into() }).set(v);
        }
    }
    let requests = Family::<OutcomeLabel, Gauge>::default();
    registry.register("incident_requests", "Requests the handler served or refused", requests.clone());
    requests.get_or_create(&OutcomeLabel { outcome: "served".into() }).set(stats.served as i64);
    requests.get_or_create(&OutcomeLabel { outcome: "refused".into() }).set(stats.rejected as i64);
    let entries = Gauge::<i64>::default();
    registry.register("incident_cache_entries", "Answers in the answers cache", entries.clone());
    entries.set(stats.cache_entries as i64);
    for (name, help, value) in [("incident_mean_output", "Mean of every answer's mean", stats.mean_output), ("incident_drift_window_mean", "Mean of the recent answers' means (the drift monitor)", stats.recent_mean)] {
        let g = Gauge::<f64, AtomicU64>::default();
        g.set(value);
        registry.register(name, help, g);
    }
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry).expect("writing to a String cannot fail");
    out
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    let stats = match with_worker(&app, |w| w.handler.stats()).await {
        Ok(s) => s,
        Err(response) => return response,
    };
    let memory = app.probes.sample(Nvml::Skip);
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], encode(&memory, stats)).into_response()
}

async fn memory_snapshot() -> Response {
    match tokio::task::spawn_blocking(snapshot::cpu_snapshot_pickle).await {
        Ok(Ok(bytes)) => ([(header::CONTENT_TYPE, "application/octet-stream"), (header::CONTENT_DISPOSITION, "attachment; filename=\"memory_snapshot.pickle\"")], bytes).into_response(),
        Ok(Err(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}
