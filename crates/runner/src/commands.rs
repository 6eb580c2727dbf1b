//! One library call per `leaklab` subcommand of the lab (run-lab, soak, bench): the binary
//! parses flags into these plain structs and hands them over, and `leaklab_report::finish`
//! prints, writes and exits with what comes back.
//!
//! The service is another program (`leaklab-service`, which links libtorch); it is found next
//! to the running `leaklab`, or named with `--service` / `LEAKLAB_SERVICE`.

use crate::bench::{bench as run_bench, BenchOptions, BenchReport};
use crate::driver::{PythonTwin, RunOptions};
use crate::report::LabRun;
use crate::soak::{self, SoakReport};
use anyhow::{bail, Context, Result};
use leaklab_report::{Outcome, Report};
use leaklab_vocab::{Device, DeviceRequest, Scale, Variant};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

pub const SERVICE_VAR: &str = "LEAKLAB_SERVICE";
const SERVICE_EXE: &str = "leaklab-service";

/// The `leaklab-service` binary: `explicit`, else `$LEAKLAB_SERVICE`, else the one beside
/// the running executable (where cargo and the device bundle put it).
pub fn locate_service(explicit: Option<PathBuf>) -> Result<PathBuf> {
    let candidate = explicit
        .or_else(|| std::env::var_os(SERVICE_VAR).map(PathBuf::from))
        .or_else(|| std::env::current_exe().ok().and_then(|exe| exe.parent().map(|d| d.join(SERVICE_EXE))));
    match candidate {
        Some(path) if path.is_file() => Ok(path),
        Some(path) => bail!(
            "the lab's service binary is not at {}: build it with `cargo build --release -p leaklab-service` (cargo xtask run-lab does), or name it with --service or {SERVICE_VAR}",
            path.display()
        ),
        None => bail!("cannot tell where the lab's service binary is: name it with --service or {SERVICE_VAR}"),
    }
}

/// What `request` (cpu, cuda or auto) means on this machine, as the service binary (the one
/// that links libtorch) sees it. CUDA asked for and absent is its clear error, passed on.
pub fn resolve_device(service: &Path, request: DeviceRequest) -> Result<Device> {
    let out = Command::new(service).args(["device", "--device", request.name()]).output().with_context(|| format!("cannot run {}", service.display()))?;
    if !out.status.success() {
        bail!("{}", String::from_utf8_lossy(&out.stderr).trim().trim_start_matches("Error: "));
    }
    String::from_utf8_lossy(&out.stdout).trim().parse().map_err(anyhow::Error::msg)
}

/// `leaklab run-lab`.
pub struct LabCommand {
    pub service: Option<PathBuf>,
    /// All eight when empty.
    pub variants: Vec<Variant>,
    /// Default: 200, or 30 at the seed scale.
    pub requests: Option<usize>,
    /// Default: 20, or 5 at the seed scale.
    pub warmup: Option<usize>,
    pub concurrency: usize,
    pub scale: Scale,
    /// cpu, cuda or auto.
    pub device: DeviceRequest,
    /// Draw nothing on stderr (for `--json`).
    pub quiet: bool,
    pub memory_history: usize,
}

/// Runs the lab: every variant judged, with what each brought back for the charts and pickles.
pub fn run_lab(cmd: LabCommand) -> Result<LabRun> {
    let service = locate_service(cmd.service)?;
    let device = resolve_device(&service, cmd.device)?;
    let seed = cmd.scale == Scale::Seed;
    let options = RunOptions {
        service,
        scale: cmd.scale,
        device,
        warmup: cmd.warmup.unwrap_or(if seed { 5 } else { 20 }),
        requests: cmd.requests.unwrap_or(if seed { 30 } else { 200 }),
        concurrency: cmd.concurrency,
        memory_history_entries: cmd.memory_history,
        start_timeout: Duration::from_secs(180),
        twin: None,
        threads: None,
    };
    let variants = if cmd.variants.is_empty() { Variant::ALL.to_vec() } else { cmd.variants };
    if !cmd.quiet {
        eprintln!("leaklab: {} variants, {} warm-up + {} requests each, scale {}, device {device}", variants.len(), options.warmup, options.requests, options.scale.name());
    }
    Ok(runtime()?.block_on(crate::run_lab(&options, &variants, cmd.quiet)))
}

/// `leaklab soak`.
pub struct SoakCommand {
    pub service: Option<PathBuf>,
    /// The CI-sized run: 600 requests per variant at concurrency 8.
    pub short: bool,
    pub requests: Option<usize>,
    pub concurrency: Option<usize>,
    /// The fixed variants and baseline when empty.
    pub variants: Vec<Variant>,
    /// Draw nothing on stderr (for `--json`).
    pub quiet: bool,
}

/// Runs the soak: every variant's allocator slope, errors and latency drift.
pub fn soak(cmd: SoakCommand) -> Result<SoakReport> {
    let requests = cmd.requests.unwrap_or(if cmd.short { 600 } else { 100_000 });
    let options = RunOptions {
        service: locate_service(cmd.service)?,
        scale: Scale::Default,
        device: Device::Cpu,
        // The fixed cache (32 batches) is full well inside the warm-up.
        warmup: (requests / 10).clamp(50, 2000),
        requests,
        concurrency: cmd.concurrency.unwrap_or(if cmd.short { 8 } else { 16 }),
        memory_history_entries: 0,
        start_timeout: Duration::from_secs(180),
        twin: None,
        threads: None,
    };
    let variants = if cmd.variants.is_empty() { soak::VARIANTS.to_vec() } else { cmd.variants };
    if !cmd.quiet {
        eprintln!("leaklab soak: {} variants, {} warm-up + {} requests each at concurrency {}", variants.len(), options.warmup, options.requests, options.concurrency);
    }
    Ok(runtime()?.block_on(soak::soak(&options, &variants, cmd.quiet)))
}

/// `leaklab bench`.
pub struct BenchCommand {
    pub service: Option<PathBuf>,
    pub requests: usize,
    pub leak_requests: usize,
    pub concurrency: usize,
    pub threads: usize,
    /// The twin's python (default: $LEAKLAB_PYTHON, else python3).
    pub python: Option<PathBuf>,
    pub script: PathBuf,
    pub criterion_dir: PathBuf,
}

/// The HTTP side of the benchmarks beside criterion's figures (docs/benchmarks.md).
pub fn bench(cmd: BenchCommand) -> Result<BenchReport> {
    let service = locate_service(cmd.service)?;
    let weights_dir = tempfile::tempdir()?;
    let weights = weights_dir.path().join("default.safetensors");
    let status = Command::new(&service).args(["export-weights", "--scale", "default", "--out"]).arg(&weights).status()?;
    if !status.success() {
        bail!("{} export-weights failed ({status})", service.display());
    }
    let python = cmd.python.or_else(|| std::env::var_os("LEAKLAB_PYTHON").map(PathBuf::from)).unwrap_or_else(|| "python3".into());
    let threads = cmd.threads;
    let rust = RunOptions {
        service,
        scale: Scale::Default,
        device: Device::Cpu,
        warmup: 20,
        requests: cmd.requests,
        concurrency: cmd.concurrency,
        memory_history_entries: 0,
        start_timeout: Duration::from_secs(180),
        twin: None,
        threads: Some(threads),
    };
    let options = BenchOptions { rust, twin: PythonTwin { python, script: cmd.script, weights, threads }, criterion_dir: cmd.criterion_dir, leak_requests: cmd.leak_requests };
    eprintln!("leaklab bench: Rust and Python services, {} requests each at concurrency {}, {threads} torch threads", cmd.requests, cmd.concurrency);
    Ok(runtime()?.block_on(run_bench(&options)))
}

/// The command docs/benchmarks.md says it was produced by.
const BENCH_COMMAND: &str = "cargo xtask bench";

impl Report for BenchReport {
    /// Runs that failed leave figures missing: nothing to compare.
    fn outcome(&self) -> Outcome {
        if self.failures.is_empty() {
            Outcome::Pass
        } else {
            Outcome::CannotJudge
        }
    }

    fn text(&self) -> String {
        self.markdown(BENCH_COMMAND)
    }

    fn markdown(&self) -> String {
        self.markdown(BENCH_COMMAND)
    }

    fn problem(&self) -> Option<String> {
        (!self.failures.is_empty()).then(|| format!("{} runs failed: {}", self.failures.len(), self.failures.join("; ")))
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the async runtime")
}
