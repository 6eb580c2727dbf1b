//! `cargo xtask bench`: the criterion groups, then the HTTP comparison with the Python twin
//! (`leaklab bench`); writes docs/benchmarks.md.

use crate::process::run;
use crate::provision::Torch;
use anyhow::Result;

pub fn run_all(torch: &Torch, args: &[String]) -> Result<()> {
    torch.ensure_python_packages()?;
    let mut criterion = torch.cargo();
    criterion.args(["bench", "--package", "leaklab-service", "--bench", "fixes", "--package", "leaklab-probe", "--bench", "probe_overhead"]);
    run(criterion)?;
    torch.leaklab(&["bench"], args)
}
