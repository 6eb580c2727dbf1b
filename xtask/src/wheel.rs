//! `cargo xtask wheel`: the pip-installable wheel of `crates/cli` (the libtorch-free `leaklab`
//! binary and the Python package `crates/cli/python/leaklab`), built by maturin against glibc
//! 2.28 through zig so that it installs on every current CUDA base image, and checked by
//! maturin's own manylinux audit. Written to `target/wheels/`.

use crate::process::run;
use crate::provision::{wheel_tools, workspace_root};
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::process::Command;

/// The lowest manylinux the binary's glibc symbols allow (maturin's audit refuses a higher one).
pub const MANYLINUX: &str = "manylinux_2_28";

/// Builds the wheel and returns its path. Needs no torch: the binary is libtorch-free.
pub fn build() -> Result<PathBuf> {
    let python = wheel_tools()?;
    let out = workspace_root().join("target/wheels");
    // Old wheels of other versions would make "the" wheel ambiguous.
    if out.exists() {
        for entry in std::fs::read_dir(&out)?.flatten() {
            if entry.file_name().to_string_lossy().ends_with(".whl") {
                std::fs::remove_file(entry.path())?;
            }
        }
    }
    // maturin finds zig through `python -m ziglang` only with the tools' bin/ first on PATH.
    let bin = python.parent().context("the tools' python lives in a folder")?;
    let path = std::env::join_paths(std::iter::once(bin.to_path_buf()).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())))?;
    let mut maturin = Command::new(&python);
    maturin
        .current_dir(workspace_root().join("crates/cli"))
        .env("PATH", path)
        .args(["-m", "maturin", "build", "--release", "--locked", "--zig", "--compatibility", MANYLINUX, "--out"])
        .arg(&out);
    run(maturin).context("maturin could not build the wheel")?;
    let wheels: Vec<PathBuf> = std::fs::read_dir(&out)?.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|e| e == "whl")).collect();
    match wheels.as_slice() {
        [wheel] => {
            let name = wheel.file_name().unwrap_or_default().to_string_lossy();
            if !name.contains(&format!("{MANYLINUX}_x86_64")) || !name.contains("-py3-none-") {
                bail!("the wheel {name} is not tagged py3-none-{MANYLINUX}_x86_64");
            }
            eprintln!("leaklab: wheel {} ({:.1} MB)", wheel.display(), std::fs::metadata(wheel)?.len() as f64 / 1e6);
            Ok(wheel.clone())
        }
        _ => bail!("maturin left {} wheels in {}, expected one", wheels.len(), out.display()),
    }
}
