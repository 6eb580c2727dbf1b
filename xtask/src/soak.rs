//! `cargo xtask soak`: the fixed variants under sustained load (`leaklab-lab soak`); the full mode
//! also throws 10,000 generated bad requests at the service.

use crate::process::run;
use crate::provision::Torch;
use anyhow::Result;

pub fn run_all(torch: &Torch, args: &[String]) -> Result<()> {
    torch.lab(&["soak"], args)?;
    if !args.iter().any(|a| a == "--short") {
        let mut fuzz = torch.cargo();
        fuzz.env("LEAKLAB_FUZZ_CASES", "10000").args([
            "test",
            "--release",
            "--package",
            "leaklab-service",
            "--test",
            "fuzz",
            "--",
            "--nocapture",
        ]);
        run(fuzz)?;
    }
    Ok(())
}
