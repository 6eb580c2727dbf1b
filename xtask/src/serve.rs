//! `cargo xtask serve ...`: one variant of the lab's service (`leaklab-service serve`).

use crate::process::run_as_is;
use crate::provision::Torch;
use anyhow::Result;

pub fn run(torch: &Torch, args: &[String]) -> Result<()> {
    let mut cmd = torch.cargo();
    cmd.args([
        "run",
        "--quiet",
        "--release",
        "--package",
        "leaklab-service",
        "--bin",
        "leaklab-service",
        "--",
        "serve",
    ])
    .args(args);
    run_as_is(cmd)
}
