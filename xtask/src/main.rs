//! `cargo xtask`: the one entry point of leaklab.
//!
//! The xtask builds without libtorch, because provisioning libtorch is its first job: every
//! task below first makes sure a usable torch 2.11.0 exists ([`torch::Torch::ensure`]) and then
//! runs cargo with that libtorch wired in. The work itself lives in the library crates and the
//! `leaklab` binary (crates/cli); the xtask stays a thin driver.

mod bundle;
mod lab;
mod tidy;
mod torch;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "leaklab's driver", version)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Run every variant of the service, judge each one and write the report (the main job).
    RunLab(Passthrough),
    /// Run all tests (installs libtorch into a project-owned venv first if needed).
    Test(Passthrough),
    /// Start the inference service for one variant (e.g. `--variant refs-leaky`).
    Serve(Passthrough),
    /// Sustained load against the fixed variants (100,000 requests each) and 10,000 fuzzed bad
    /// requests; `--short` for the CI-sized soak alone.
    Soak(Passthrough),
    /// Criterion benchmarks plus the HTTP load comparison; writes docs/benchmarks.md.
    Bench(Passthrough),
    /// Workshop exercises: `lab list`, `lab check N`, `lab reset N`.
    Lab(Passthrough),
    /// Build release binaries and a launcher into a folder that runs on a torch 2.11.0 host.
    DeviceBundle(Passthrough),
    /// Print where libtorch comes from and the environment every cargo command gets.
    Env,
}

/// Arguments handed on unchanged to the `leaklab` binary or to cargo.
#[derive(clap::Args)]
struct Passthrough {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let torch = torch::Torch::ensure()?;
    match cli.task {
        Task::RunLab(p) => torch.leaklab(&["run-lab"], &p.args),
        Task::Serve(p) => torch.leaklab(&["serve"], &p.args),
        Task::Soak(p) => {
            torch.leaklab(&["soak"], &p.args)?;
            if !p.args.iter().any(|a| a == "--short") {
                // The full mode also throws 10,000 generated bad requests at the service.
                let mut fuzz = torch.cargo();
                fuzz.env("LEAKLAB_FUZZ_CASES", "10000").args(["test", "--release", "--package", "leaklab-service", "--test", "fuzz", "--", "--nocapture"]);
                torch::run(fuzz)?;
            }
            Ok(())
        }
        Task::Test(p) => torch.test(&p.args),
        Task::Bench(p) => torch.bench(&p.args),
        Task::Lab(p) => lab::run(&torch, &p.args),
        Task::DeviceBundle(p) => bundle::run(&torch, &p.args),
        Task::Env => {
            torch.describe();
            Ok(())
        }
    }
}
