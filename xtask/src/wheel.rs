//! `cargo xtask wheel`: the pip-installable wheel of `crates/cli` (the libtorch-free `leaklab`
//! binary and the Python package `crates/cli/python/leaklab`), built by maturin against glibc
//! 2.28 through zig so that it installs on every current CUDA base image, and checked by
//! maturin's own manylinux audit. Written to `target/wheels/`.
//!
//! The tests' wheel ([`build_for_tests`]) is packed instead from the dev build the tests use, so
//! CI compiles `leaklab` once: the same metadata (maturin writes it from pyproject.toml without
//! compiling), the package, the binary stripped, packed by pypa's `wheel pack`, and tagged
//! `linux_x86_64`, honestly, since no zig pinned its glibc. The manylinux tag and the size goal
//! are this release build's to check.

use crate::process::run;
use crate::provision::{wheel_tools, workspace_root};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The lowest manylinux the binary's glibc symbols allow (maturin's audit refuses a higher one).
pub const MANYLINUX: &str = "manylinux_2_28";

/// The release wheel's size goal (measured 4.2 MB).
const SIZE_GOAL_BYTES: u64 = 10_000_000;

/// Builds the wheel and returns its path. Needs no torch: the binary is libtorch-free.
pub fn build() -> Result<PathBuf> {
    let python = wheel_tools()?;
    let out = workspace_root().join("target/wheels");
    clear_wheels(&out)?;
    // maturin finds zig through `python -m ziglang` only with the tools' bin/ first on PATH.
    let bin = python
        .parent()
        .context("the tools' python lives in a folder")?;
    let path = std::env::join_paths(std::iter::once(bin.to_path_buf()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))?;
    let mut maturin = Command::new(&python);
    maturin
        .current_dir(workspace_root().join("crates/cli"))
        .env("PATH", path)
        .args([
            "-m",
            "maturin",
            "build",
            "--release",
            "--locked",
            "--zig",
            "--compatibility",
            MANYLINUX,
            "--out",
        ])
        .arg(&out);
    run(maturin).context("maturin could not build the wheel")?;
    let wheel = the_wheel(&out)?;
    let name = wheel.file_name().unwrap_or_default().to_string_lossy();
    if !name.contains(&format!("{MANYLINUX}_x86_64")) || !name.contains("-py3-none-") {
        bail!("the wheel {name} is not tagged py3-none-{MANYLINUX}_x86_64");
    }
    let size = std::fs::metadata(&wheel)?.len();
    if size >= SIZE_GOAL_BYTES {
        bail!("the wheel {name} is {size} bytes, over the {SIZE_GOAL_BYTES}-byte goal");
    }
    Ok(wheel)
}

/// The wheel for the tests, from `leaklab`, the dev build's binary, into target/wheels/dev/:
/// maturin's metadata for this package (`pep517 write-dist-info`: no compiling), the Python
/// package, the binary as a script (where pip puts it on PATH), packed by `wheel pack`, which
/// writes the RECORD and names the file from the tags.
pub fn build_for_tests(leaklab: &Path) -> Result<PathBuf> {
    let python = wheel_tools()?;
    let out = workspace_root().join("target/wheels/dev");
    let tree = workspace_root().join("target/wheels/dev-tree");
    clear_wheels(&out)?;
    if tree.exists() {
        std::fs::remove_dir_all(&tree)?;
    }
    std::fs::create_dir_all(&tree)?;
    let mut metadata = Command::new(&python);
    metadata
        .current_dir(workspace_root().join("crates/cli"))
        .args([
            "-m",
            "maturin",
            "pep517",
            "write-dist-info",
            "--compatibility",
            "linux",
            "--metadata-directory",
        ])
        .arg(&tree);
    run(metadata).context("maturin could not write the wheel's metadata")?;
    let dist_info = std::fs::read_dir(&tree)?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.ends_with(".dist-info"))
        .context("maturin wrote no .dist-info")?;
    let scripts = tree.join(dist_info.replace(".dist-info", ".data/scripts"));
    std::fs::create_dir_all(&scripts)?;
    let binary = scripts.join("leaklab");
    std::fs::copy(leaklab, &binary)
        .with_context(|| format!("cannot copy {} (built by the dev build)", leaklab.display()))?;
    // As the release wheel's `strip = true` does; without `strip` the wheel is only bigger.
    let _ = Command::new("strip").arg(&binary).status();
    copy_package(
        &workspace_root().join("crates/cli/python/leaklab"),
        &tree.join("leaklab"),
    )?;
    std::fs::create_dir_all(&out)?;
    let mut pack = Command::new(&python);
    pack.args(["-m", "wheel", "pack", "--dest-dir"])
        .arg(&out)
        .arg(&tree);
    run(pack).context("wheel pack could not pack the tests' wheel")?;
    the_wheel(&out)
}

/// Old wheels of other versions would make "the" wheel ambiguous.
fn clear_wheels(out: &Path) -> Result<()> {
    if out.exists() {
        for entry in std::fs::read_dir(out)?.flatten() {
            if entry.file_name().to_string_lossy().ends_with(".whl") {
                std::fs::remove_file(entry.path())?;
            }
        }
    }
    Ok(())
}

fn the_wheel(out: &Path) -> Result<PathBuf> {
    let wheels: Vec<PathBuf> = std::fs::read_dir(out)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "whl"))
        .collect();
    match wheels.as_slice() {
        [wheel] => {
            eprintln!(
                "leaklab: wheel {} ({:.1} MB)",
                wheel.display(),
                std::fs::metadata(wheel)?.len() as f64 / 1e6
            );
            Ok(wheel.clone())
        }
        _ => bail!("{} wheels in {}, expected one", wheels.len(), out.display()),
    }
}

/// A Python package's files (no `__pycache__`) under `to`; the device bundle's too.
pub fn copy_package(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            if entry.file_name() != "__pycache__" {
                copy_package(&entry.path(), &to.join(entry.file_name()))?;
            }
        } else {
            std::fs::copy(entry.path(), to.join(entry.file_name()))?;
        }
    }
    Ok(())
}
