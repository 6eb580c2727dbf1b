//! `leaklab scan URL`'s flags as plain data, and the one call the binary makes: the flags
//! checked against each other, the signals opened (a bad PID, cgroup or series is said before
//! any load), the bodies read, and the scan run on its own runtime.

use crate::signals::Signal;
use crate::verdict::Budget;
use crate::{load, scan, ScanOptions, ScanReport, Target};
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Every flag of `leaklab scan URL`, as given (`leaklab scan --help` says what each means).
pub struct ScanCommand {
    pub url: String,
    /// Files, folders of files, or `-` for stdin, cycled.
    pub bodies: Vec<String>,
    pub method: reqwest::Method,
    pub vary: Option<u64>,
    pub requests: usize,
    pub warmup: usize,
    pub until_confident: bool,
    pub max_requests: usize,
    pub concurrency: usize,
    /// Requests a second at the most, sent on a steady clock.
    pub pace: Option<f64>,
    pub time_limit: Duration,
    pub max_error_ratio: f64,
    /// Trust, credentials, headers and the request timeout.
    pub http: leaklab_client::ClientOptions,
    pub pid: Option<u32>,
    pub cgroup: Option<PathBuf>,
    pub gpu: bool,
    pub metrics: Option<String>,
    pub series: Vec<String>,
    pub snapshot: Option<String>,
    pub agent: Option<String>,
    pub capacity: Option<u64>,
    /// Requests per second in production.
    pub rate: f64,
    pub fail_if_oom_within: Duration,
    /// Draw nothing on stderr (for `--json`).
    pub quiet: bool,
}

impl ScanCommand {
    /// The signals the flags name, each opened once: what cannot be watched is said now.
    fn signals(&self) -> Result<Vec<Signal>> {
        let mut signals = Vec::new();
        if let Some(pid) = self.pid {
            signals.push(Signal::Process { pid });
            if self.gpu {
                signals.push(Signal::gpu(pid)?);
            }
        } else if self.gpu {
            bail!("--gpu watches a process: give its --pid too");
        }
        if let Some(dir) = &self.cgroup {
            signals.push(Signal::cgroup(dir)?);
        }
        match (&self.metrics, self.series.is_empty()) {
            (Some(url), false) => signals.push(Signal::Metrics { url: url.clone(), series: self.series.clone(), client: self.http.build()? }),
            (Some(_), true) => bail!("--metrics needs the series to read: --series process_resident_memory_bytes (repeat for more)"),
            (None, false) => bail!("--series reads from a metrics endpoint: give --metrics URL too"),
            (None, true) => {}
        }
        Ok(signals)
    }
}

/// `leaklab scan URL`: checks the flags, opens the signals and scans.
pub fn run(cmd: ScanCommand) -> Result<ScanReport> {
    let options = ScanOptions {
        signals: cmd.signals()?,
        target: Arc::new(Target { url: cmd.url, method: cmd.method, bodies: load::read_bodies(&cmd.bodies)?, vary: cmd.vary }),
        warmup: cmd.warmup,
        requests: cmd.requests,
        max_requests: cmd.max_requests.max(cmd.warmup + cmd.requests),
        until_confident: cmd.until_confident,
        concurrency: cmd.concurrency,
        pace: cmd.pace,
        http: cmd.http,
        time_limit: cmd.time_limit,
        max_error_ratio: cmd.max_error_ratio,
        capacity: cmd.capacity,
        budget: Budget { steps_per_second: cmd.rate, seconds: cmd.fail_if_oom_within.as_secs_f64() },
        quiet: cmd.quiet,
        snapshot_url: cmd.snapshot,
        agent_url: cmd.agent,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the async runtime")?;
    runtime.block_on(scan(&options))
}
