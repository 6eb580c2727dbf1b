//! `cargo xtask lab ...`: the workshop exercises, checked by the detector.

use crate::torch::Torch;
use anyhow::Result;

pub fn run(torch: &Torch, args: &[String]) -> Result<()> {
    let mut cmd = torch.cargo();
    cmd.args(["run", "--quiet", "--package", "leaklab-exercises", "--"]).args(args);
    crate::torch::run_as_is(cmd)
}
