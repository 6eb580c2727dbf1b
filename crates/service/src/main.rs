//! `leaklab-service`: the inference service of the lab, one variant per process. Thin: each
//! subcommand is its flags and one library call.
//!
//! - `leaklab-service serve --variant refs-leaky`: serve over HTTP (what run-lab starts).
//! - `leaklab-service device --device auto`: print the device that choice resolves to here.
//! - `leaklab-service export-weights --out w.safetensors`: the model's weights for the Python twin.

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use leaklab_service::{resolve_device, DeviceRequest, ServiceConfig};
use leaklab_vocab::{Scale, Variant};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "leaklab-service",
    version,
    about = "The lab's tch inference service, one variant per process"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve one variant over HTTP.
    Serve(ServeArgs),
    /// Print the device a `--device` choice resolves to on this machine (cpu or cuda).
    Device {
        #[arg(long, default_value = "auto")]
        device: DeviceRequest,
    },
    /// Write the model's weights as safetensors (plus its shapes as JSON), for the Python twin.
    ExportWeights {
        #[arg(long, default_value = "default")]
        scale: Scale,
        /// Output file, ending in .safetensors; the shapes go to <file>.json.
        #[arg(long)]
        out: PathBuf,
    },
}

#[derive(Args)]
struct ServeArgs {
    /// graph-leaky, graph-fixed, refs-leaky, refs-fixed, cache-leaky, cache-fixed, baseline or seed.
    #[arg(long)]
    variant: Variant,
    /// default (CPU-sized) or seed (the reference scenario, about 50 MB per leaky request).
    #[arg(long, default_value = "default")]
    scale: Scale,
    /// cpu, cuda, or auto (CUDA when a device is visible).
    #[arg(long, default_value = "cpu")]
    device: DeviceRequest,
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

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Serve(args) => serve(args),
        Command::Device { device } => {
            println!("{}", resolve_device(device)?);
            Ok(())
        }
        Command::ExportWeights { scale, out } => leaklab_model::export_weights(&out, scale)
            .with_context(|| format!("cannot export to {}", out.display())),
    }
}

fn serve(args: ServeArgs) -> Result<()> {
    if let Some(n) = args.threads {
        tch::set_num_threads(n);
    }
    let mut config =
        ServiceConfig::for_scale(args.variant, args.scale, resolve_device(args.device)?)
            .with_max_batch(args.max_batch);
    if let Some(bytes) = args.cache_bytes {
        config.pipeline.cache_capacity_bytes = bytes;
    }
    config.http.debug_endpoints = args.debug_endpoints;
    config.http.memory_history_entries = args.memory_history;
    config.http.request_timeout = Duration::from_secs(args.timeout_secs);
    config.http.memory_budget_bytes = args.memory_budget;
    config.http.crash_after = leaklab_service::fault::crash_after(args.variant)?;
    config.http.fail_after = leaklab_service::fault::fail_after(args.variant)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(leaklab_service::serve(
        config,
        std::net::SocketAddr::new(args.host, args.port),
    ))
}
