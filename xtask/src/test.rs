//! `cargo xtask test`: everything CI runs. Unit, integration and doc tests (the benches once
//! each in test mode), the Python twin's packages installed first, the alert rules under
//! promtool, and the device bundle built and run here on CPU. Extra arguments go to `cargo
//! test` and skip the last two steps.

use crate::process::run;
use crate::provision::{workspace_root, Torch};
use anyhow::{Context, Result};
use std::process::Command;

pub fn run_all(torch: &Torch, args: &[String]) -> Result<()> {
    torch.ensure_python_packages()?;
    let mut all = torch.cargo();
    all.args(["test", "--workspace", "--no-fail-fast", "--all-targets"]).args(args);
    let mut docs = torch.cargo();
    docs.args(["test", "--workspace", "--no-fail-fast", "--doc"]).args(args);
    let (all, docs) = (run(all), run(docs));
    all.and(docs)?;
    if args.is_empty() {
        promtool_rules()?;
        crate::bundle::build_and_smoke(torch)?;
    }
    Ok(())
}

/// `promtool test rules` on the runbook's alert rules.
fn promtool_rules() -> Result<()> {
    if !crate::apt::ensure("promtool", "prometheus") {
        eprintln!("leaklab: SKIPPED promtool test rules: promtool is not installed and could not be (apt-get install prometheus)");
        return Ok(());
    }
    let mut cmd = Command::new("promtool");
    cmd.current_dir(workspace_root().join("docs/prometheus")).args(["test", "rules", "leaklab-alerts.test.yml"]);
    run(cmd).context("the alert rules' promtool test failed")
}
