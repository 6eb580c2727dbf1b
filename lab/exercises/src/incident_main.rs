//! `leaklab-incident`: the incident drill's service with the learner's handler
//! (`lab/exercises/src/incident.rs`) compiled in, which it serves (`serve`, with the briefing)
//! or checks (`check`). Built only with the `incident` feature, by `cargo xtask lab incident`
//! and `cargo xtask lab check incident`, so that a missing or half-edited copy never breaks the
//! workspace's build.

// Skipped by rustfmt: the learner's copy exists only during a drill (and is theirs to format).
#[rustfmt::skip]
mod incident;

use anyhow::{bail, Result};
use clap::Parser;
use leaklab_exercises::drill::{self, serve};

#[derive(Parser)]
#[command(
    name = "leaklab-incident",
    about = "The incident drill's service, with your handler"
)]
enum Cli {
    /// Serves your handler and prints the briefing.
    Serve(serve::IncidentArgs),
    /// Replays the traffic through your handler: leak, answers, cache, gauges.
    Check,
}

fn main() -> Result<()> {
    if drill::current()?.is_none() {
        bail!("no incident in progress: `cargo xtask lab incident` starts one");
    }
    match Cli::parse() {
        Cli::Serve(args) => serve::run(Box::new(incident::Service::new()), &args, |addr| {
            print!("{}", serve::briefing(addr))
        }),
        Cli::Check => {
            leaklab_probe::cpu::install()?;
            let outcome = drill::check::check(&mut incident::Service::new());
            print!("{}", outcome.text);
            std::process::exit(i32::from(!outcome.passed));
        }
    }
}
