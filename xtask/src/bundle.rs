//! `cargo xtask device-bundle`: release binaries plus a launcher for a host with torch 2.11.0.

use crate::torch::Torch;
use anyhow::{bail, Result};

pub fn run(_torch: &Torch, _args: &[String]) -> Result<()> {
    bail!("device-bundle is not built yet (issue 10)")
}
