//! `cargo xtask record-corpus` and `cargo xtask judge-bench`: the judge's corpus of recorded
//! evidence (lab/corpus), re-recorded from live scans, and the judge measured on it.

use crate::process::run;
use crate::provision::{workspace_root, Torch};
use anyhow::{bail, Result};
use std::path::Path;

/// Debian's allocators the corpus's regimes preload (lab/corpus/record.py's `REGIMES`).
const ALLOCATORS: [(&str, &str); 2] = [
    ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "libjemalloc2"),
    (
        "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
        "libtcmalloc-minimal4",
    ),
];

/// Builds the instrument (release), installs the preloaded allocators where missing, and runs
/// the recorder with the torch python; extra arguments go to lab/corpus/record.py.
pub fn record(torch: &Torch, args: &[String]) -> Result<()> {
    let leaklab = torch.release_leaklab()?;
    for (lib, package) in ALLOCATORS {
        if !crate::apt::ensure_file(Path::new(lib), package) {
            bail!("{lib} is missing and could not be installed: apt-get install {package}");
        }
    }
    let mut record = torch.python_command("the corpus's recordings")?;
    record
        .arg(workspace_root().join("lab/corpus/record.py"))
        .arg("--leaklab")
        .arg(leaklab)
        .args(args);
    run(record)
}

/// `leaklab-lab judge-bench ARGS` (`--write` puts the table into docs/benchmarks.md).
pub fn bench(torch: &Torch, args: &[String]) -> Result<()> {
    torch.lab(&["judge-bench"], args)
}
