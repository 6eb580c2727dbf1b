//! `cargo xtask run-lab ...`: every variant, judged and written up (`leaklab-lab run-lab`).

use crate::provision::Torch;
use anyhow::Result;

pub fn run(torch: &Torch, args: &[String]) -> Result<()> {
    torch.lab(&["run-lab"], args)
}
