//! `cargo xtask`: the one entry point of leaklab.
//!
//! The xtask builds without libtorch, because provisioning libtorch is its first job: every
//! task below but `wheel` first makes sure a usable torch 2.11.0 exists ([`provision::Torch::ensure`]) and
//! then runs cargo with that libtorch wired in. The work itself lives in the library crates and
//! the binaries (`leaklab-lab`, the lab's commands; `leaklab`, the instrument; `leaklab-service`);
//! the xtask stays a thin driver, one module a task.

mod apt;
mod bench;
mod bundle;
mod lab;
mod process;
mod provision;
mod run_lab;
mod serve;
mod soak;
mod test;
mod tidy;
mod wheel;

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
    /// The workshop: `lab list`, `lab check N`, `lab reset N`; the incident drill: `lab incident`,
    /// `lab check incident`, `lab reveal`.
    Lab(Passthrough),
    /// Build release binaries and a launcher into a folder that runs on a torch 2.11.0 host.
    DeviceBundle(bundle::BundleArgs),
    /// Build the pip-installable wheel (the `leaklab` binary and the Python package) into
    /// target/wheels/.
    Wheel,
    /// Print where libtorch comes from and the environment every cargo command gets.
    Env,
}

/// Arguments handed on unchanged to a leaklab binary or to cargo, which parse them.
#[derive(clap::Args)]
struct Passthrough {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

fn main() -> Result<()> {
    // Every task but the wheel first makes sure torch is there; the wheel is the instrument,
    // which links no libtorch, so it is built without it.
    let torch = provision::Torch::ensure;
    match Cli::parse().task {
        Task::RunLab(p) => run_lab::run(&torch()?, &p.args),
        Task::Test(p) => test::run_all(&torch()?, &p.args),
        Task::Serve(p) => serve::run(&torch()?, &p.args),
        Task::Soak(p) => soak::run_all(&torch()?, &p.args),
        Task::Bench(p) => bench::run_all(&torch()?, &p.args),
        Task::Lab(p) => lab::run(&torch()?, &p.args),
        Task::DeviceBundle(args) => bundle::run(&torch()?, &args),
        Task::Wheel => wheel::build().map(drop),
        Task::Env => {
            torch()?.describe();
            Ok(())
        }
    }
}
