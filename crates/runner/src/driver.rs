//! Runs one variant: starts the service as its own process on a free loopback port, drives it
//! with a bounded load, collects its per-request samples and snapshot, and stops it.
//!
//! A service that dies mid-run is not the end of the lab: the run comes back with the reason
//! (exit status and the tail of its stderr) and the remaining variants go on.

use anyhow::{anyhow, bail, Context, Result};
use leaklab_report::progress::ProgressBar;
use leaklab_vocab::{synthetic_request, Device, RequestSample, Scale, Variant};
use serde::{Deserialize, Serialize};
use std::io::{Read, Seek};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::Semaphore;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunOptions {
    /// The `leaklab-service` binary, whose `serve` subcommand is the service.
    pub service: PathBuf,
    pub scale: Scale,
    pub device: Device,
    pub warmup: usize,
    pub requests: usize,
    pub concurrency: usize,
    /// Alloc/free events the service records for its memory_viz snapshot (0: no snapshot).
    pub memory_history_entries: usize,
    /// Longest wait for a service to start.
    pub start_timeout: Duration,
    /// Run the Python twin (lab/python/twin_service.py) instead of the Rust service.
    pub twin: Option<PythonTwin>,
    /// Torch threads for the Rust service (default: libtorch's choice).
    pub threads: Option<usize>,
    /// glibc's arenas for the Rust service (`MALLOC_ARENA_MAX`; default: glibc's choice).
    pub malloc_arenas: Option<usize>,
}

/// How to start the Python twin of the service.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PythonTwin {
    pub python: PathBuf,
    pub script: PathBuf,
    /// Weights exported from the Rust model (`leaklab export-weights`).
    pub weights: PathBuf,
    pub threads: usize,
}

impl RunOptions {
    pub fn total_requests(&self) -> usize {
        self.warmup + self.requests
    }
}

/// What a run of one variant brought back.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VariantRun {
    pub variant: Variant,
    pub samples: Vec<RequestSample>,
    #[serde(skip)]
    pub snapshot: Option<Vec<u8>>,
    pub errors: u64,
    /// Seconds spent sending requests (start-up and collection excluded).
    pub load_seconds: f64,
    /// Client-side latency of each request, in the order they were sent (µs).
    pub latencies_us: Vec<u64>,
    pub seconds: f64,
    /// Why the run could not finish, when it could not.
    pub failure: Option<String>,
}

struct ServiceProcess {
    child: Child,
    base: String,
    stderr: std::fs::File,
}

impl ServiceProcess {
    async fn start(options: &RunOptions, variant: Variant) -> Result<ServiceProcess> {
        let stderr = tempfile::tempfile()?;
        let mut command = match &options.twin {
            None => {
                let mut c = Command::new(&options.service);
                c.args([
                    "serve",
                    "--variant",
                    variant.name(),
                    "--scale",
                    options.scale.name(),
                    "--device",
                    options.device.name(),
                ])
                .args(["--host", "127.0.0.1", "--port", "0", "--debug-endpoints"])
                .args([
                    "--memory-history",
                    &options.memory_history_entries.to_string(),
                ])
                .args(["--max-batch", &variant.max_rows(options.scale).to_string()]);
                if let Some(n) = options.threads {
                    c.args(["--threads", &n.to_string()]);
                }
                if let Some(n) = options.malloc_arenas {
                    c.env("MALLOC_ARENA_MAX", n.to_string());
                }
                c
            }
            Some(twin) => {
                let mut c = Command::new(&twin.python);
                c.arg(&twin.script)
                    .args([
                        "--variant",
                        variant.name(),
                        "--port",
                        "0",
                        "--threads",
                        &twin.threads.to_string(),
                    ])
                    .arg("--weights")
                    .arg(&twin.weights);
                c
            }
        };
        // The service must not outlive the lab, even when the lab is killed outright.
        // SAFETY: prctl is async-signal-safe, and nothing else runs between fork and exec.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let program = command.as_std().get_program().to_owned();
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr.try_clone()?)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", PathBuf::from(program).display()))?;
        let mut lines = BufReader::new(child.stdout.take().expect("stdout is piped")).lines();
        // The service prints its address once it listens; the lab asked for port 0.
        let address = tokio::time::timeout(options.start_timeout, async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(url) = line.split("listening on ").nth(1) {
                    return Some(url.trim().to_string());
                }
            }
            None
        })
        .await;
        // Keep draining stdout so the service never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let mut process = ServiceProcess {
            child,
            base: String::new(),
            stderr,
        };
        match address {
            Ok(Some(base)) => {
                process.base = base;
                Ok(process)
            }
            _ => {
                let reason = process
                    .exit_reason()
                    .await
                    .unwrap_or_else(|| format!("no address after {:?}", options.start_timeout));
                process.kill().await;
                bail!("the service did not start: {reason}")
            }
        }
    }

    /// If the process has exited, or exits within a moment (a request can fail while a dying
    /// process is still being torn down): its status and the last lines it wrote to stderr.
    async fn exit_reason(&mut self) -> Option<String> {
        let status = tokio::time::timeout(Duration::from_secs(3), self.child.wait())
            .await
            .ok()?
            .ok()?;
        let mut text = String::new();
        let _ = self.stderr.rewind();
        let _ = self.stderr.read_to_string(&mut text);
        let tail: Vec<&str> = text
            .lines()
            .rev()
            .take(5)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        Some(format!(
            "service exited ({status}); stderr: {}",
            if tail.is_empty() {
                "(empty)".to_string()
            } else {
                tail.join(" | ")
            }
        ))
    }

    async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// SIGTERM, a few seconds for a graceful exit, then SIGKILL.
    async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            // SAFETY: signalling our own child by its pid.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            self.kill().await;
        }
    }
}

/// Runs `variant` to the end, or to the point where its service died.
pub async fn run_variant(
    options: &RunOptions,
    variant: Variant,
    progress: &ProgressBar,
) -> VariantRun {
    let started = Instant::now();
    let mut run = VariantRun {
        variant,
        samples: Vec::new(),
        snapshot: None,
        errors: 0,
        load_seconds: 0.0,
        latencies_us: Vec::new(),
        seconds: 0.0,
        failure: None,
    };
    let mut service = match ServiceProcess::start(options, variant).await {
        Ok(s) => s,
        Err(e) => {
            run.failure = Some(format!("{e:#}"));
            return run;
        }
    };
    let client = reqwest::Client::new();
    let load_started = Instant::now();
    let driven = drive(options, variant, &client, &service.base, progress).await;
    run.load_seconds = load_started.elapsed().as_secs_f64();
    match driven {
        Ok((errors, latencies)) => {
            run.errors = errors;
            run.latencies_us = latencies;
        }
        Err(e) => {
            run.failure = Some(
                service
                    .exit_reason()
                    .await
                    .unwrap_or_else(|| format!("{e:#}")),
            );
            return run;
        }
    }
    match collect(
        &client,
        &service.base,
        options.memory_history_entries > 0 && options.twin.is_none(),
    )
    .await
    {
        Ok((samples, snapshot)) => {
            run.samples = samples;
            run.snapshot = snapshot;
        }
        Err(e) => {
            run.failure = Some(
                service
                    .exit_reason()
                    .await
                    .unwrap_or_else(|| format!("{e:#}")),
            )
        }
    }
    service.stop().await;
    run.seconds = started.elapsed().as_secs_f64();
    run
}

/// Sends `warmup + requests` distinct requests, `concurrency` at a time, each of the rows
/// `variant` asks for. Answers other than 200 are counted; a transport error (the service is
/// gone) ends the run. Returns the error count and each request's latency as the client saw it.
async fn drive(
    options: &RunOptions,
    variant: Variant,
    client: &reqwest::Client,
    base: &str,
    progress: &ProgressBar,
) -> Result<(u64, Vec<u64>)> {
    let url = format!("{base}/v1/infer");
    let permits = Arc::new(Semaphore::new(options.concurrency.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    let (scale, features) = (options.scale, options.scale.config().input as usize);
    let mut errors = 0;
    let mut latencies = Vec::with_capacity(options.total_requests());
    for index in 0..options.total_requests() as u64 {
        let permit = permits
            .clone()
            .acquire_owned()
            .await
            .expect("semaphore open");
        let (client, url) = (client.clone(), url.clone());
        let rows = variant.rows(scale, index);
        tasks.spawn(async move {
            let body = serde_json::to_vec(&synthetic_request(index, rows, features))
                .expect("serialisable");
            let sent = Instant::now();
            let response = client
                .post(&url)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await;
            let ok = match response {
                Ok(r) => Ok(r.status().is_success() && r.bytes().await.is_ok()),
                Err(e) => Err(e),
            };
            drop(permit);
            ok.map(|ok| (index, ok, sent.elapsed().as_micros() as u64))
        });
        while let Some(done) = tasks.try_join_next() {
            settle(done?, progress, &mut errors, &mut latencies)?;
        }
    }
    while let Some(done) = tasks.join_next().await {
        settle(done?, progress, &mut errors, &mut latencies)?;
    }
    latencies.sort_unstable();
    Ok((errors, latencies.into_iter().map(|(_, us)| us).collect()))
}

fn settle(
    result: reqwest::Result<(u64, bool, u64)>,
    progress: &ProgressBar,
    errors: &mut u64,
    latencies: &mut Vec<(u64, u64)>,
) -> Result<()> {
    progress.inc(1);
    let (index, ok, us) = result.map_err(|e| anyhow!("request failed: {e}"))?;
    *errors += u64::from(!ok);
    latencies.push((index, us));
    Ok(())
}

async fn collect(
    client: &reqwest::Client,
    base: &str,
    snapshot: bool,
) -> Result<(Vec<RequestSample>, Option<Vec<u8>>)> {
    let mut samples: Vec<RequestSample> = client
        .get(format!("{base}/debug/memory/samples"))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    samples.sort_by_key(|s| s.request);
    let snapshot = if snapshot {
        Some(
            client
                .get(format!("{base}/debug/memory/snapshot"))
                .send()
                .await?
                .error_for_status()?
                .bytes()
                .await?
                .to_vec(),
        )
    } else {
        None
    };
    Ok((samples, snapshot))
}
