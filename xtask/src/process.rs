//! Running commands: fail with the command's name, or exit with its own status.

use anyhow::{bail, Context, Result};
use std::process::Command;

/// Runs `cmd`; an error names it when it fails.
pub fn run(mut cmd: Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("could not start {cmd:?}"))?;
    if !status.success() {
        bail!(
            "{:?} {} failed ({status})",
            cmd.get_program(),
            cmd.get_args()
                .next()
                .map(|a| a.to_string_lossy())
                .unwrap_or_default()
        );
    }
    Ok(())
}

/// Runs a command that reports for itself, and exits with its status: a verdict table that
/// says "FAIL" needs no second error message from the xtask.
pub fn run_as_is(mut cmd: Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("could not start {cmd:?}"))?;
    if !status.success() {
        std::process::exit(status.code().unwrap_or(1));
    }
    Ok(())
}

/// Whether `program --version` runs.
pub fn has(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}
