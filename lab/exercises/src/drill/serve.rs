//! The incident's service over HTTP, as the learner meets it: the lab service's own HTTP layer
//! (`leaklab_service::http`) serving the incident's handler, so the drill answers exactly as
//! the service does: `POST /v1/infer` (the same request and answer bodies, validation and
//! error bodies), `GET /metrics` (every memory probe, exact allocator included, and the
//! handler's own gauges), `GET /debug/memory/snapshot` (the memory_viz pickle, each block with
//! the native stack that allocated it), `GET /debug/memory` and `GET /healthz`.
//!
//! It binds loopback only. The handler runs on a blocking thread while holding the one worker
//! lock, so inference mode (thread-local) stays on one thread; a handler that panics answers
//! 500 and the service goes on.

use super::{Incident, Stats};
use leaklab_model::{Mlp, ModelConfig, Scale};
use leaklab_probe::{cpu, Probes};
use leaklab_service::api::{Batch, InferError, Inference};
use leaklab_service::metrics::OwnGauge;
use leaklab_service::{App, Handler, HttpConfig, SampleDepth, Sampler};
use leaklab_vocab::{Probe, RequestSample, StageBytes};
use std::net::SocketAddr;

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
    let relative = |p: std::path::PathBuf| {
        p.canonicalize()
            .ok()
            .and_then(|p| p.strip_prefix(&root).ok().map(|r| r.display().to_string()))
            .unwrap_or_else(|| p.display().to_string())
    };
    let leaklab = std::env::current_exe()
        .map(|e| relative(e.with_file_name("leaklab")))
        .unwrap_or_else(|_| "leaklab".into());
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
         --metrics {base}/metrics --series 'leaklab_memory_bytes{{probe=\"{exact}\"}}' \\
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
        n = super::traffic::CAPTURED,
        exact = Probe::CpuAllocator.name()
    )
}

/// An incident's handler behind the service's HTTP layer.
pub struct IncidentHandler {
    incident: Box<dyn Incident>,
    model: Mlp,
    sampler: Sampler,
    requests: u64,
}

impl IncidentHandler {
    /// `incident`'s handler over the lab model (built here, on the CPU).
    pub fn new(incident: Box<dyn Incident>) -> anyhow::Result<IncidentHandler> {
        cpu::install()?;
        Ok(IncidentHandler {
            incident,
            model: Mlp::new(Scale::Default.config(), tch::Device::Cpu),
            sampler: Sampler::new(Probes::cpu()),
            requests: 0,
        })
    }
}

impl Handler for IncidentHandler {
    type State = Stats;

    /// Every incident's service is called this: the name gives nothing away.
    fn name(&self) -> &'static str {
        "incident"
    }

    fn model(&self) -> ModelConfig {
        Scale::Default.config()
    }

    fn infer(&mut self, batch: &Batch) -> Result<Inference, InferError> {
        // A cached answer is one the handler gave without running the model.
        let before = self.model.forward_calls();
        let flat = self
            .incident
            .handle(&self.model, batch.rows, &batch.values)
            .map_err(InferError::Refused)?;
        let cached = self.model.forward_calls() == before;
        self.requests += 1;
        let width = (flat.len() / batch.rows).max(1);
        Ok(Inference {
            request: self.requests,
            outputs: flat.chunks(width).map(<[f32]>::to_vec).collect(),
            cached,
        })
    }

    fn requests(&self) -> u64 {
        self.requests
    }

    fn probes(&self) -> &Probes {
        self.sampler.probes()
    }

    fn sample(&mut self, latency_us: u64, depth: SampleDepth) -> RequestSample {
        // The handler runs in no stage context: every byte it keeps is in the default one.
        RequestSample {
            request: self.requests,
            latency_us,
            stage_live_bytes: StageBytes::default(),
            memory: self.sampler.memory(depth),
        }
    }

    fn stages(&self) -> bool {
        false
    }

    fn state(&self) -> Stats {
        self.incident.stats()
    }

    fn gauges(&self) -> Vec<OwnGauge> {
        let s = self.incident.stats();
        vec![
            OwnGauge {
                name: "incident_served",
                help: "Requests the handler answered",
                value: s.served as f64,
            },
            OwnGauge {
                name: "incident_refused",
                help: "Requests the handler refused",
                value: s.rejected as f64,
            },
            OwnGauge {
                name: "incident_cache_entries",
                help: "Answers in the answers cache",
                value: s.cache_entries as f64,
            },
            OwnGauge {
                name: "incident_mean_output",
                help: "Mean of every answer's mean",
                value: s.mean_output,
            },
            OwnGauge {
                name: "incident_drift_window_mean",
                help: "Mean of the recent answers' means (the drift monitor)",
                value: s.recent_mean,
            },
        ]
    }
}

/// How the drill serves: the service's defaults, with the snapshot route on and the allocation
/// history it needs recorded.
pub fn http_config(history: usize) -> HttpConfig {
    let mut config = HttpConfig::new(Scale::Default.config());
    config.debug_endpoints = true;
    config.memory_history_entries = history;
    config
}

/// Serves `incident` on 127.0.0.1 until interrupted; `started` hears the bound address first.
pub fn run(
    incident: Box<dyn Incident>,
    args: &IncidentArgs,
    started: impl FnOnce(SocketAddr),
) -> anyhow::Result<()> {
    let app = App::new(IncidentHandler::new(incident)?, http_config(args.history))?;
    // One worker serves the inference at a time (its handler is behind a mutex), so blocking
    // threads beyond two only wait; tokio's default pool (512) starts more when the machine is
    // loaded, and each new thread's glibc arena shows as steps of its own in the anonymous
    // memory (CI read the bounded-cache incident's threads 8 → 10 and a +3.6 MB step as growth,
    // in 2 of 4 full runs on 2026-12-06).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(leaklab_service::serve_app(
        app,
        SocketAddr::from(([127, 0, 0, 1], args.port)),
        started,
    ))
}
