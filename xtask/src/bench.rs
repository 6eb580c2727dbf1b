//! `cargo xtask bench`: the criterion groups (the fixes, the probes and native-stack capture,
//! snapshot explain of every writer's shape at 1 GB and of 5 GB, fleet judging), then the HTTP
//! comparison with the Python twin (`leaklab bench`); writes docs/benchmarks.md.

use crate::process::run;
use crate::provision::Torch;
use anyhow::Result;

pub fn run_all(torch: &Torch, args: &[String]) -> Result<()> {
    torch.ensure_python_packages()?;
    let mut criterion = torch.cargo();
    criterion.args(["bench", "--package", "leaklab-service", "--bench", "fixes", "--package", "leaklab-probe", "--bench", "probe_overhead", "--package", "leaklab-snapshot", "--bench", "explain", "--package", "leaklab-fleet", "--bench", "fleet_judge"]);
    run(criterion)?;
    torch.leaklab(&["bench"], args)
}
