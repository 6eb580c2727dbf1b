//! `leaklab-lab`: the lab's commands (`run-lab`, `soak`, `bench`), which drive the lab's own
//! service (`leaklab-service`); their flags and dispatch are in `leaklab_runner::commands`.
//! Free of libtorch, like the instrument's `leaklab`, which the wheel ships without these.

use clap::Parser;
use leaklab_runner::commands::{dispatch, LabCli};
use std::process::ExitCode;

fn main() -> ExitCode {
    dispatch(LabCli::parse().command)
}
