//! `cargo xtask lab ...`: the workshop exercises and the incident drills (Rust and Python),
//! checked by the detector.
//!
//! Most commands go to the `leaklab-exercises` binary as they are. The drill's learner copy
//! (`lab/exercises/src/incident.rs`) is compiled into `leaklab-incident` only, behind the
//! `incident` feature, so the two commands that need it are routed there: `lab incident`
//! (write the copy, build, serve it) and `lab check incident`.

use crate::process::{self, run_as_is};
use crate::provision::{workspace_root, Torch};
use anyhow::{bail, Result};

pub fn run(torch: &Torch, args: &[String]) -> Result<()> {
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    match words.as_slice() {
        ["incident", rest @ ..] => incident(torch, rest),
        ["check", "incident"] => learner_incident(torch, &["check"]),
        // The Python exercises and the Python drill are scanned by the `leaklab` binary
        // (lab/exercises/src/python.rs); the drill's briefing tells the learner to run it too.
        ["check", "5" | "6" | "pyincident", ..] | ["pyincident", ..] => {
            build_leaklab(torch)?;
            run_as_is(exercises(
                torch,
                "leaklab-exercises",
                args.iter().map(String::as_str),
            ))
        }
        _ => run_as_is(exercises(
            torch,
            "leaklab-exercises",
            args.iter().map(String::as_str),
        )),
    }
}

/// `cargo run` of one of the workshop's binaries.
fn exercises<'a>(
    torch: &Torch,
    bin: &str,
    args: impl IntoIterator<Item = &'a str>,
) -> std::process::Command {
    let mut cmd = torch.cargo();
    cmd.args([
        "run",
        "--quiet",
        "--package",
        "leaklab-exercises",
        "--bin",
        bin,
    ]);
    if bin == "leaklab-incident" {
        cmd.args(["--features", "incident"]);
    }
    cmd.arg("--").args(args);
    cmd
}

/// Picks (or resumes) the incident, builds `leaklab` for the learner's scans, serves the copy.
fn incident(torch: &Torch, flags: &[&str]) -> Result<()> {
    process::run(exercises(
        torch,
        "leaklab-exercises",
        ["incident", "prepare"]
            .into_iter()
            .chain(flags.iter().copied()),
    ))?;
    build_leaklab(torch)?;
    learner_incident(torch, &[&["serve"], flags].concat())
}

fn learner_incident(torch: &Torch, args: &[&str]) -> Result<()> {
    if !workspace_root()
        .join("lab/exercises/src/incident.rs")
        .exists()
    {
        bail!("no incident in progress: `cargo xtask lab incident` starts one");
    }
    run_as_is(exercises(torch, "leaklab-incident", args.iter().copied()))
}

/// Builds `leaklab` for the learner's scans and the Python exercises' checks.
fn build_leaklab(torch: &Torch) -> Result<()> {
    let mut build = torch.cargo();
    build.args([
        "build",
        "--quiet",
        "--package",
        "leaklab",
        "--bin",
        "leaklab",
    ]);
    process::run(build)
}
