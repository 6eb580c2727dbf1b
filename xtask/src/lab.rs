//! `cargo xtask lab ...`: the workshop exercises, checked by the detector.

use crate::process::run_as_is;
use crate::provision::Torch;
use anyhow::Result;

pub fn run(torch: &Torch, args: &[String]) -> Result<()> {
    let mut cmd = torch.cargo();
    cmd.args(["run", "--quiet", "--package", "leaklab-exercises", "--"]).args(args);
    run_as_is(cmd)
}
