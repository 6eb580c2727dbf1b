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
mod corpus;
mod lab;
mod process;
mod provision;
mod run_lab;
mod serve;
mod soak;
mod test;
mod tidy;
mod wheel;

use anyhow::{bail, Context, Result};
use lexopt::prelude::*;

/// `cargo xtask --help`. The tasks are parsed by hand (lexopt): everything after a task's name
/// goes unchanged to a leaklab binary or to cargo, which parse it.
const HELP: &str = "\
leaklab's driver

Usage: cargo xtask <TASK> [ARGS]...

Tasks:
  run-lab        Run every variant of the service, judge each one and write the report (the
                 main job).
  test           Run all tests (installs libtorch into a project-owned venv first if needed).
  serve          Start the inference service for one variant (e.g. `--variant refs-leaky`).
  soak           Sustained load against the fixed variants (100,000 requests each) and 10,000
                 fuzzed bad requests; `--short` for the CI-sized soak alone.
  bench          Criterion benchmarks plus the HTTP load comparison; writes docs/benchmarks.md.
  lab            The workshop: `lab list`, `lab check N`, `lab reset N`; the incident drill:
                 `lab incident`, `lab check incident`, `lab reveal`.
  device-bundle  Build release binaries and a launcher into a folder that runs on a torch
                 2.11.0 host: [--out DIR] (target/device-bundle), [--smoke] (then run it here,
                 on CPU).
  wheel          Build the pip-installable wheel (the `leaklab` binary and the Python package)
                 into target/wheels/.
  record-corpus  Record the judge's corpus (lab/corpus/recordings): every subject of
                 lab/corpus/subjects.py under every regime, scanned live (tens of minutes).
  judge-bench    The judge's false alarms and sensitivity on the corpus, calibration and
                 validation side by side; `--write` puts the table into docs/benchmarks.md.
  env            Print where libtorch comes from and the environment every cargo command gets.
";

fn main() -> Result<()> {
    let mut parser = lexopt::Parser::from_env();
    let task = match parser.next()? {
        Some(Value(task)) => task.string()?,
        Some(Short('h') | Long("help")) => {
            print!("{HELP}");
            return Ok(());
        }
        Some(Short('V') | Long("version")) => {
            println!("cargo xtask {}", env!("CARGO_PKG_VERSION"));
            return Ok(());
        }
        Some(other) => return Err(other.unexpected().into()),
        None => {
            eprint!("{HELP}");
            bail!("no task given");
        }
    };
    // Every task but the wheel first makes sure torch is there; the wheel is the instrument,
    // which links no libtorch, so it is built without it.
    let torch = provision::Torch::ensure;
    match task.as_str() {
        "run-lab" => run_lab::run(&torch()?, &passthrough(&mut parser)?),
        "test" => test::run_all(&torch()?, &passthrough(&mut parser)?),
        "serve" => serve::run(&torch()?, &passthrough(&mut parser)?),
        "soak" => soak::run_all(&torch()?, &passthrough(&mut parser)?),
        "bench" => bench::run_all(&torch()?, &passthrough(&mut parser)?),
        "lab" => lab::run(&torch()?, &passthrough(&mut parser)?),
        "record-corpus" => corpus::record(&torch()?, &passthrough(&mut parser)?),
        "judge-bench" => corpus::bench(&torch()?, &passthrough(&mut parser)?),
        "device-bundle" => {
            let args = bundle::BundleArgs::parse(&mut parser)?;
            bundle::run(&torch()?, &args)
        }
        "wheel" => {
            no_more(&mut parser)?;
            wheel::build().map(drop)
        }
        "env" => {
            no_more(&mut parser)?;
            torch()?.describe();
            Ok(())
        }
        other => {
            eprint!("{HELP}");
            bail!("no task named {other:?}")
        }
    }
}

/// The task's arguments, handed on unchanged to a leaklab binary or to cargo, which parse them.
fn passthrough(parser: &mut lexopt::Parser) -> Result<Vec<String>> {
    parser
        .raw_args()?
        .map(|arg| {
            arg.into_string()
                .map_err(|arg| anyhow::anyhow!("{arg:?} is not UTF-8"))
        })
        .collect::<Result<_>>()
        .context("the task's arguments")
}

/// A task that takes no arguments refuses any.
fn no_more(parser: &mut lexopt::Parser) -> Result<()> {
    match parser.next()? {
        Some(arg) => Err(arg.unexpected().into()),
        None => Ok(()),
    }
}
