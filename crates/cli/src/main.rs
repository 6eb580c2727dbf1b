//! The `leaklab` binary: thin over the library crates.
//!
//! - `leaklab serve --variant refs-leaky`: the inference service for one variant.
//! - `leaklab run-lab`: every variant run as a `serve` process of this same binary, judged and
//!   written up (what `cargo xtask run-lab` calls).

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use leaklab_lab::RunOptions;
use leaklab_model::Scale;
use leaklab_service::{DeviceChoice, PipelineConfig, ServiceConfig, Variant};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser)]
#[command(name = "leaklab", version, about = "Reproduce, detect, explain and fix the memory leaks of PyTorch inference services")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve one variant over HTTP.
    Serve(ServeArgs),
    /// Run every variant under load, judge it and write the report.
    RunLab(RunLabArgs),
    /// Sustained load against the fixed variants and the baseline.
    Soak(SoakArgs),
    /// The HTTP side of the benchmarks (Rust against the Python twin) and docs/benchmarks.md.
    Bench(BenchArgs),
    /// Write the model's weights as safetensors (plus its shapes as JSON), for the Python twin.
    ExportWeights(ExportArgs),
}

#[derive(Args)]
struct ExportArgs {
    #[arg(long, default_value = "default", value_parser = parse_scale)]
    scale: Scale,
    /// Output file, ending in .safetensors; the shapes go to <file>.json.
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args)]
struct BenchArgs {
    /// Requests for each throughput run (Rust, then Python).
    #[arg(long, default_value_t = 2000)]
    requests: usize,
    /// Requests for each leak cross-check run.
    #[arg(long, default_value_t = 150)]
    leak_requests: usize,
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// Torch threads, the same for both services and for the criterion groups' raw forward, so
    /// that "service / raw forward" and "Rust / Python" compare like with like.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// The python of the twin (default: $LEAKLAB_PYTHON, else python3).
    #[arg(long)]
    python: Option<PathBuf>,
    #[arg(long, default_value = "lab/python/twin_service.py")]
    script: PathBuf,
    #[arg(long, default_value = "target/criterion")]
    criterion_dir: PathBuf,
    #[arg(long, default_value = "docs/benchmarks.md")]
    out: PathBuf,
}

#[derive(Args)]
struct SoakArgs {
    /// The CI-sized run: 600 requests per variant at concurrency 8.
    #[arg(long)]
    short: bool,
    /// Requests per variant (default 100000, or 600 with --short).
    #[arg(long)]
    requests: Option<usize>,
    /// Concurrent clients (default 16, or 8 with --short).
    #[arg(long)]
    concurrency: Option<usize>,
    /// Variants (repeat); the fixed ones and baseline when absent.
    #[arg(long = "variant", value_parser = parse_variant)]
    variants: Vec<Variant>,
    #[arg(long, default_value = "target/leaklab/soak")]
    out: PathBuf,
    /// Print the results as JSON and nothing else.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, ValueEnum)]
enum DeviceArg {
    Cpu,
    Cuda,
    /// CUDA when a device is visible, else CPU.
    Auto,
}

impl DeviceArg {
    fn resolve(self) -> Result<DeviceChoice> {
        let available = leaklab_probe::cuda::is_available();
        match self {
            DeviceArg::Cpu => Ok(DeviceChoice::Cpu),
            DeviceArg::Auto => Ok(if available { DeviceChoice::Cuda } else { DeviceChoice::Cpu }),
            DeviceArg::Cuda if available => Ok(DeviceChoice::Cuda),
            DeviceArg::Cuda => bail!("CUDA not available: no CUDA device is visible to this process (use --device cpu or auto)"),
        }
    }
}

fn parse_scale(s: &str) -> Result<Scale, String> {
    s.parse()
}

fn parse_variant(s: &str) -> Result<Variant, String> {
    s.parse()
}

#[derive(Args)]
struct ServeArgs {
    /// graph-leaky, graph-fixed, refs-leaky, refs-fixed, cache-leaky, cache-fixed, baseline or seed.
    #[arg(long, value_parser = parse_variant)]
    variant: Variant,
    /// default (CPU-sized) or seed (the reference scenario, about 50 MB per leaky request).
    #[arg(long, default_value = "default", value_parser = parse_scale)]
    scale: Scale,
    #[arg(long, value_enum, default_value = "cpu")]
    device: DeviceArg,
    /// Address to bind; loopback unless you mean to expose it.
    #[arg(long, default_value = "127.0.0.1")]
    host: std::net::IpAddr,
    /// Port to bind; 0 picks a free one (the chosen address is printed).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Serve /debug/memory/samples and /debug/memory/snapshot.
    #[arg(long)]
    debug_endpoints: bool,
    /// Alloc/free events to record for the snapshot (with --debug-endpoints).
    #[arg(long, default_value_t = 0)]
    memory_history: usize,
    /// Most rows per request.
    #[arg(long, default_value_t = 1024)]
    max_batch: usize,
    /// Byte bound of the fixed feature cache (default: 32 batches' worth).
    #[arg(long)]
    cache_bytes: Option<usize>,
    /// Torch intra-op threads (default: libtorch's choice, one per core).
    #[arg(long)]
    threads: Option<i32>,
    /// Seconds before a request is answered 408.
    #[arg(long, default_value_t = 30)]
    timeout_secs: u64,
    /// Memory budget in bytes: requests that would not fit are refused (413/503) before allocating.
    #[arg(long)]
    memory_budget: Option<u64>,
}

impl ServeArgs {
    fn config(&self) -> Result<ServiceConfig> {
        let device = self.device.resolve()?;
        let model = self.scale.config();
        let mut pipeline = PipelineConfig::new(model, device);
        pipeline.cache_capacity_bytes = self.cache_bytes.unwrap_or(32 * model.input_bytes(self.scale.batch()) as usize);
        let mut config = ServiceConfig::new(self.variant, pipeline);
        config.max_batch = self.max_batch;
        config.body_limit_bytes = config.body_limit_bytes.max(self.max_batch * model.input as usize * 24);
        config.debug_endpoints = self.debug_endpoints;
        config.memory_history_entries = self.memory_history;
        config.request_timeout = Duration::from_secs(self.timeout_secs);
        config.memory_budget_bytes = self.memory_budget;
        // Fault injection for the lab's tests: `LEAKLAB_CRASH_AFTER=refs-leaky:15`.
        if let Ok(spec) = std::env::var("LEAKLAB_CRASH_AFTER") {
            if let Some((variant, n)) = spec.split_once(':') {
                if variant == self.variant.name() {
                    config.crash_after = Some(n.parse().context("LEAKLAB_CRASH_AFTER=<variant>:<requests>")?);
                }
            }
        }
        Ok(config)
    }
}

#[derive(Args)]
struct RunLabArgs {
    /// Variants to run (repeat the flag); all eight when absent.
    #[arg(long = "variant", value_parser = parse_variant)]
    variants: Vec<Variant>,
    /// Measured requests per variant (default: 200, or 30 at the seed scale).
    #[arg(long)]
    requests: Option<usize>,
    /// Warm-up requests per variant, not judged (default: 20, or 5 at the seed scale).
    #[arg(long)]
    warmup: Option<usize>,
    #[arg(long, default_value_t = 2)]
    concurrency: usize,
    #[arg(long, default_value = "default", value_parser = parse_scale)]
    scale: Scale,
    #[arg(long, value_enum, default_value = "auto")]
    device: DeviceArg,
    /// Report folder.
    #[arg(long, default_value = "target/leaklab")]
    out: PathBuf,
    /// Print the report as JSON and nothing else.
    #[arg(long)]
    json: bool,
    /// Alloc/free events each service records for its memory_viz snapshot.
    #[arg(long, default_value_t = 20_000)]
    memory_history: usize,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => {
            if let Some(n) = args.threads {
                tch::set_num_threads(n);
            }
            let config = args.config()?;
            let addr = std::net::SocketAddr::new(args.host, args.port);
            runtime()?.block_on(leaklab_service::serve(config, addr))
        }
        Command::RunLab(args) => run_lab(args),
        Command::Soak(args) => soak(args),
        Command::Bench(args) => bench(args),
        Command::ExportWeights(args) => export_weights(&args.out, args.scale),
    }
}

fn export_weights(out: &std::path::Path, scale: Scale) -> Result<()> {
    let config = scale.config();
    let model = leaklab_model::Mlp::new(config, tch::Device::Cpu);
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    model.save_safetensors(out).with_context(|| format!("cannot write {}", out.display()))?;
    let mut shapes = serde_json::to_value(config)?;
    shapes["batch"] = scale.batch().into();
    std::fs::write(format!("{}.json", out.display()), serde_json::to_vec_pretty(&shapes)?)?;
    Ok(())
}

fn bench(args: BenchArgs) -> Result<()> {
    let threads = args.threads;
    let weights_dir = tempfile::tempdir()?;
    let weights = weights_dir.path().join("default.safetensors");
    export_weights(&weights, Scale::Default)?;
    let python = args.python.or_else(|| std::env::var_os("LEAKLAB_PYTHON").map(PathBuf::from)).unwrap_or_else(|| "python3".into());
    let rust = RunOptions {
        exe: std::env::current_exe()?,
        scale: Scale::Default,
        device: "cpu".into(),
        warmup: 20,
        requests: args.requests,
        concurrency: args.concurrency,
        memory_history_entries: 0,
        start_timeout: Duration::from_secs(180),
        twin: None,
        threads: Some(threads),
    };
    let options = leaklab_lab::bench::BenchOptions {
        rust,
        twin: leaklab_lab::PythonTwin { python, script: args.script, weights, threads },
        criterion_dir: args.criterion_dir,
        leak_requests: args.leak_requests,
    };
    eprintln!("leaklab bench: Rust and Python services, {} requests each at concurrency {}, {threads} torch threads", args.requests, args.concurrency);
    let report = runtime()?.block_on(leaklab_lab::bench::bench(&options));
    let command = "cargo xtask bench";
    report.write(&args.out, command)?;
    print!("{}", report.markdown(command));
    if !report.failures.is_empty() {
        bail!("{} runs failed: {}", report.failures.len(), report.failures.join("; "));
    }
    Ok(())
}

fn soak(args: SoakArgs) -> Result<()> {
    let requests = args.requests.unwrap_or(if args.short { 600 } else { 100_000 });
    let options = RunOptions {
        exe: std::env::current_exe()?,
        scale: Scale::Default,
        device: "cpu".into(),
        // The fixed cache (32 batches) is full well inside the warm-up.
        warmup: (requests / 10).clamp(50, 2000),
        requests,
        concurrency: args.concurrency.unwrap_or(if args.short { 8 } else { 16 }),
        memory_history_entries: 0,
        start_timeout: Duration::from_secs(180),
        twin: None,
        threads: None,
    };
    let variants = if args.variants.is_empty() { leaklab_lab::soak::VARIANTS.to_vec() } else { args.variants };
    if !args.json {
        eprintln!("leaklab soak: {} variants, {} warm-up + {} requests each at concurrency {}", variants.len(), options.warmup, options.requests, options.concurrency);
    }
    let results = runtime()?.block_on(leaklab_lab::soak::soak(&options, &variants, args.json));
    leaklab_lab::soak::write(&args.out, &results)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    } else {
        println!("{}", leaklab_lab::soak::table(&results));
        println!("written to {}/soak.md", args.out.display());
    }
    if !results.iter().all(|r| r.passed) {
        std::process::exit(1);
    }
    Ok(())
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the async runtime")
}

fn run_lab(args: RunLabArgs) -> Result<()> {
    let device = args.device.resolve()?;
    let seed = args.scale == Scale::Seed;
    let options = RunOptions {
        exe: std::env::current_exe()?,
        scale: args.scale,
        device: match device {
            DeviceChoice::Cpu => "cpu".into(),
            DeviceChoice::Cuda => "cuda".into(),
        },
        warmup: args.warmup.unwrap_or(if seed { 5 } else { 20 }),
        requests: args.requests.unwrap_or(if seed { 30 } else { 200 }),
        concurrency: args.concurrency,
        memory_history_entries: args.memory_history,
        start_timeout: Duration::from_secs(180),
        twin: None,
        threads: None,
    };
    let variants = if args.variants.is_empty() { Variant::ALL.to_vec() } else { args.variants.clone() };
    if !args.json {
        eprintln!(
            "leaklab: {} variants, {} warm-up + {} requests each, scale {}, device {}",
            variants.len(),
            options.warmup,
            options.requests,
            options.scale.name(),
            options.device
        );
    }
    let (runs, report) = runtime()?.block_on(leaklab_lab::run_lab(&options, &variants, args.json));
    report.write(&args.out, &runs).with_context(|| format!("cannot write the report to {}", args.out.display()))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{}", report.table());
        println!("\nreport: {}/report.md ({:.1} s)", args.out.display(), report.seconds);
    }
    if !report.passed {
        std::process::exit(1);
    }
    Ok(())
}
