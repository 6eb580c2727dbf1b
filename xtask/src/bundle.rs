//! `cargo xtask device-bundle [--out DIR]`: release binaries plus a launcher, in a folder under
//! 64 MiB that runs on a Linux x86-64 host whose python3 has torch 2.11.0 (a GPU host with
//! PyTorch 2.11.0+cu130, say), with no Rust toolchain and no network there.
//!
//! The bundle holds `bin/leaklab-lab` (the lab's commands: run-lab, soak, bench),
//! `bin/leaklab-service` (the service), `bin/gpu-tests` (the CUDA test binary, built with the
//! `gpu-tests` feature), `run.sh` (finds torch's lib dir through the host's python and sets the
//! loader path) and `gpu-check.sh` (the one prepared script for a lent GPU machine), and for
//! the Python package's CUDA test `bin/leaklab` (the instrument, which the pytest plugin runs),
//! `python/` (the package and its tests) and `python/vendor/` (pytest, for a host without it).
//! `--smoke` then runs the bundle here on CPU against the venv's torch.
//!
//! The release build is the device check's alone: `cargo xtask test` assembles the same layout
//! from its dev build (nothing compiled again, the binaries hard-linked) and runs it on CPU.

use crate::process::run as run_cmd;
use crate::provision::{workspace_root, Torch};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

const LIMIT_BYTES: u64 = 64 << 20;

/// The Python package's CUDA test, which gpu-check.sh runs (it skips where there is no GPU).
pub const PYTHON_CUDA_TEST: &str =
    "test_pytest_plugin.py::test_a_cuda_leak_fails_on_the_allocator_and_the_tensor_tally";

/// `cargo xtask device-bundle`'s arguments.
pub struct BundleArgs {
    /// The bundle's folder (`--out DIR`, target/device-bundle by default).
    out: PathBuf,
    /// Then run the bundle here, on CPU, against the provisioned torch (`--smoke`).
    smoke: bool,
}

impl BundleArgs {
    pub fn parse(parser: &mut lexopt::Parser) -> Result<Self> {
        use lexopt::prelude::*;
        let mut args = Self {
            out: PathBuf::from("target/device-bundle"),
            smoke: false,
        };
        while let Some(arg) = parser.next()? {
            match arg {
                Long("out") => args.out = parser.value()?.into(),
                Long("smoke") => args.smoke = true,
                other => return Err(other.unexpected().into()),
            }
        }
        Ok(args)
    }
}

pub fn run(torch: &Torch, args: &BundleArgs) -> Result<()> {
    let out = workspace_root().join(&args.out);
    build(torch, &out)?;
    if args.smoke {
        smoke_test(torch, &out)?;
    }
    Ok(())
}

/// What `cargo xtask test` does with the bundle: the layout assembled from the dev build the
/// tests ran (`gpu_tests` is its GPU test binary), at target/device-bundle-dev, and run here on
/// CPU. It proves the launcher, the layout and the lab from it; the release build (and the
/// size limit) is left to the device check.
pub fn smoke_dev(torch: &Torch, gpu_tests: &Path) -> Result<()> {
    let out = workspace_root().join("target/device-bundle-dev");
    assemble(
        &out,
        &workspace_root().join("target/debug"),
        gpu_tests,
        Profile::Dev,
    )?;
    smoke_test(torch, &out)
}

/// Which build the bundle is assembled from.
#[derive(Clone, Copy, PartialEq)]
enum Profile {
    /// Copied and stripped, under the size limit, pytest vendored: what a GPU host gets.
    Release,
    /// Hard-linked from target/debug, for the CPU run in CI: nothing vendored, no size limit.
    Dev,
}

fn build(torch: &Torch, out: &Path) -> Result<()> {
    let mut cargo = torch.cargo();
    cargo.args([
        "build",
        "--release",
        "--package",
        "leaklab-runner",
        "--package",
        "leaklab-service",
        "--package",
        "leaklab",
        "--bin",
        "leaklab-lab",
        "--bin",
        "leaklab-service",
        "--bin",
        "leaklab",
        "--features",
        crate::provision::INSTRUMENT,
    ]);
    run_cmd(cargo)?;
    // The GPU tests as a test binary: cargo prints its path in JSON messages.
    let mut tests = torch.cargo();
    tests.args([
        "test",
        "--release",
        "--package",
        "leaklab-service",
        "--features",
        "gpu-tests",
        "--test",
        "gpu",
        "--no-run",
        "--message-format",
        "json",
    ]);
    let output = tests.output().context("cannot build the GPU tests")?;
    if !output.status.success() {
        bail!(
            "building the GPU tests failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let gpu_tests = test_executable(&String::from_utf8_lossy(&output.stdout), "gpu")
        .context("cargo did not report the GPU test binary")?;
    assemble(
        out,
        &workspace_root().join("target/release"),
        &gpu_tests,
        Profile::Release,
    )?;
    vendor_pytest(torch, &out.join("python/vendor"))?;
    vendor_zoo(
        torch,
        "3.12",
        &out.join("python/zoo-vendor"),
        &out.join("python/zoo-vendor.zip"),
    )?;
    let size = dir_size(out)?;
    eprintln!(
        "leaklab: device bundle at {} ({:.1} MiB)",
        out.display(),
        size as f64 / (1 << 20) as f64
    );
    if size > LIMIT_BYTES {
        bail!("the bundle is {size} bytes, over the 64 MiB limit");
    }
    Ok(())
}

/// The bundle's layout in `out`, from the binaries in `bins` (a cargo profile's folder).
fn assemble(out: &Path, bins: &Path, gpu_tests: &Path, profile: Profile) -> Result<()> {
    if out.exists() {
        std::fs::remove_dir_all(out)?;
    }
    std::fs::create_dir_all(out.join("bin"))?;
    place(
        &bins.join("leaklab-lab"),
        &out.join("bin/leaklab-lab"),
        Debug::Strip,
        profile,
    )?;
    place(
        &bins.join("leaklab-service"),
        &out.join("bin/leaklab-service"),
        Debug::KeepLineTables,
        profile,
    )?;
    place(
        &bins.join("leaklab"),
        &out.join("bin/leaklab"),
        Debug::Strip,
        profile,
    )?;
    place(
        gpu_tests,
        &out.join("bin/gpu-tests"),
        Debug::KeepLineTables,
        profile,
    )?;
    let python = workspace_root().join("crates/cli/python");
    crate::wheel::copy_package(&python.join("leaklab"), &out.join("python/leaklab"))?;
    crate::wheel::copy_package(&python.join("tests"), &out.join("python/tests"))?;
    write_script(&out.join("run.sh"), RUN_SH)?;
    // The zoo: its causes, and gpu-check.sh running its CUDA-only ones there.
    let zoo = workspace_root().join("lab/zoo");
    crate::wheel::copy_package(&zoo, &out.join("zoo"))?;
    let only: Vec<String> = cuda_causes(&zoo)?
        .iter()
        .map(|name| format!("--only {name}"))
        .collect();
    write_script(
        &out.join("gpu-check.sh"),
        &GPU_CHECK_SH.replace("@CUDA_ZOO@", &only.join(" ")),
    )?;
    std::fs::write(out.join("README.txt"), README_TXT)?;
    Ok(())
}

/// pytest and what it needs, pure Python, installed into `dir` (7.5 MB, no bytecode): the GPU
/// host may have no pytest and no network. For Python 3.10 too, the oldest torch 2.11 runs on,
/// which also needs exceptiongroup and tomli (never imported on 3.11 and later).
fn vendor_pytest(torch: &Torch, dir: &Path) -> Result<()> {
    pip_target(
        torch,
        "pytest",
        &["--python-version", "3.10"],
        dir,
        ["pytest", "exceptiongroup", "tomli"],
    )
}

/// `pip install --target dir` of binary wheels only, for the GPU host's Python as `host` says
/// (`--python-version`, and `--platform` where a wheel is compiled), without bytecode.
fn pip_target<'a>(
    torch: &Torch,
    what: &str,
    host: &[&str],
    dir: &Path,
    packages: impl IntoIterator<Item = &'a str>,
) -> Result<()> {
    let mut pip = torch.python_command(&format!("vendoring {what} into the device bundle"))?;
    pip.args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--no-compile",
        "--only-binary=:all:",
    ])
    .args(host)
    .arg("--target")
    .arg(dir)
    .args(packages);
    run_cmd(pip)
        .with_context(|| format!("cannot vendor {what} into the bundle (PyPI must be reachable)"))
}

/// The zoo's CUDA-only causes (`device="cuda"` in their `ENTRY`), by name: the ones CPU runs
/// cannot, which gpu-check.sh runs.
fn cuda_causes(zoo: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(zoo).with_context(|| format!("no zoo at {}", zoo.display()))? {
        let path = entry?.path();
        let Some(name) = path.file_stem().and_then(|n| n.to_str()) else {
            continue;
        };
        if path.extension().is_some_and(|e| e == "py")
            && std::fs::read_to_string(&path)?.contains("\n    device=\"cuda\",")
        {
            names.push(name.to_string());
        }
    }
    names.sort();
    Ok(names)
}

/// What the zoo's services import that the GPU host's python lacks (its image has torch and
/// prometheus_client, not FastAPI, Starlette, pydantic or uvicorn: KINDS.md of the device
/// library, 2026-11), for `python_version` (the host's is 3.12), at the versions the tests here
/// run: the host has no network. The pure-Python packages go into `zip` (deflated: 64 MiB is the
/// bundle's limit; Python imports them from a zip on its path), the one compiled one,
/// pydantic_core, into `dir`; both go first on the zoo's PYTHONPATH there.
pub fn vendor_zoo(torch: &Torch, python_version: &str, dir: &Path, zip: &Path) -> Result<()> {
    let versions = torch
        .python_command("reading the tested FastAPI and uvicorn versions")?
        .args([
            "-c",
            "import importlib.metadata as m; print(*(f'{d}=={m.version(d)}' for d in ('fastapi', 'uvicorn')))",
        ])
        .output()
        .context("cannot read the venv's FastAPI and uvicorn versions")?;
    let pins = String::from_utf8_lossy(&versions.stdout).into_owned();
    if !versions.status.success() || pins.split_whitespace().count() != 2 {
        bail!(
            "the torch venv has no FastAPI or uvicorn to pin: {}",
            String::from_utf8_lossy(&versions.stderr)
        );
    }
    // Staged beside the zip, split, then removed (before the bundle is measured).
    let staged = zip.with_extension("staging");
    let _ = std::fs::remove_dir_all(&staged);
    pip_target(
        torch,
        "FastAPI and uvicorn",
        &[
            "--python-version",
            python_version,
            "--implementation",
            "cp",
            "--platform",
            "manylinux_2_17_x86_64",
            "--platform",
            "manylinux2014_x86_64",
        ],
        &staged,
        pins.split_whitespace(),
    )?;
    std::fs::create_dir_all(dir)?;
    for entry in std::fs::read_dir(&staged)? {
        let entry = entry?;
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with("pydantic_core")
        {
            std::fs::rename(entry.path(), dir.join(entry.file_name()))?;
        }
    }
    let mut zipping = torch.python_command("zipping the zoo's web stack")?;
    zipping.args(["-c", ZIP_TREE]).arg(&staged).arg(zip);
    run_cmd(zipping)?;
    std::fs::remove_dir_all(&staged)?;
    Ok(())
}

/// `python -c ZIP_TREE DIR ZIP`: every file under DIR into ZIP, deflated, named from DIR.
const ZIP_TREE: &str = "\
import os, sys, zipfile
root, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(out, 'w', zipfile.ZIP_DEFLATED) as z:
    for here, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(here, name)
            z.write(path, os.path.relpath(path, root))";

/// The one `compiler-artifact` message of cargo's `--message-format json` output (a JSON
/// document a line) that built test target `name`: its `executable`.
pub fn test_executable(messages: &str, name: &str) -> Option<PathBuf> {
    messages
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find_map(|message| {
            let target = &message["target"];
            let is_test = target["kind"]
                .as_array()
                .is_some_and(|kinds| kinds.iter().any(|k| k == "test"));
            (message["reason"] == "compiler-artifact" && target["name"] == name && is_test)
                .then(|| message["executable"].as_str().map(PathBuf::from))
                .flatten()
        })
}

/// What a bundled binary keeps of its debug info.
#[derive(Clone, Copy, PartialEq)]
enum Debug {
    /// Nothing: the instrument names no lines of its own.
    Strip,
    /// The workspace crates' line tables (the release profile builds only those), so the
    /// service's snapshots name `file:line` on the GPU host too; about 10 MiB.
    KeepLineTables,
}

/// A binary into the bundle: a hard link to a dev build (a copy where the file system refuses
/// one), a copy of a release build, stripped as `debug` says.
fn place(from: &Path, to: &Path, debug: Debug, profile: Profile) -> Result<()> {
    if profile == Profile::Dev && std::fs::hard_link(from, to).is_ok() {
        return Ok(());
    }
    std::fs::copy(from, to).with_context(|| format!("cannot copy {}", from.display()))?;
    if debug == Debug::Strip {
        let _ = Command::new("strip").arg("--strip-debug").arg(to).status();
    }
    Ok(())
}

fn write_script(path: &Path, text: &str) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

fn dir_size(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        total += if entry.file_type()?.is_dir() {
            dir_size(&entry.path())?
        } else {
            entry.metadata()?.len()
        };
    }
    Ok(total)
}

/// Runs the bundle's launcher here, on CPU, against the provisioned torch: it must run the lab
/// and print the table.
fn smoke_test(torch: &Torch, out: &Path) -> Result<()> {
    let python = torch
        .python
        .clone()
        .context("the smoke test needs a python with torch (LEAKLAB_PYTHON)")?;
    let report = out.join("smoke-report");
    let output = Command::new(out.join("run.sh"))
        .env("LEAKLAB_PYTHON", python)
        .env_remove("LD_LIBRARY_PATH")
        .args([
            "run-lab",
            "--device",
            "cpu",
            "--warmup",
            "5",
            "--requests",
            "30",
            "--variant",
            "refs-leaky",
            "--variant",
            "refs-fixed",
            "--out",
        ])
        .arg(&report)
        .output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    print!("{stdout}");
    if !output.status.success() || !stdout.contains("refs-leaky") || !stdout.contains("leak") {
        bail!(
            "the bundle's smoke run failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    std::fs::remove_dir_all(&report).ok();
    eprintln!("leaklab: the device bundle runs here on CPU");
    Ok(())
}

const RUN_SH: &str = r#"#!/usr/bin/env bash
# Runs a leaklab binary of this bundle against the torch 2.11.0 of this host's python.
# Usage: ./run.sh run-lab --device cuda ...   |   BIN=leaklab-service ./run.sh serve ...   |   BIN=gpu-tests ./run.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="${LEAKLAB_PYTHON:-python3}"
lib="$("$python" -c 'import os, torch; assert torch.__version__.split("+")[0] == "2.11.0", torch.__version__; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')" || {
  echo "run.sh: $python has no torch 2.11.0 (set LEAKLAB_PYTHON to one that has)" >&2; exit 2; }
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec "$here/bin/${BIN:-leaklab-lab}" "$@"
"#;

const GPU_CHECK_SH: &str = r#"#!/usr/bin/env bash
# The one prepared script for a lent GPU machine: GPU tests, the lab on CUDA at both scales,
# NVML figures. Writes everything under ${OUT:-./gpu-out}. A few minutes in all.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-$here/gpu-out}"; mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv > "$out/nvidia-smi.csv" 2>&1
BIN=gpu-tests "$here/run.sh" --test-threads=1 --include-ignored > "$out/gpu-tests.log" 2>&1; echo "gpu-tests exit $?" >> "$out/gpu-tests.log"
# The Python package's CUDA test (the pytest plugin's check on the CUDA allocator): it must pass,
# not skip, so the summary names its outcome.
cuda_test="test_pytest_plugin.py::test_a_cuda_leak_fails_on_the_allocator_and_the_tensor_tally"
(cd "$here/python" && PYTHONPATH="$here/python/vendor:$here/python" LEAKLAB_BIN="$here/bin/leaklab" "${LEAKLAB_PYTHON:-python3}" -m pytest -p no:cacheprovider -rA "tests/$cuda_test") > "$out/pytest-cuda.log" 2>&1
if grep -q "^PASSED .*${cuda_test#*::}" "$out/pytest-cuda.log"; then echo "pytest-cuda PASSED" >> "$out/pytest-cuda.log"; else echo "pytest-cuda NOT PASSED (failed or skipped)" >> "$out/pytest-cuda.log"; fi
timeout 200 "$here/run.sh" run-lab --device cuda --out "$out/default" > "$out/run-lab-default.txt" 2>&1; echo "exit $?" >> "$out/run-lab-default.txt"
timeout 240 "$here/run.sh" run-lab --device cuda --scale seed --out "$out/seed" --memory-history 0 > "$out/run-lab-seed.txt" 2>&1; echo "exit $?" >> "$out/run-lab-seed.txt"
# The zoo's CUDA-only causes, leaky and fixed, each scanned by the bundle's leaklab, against the
# predictions their entries hold (FastAPI and uvicorn from python/zoo-vendor*: the host has none).
PYTHONPATH="$here/python/zoo-vendor:$here/python/zoo-vendor.zip:$here/python${PYTHONPATH:+:$PYTHONPATH}" timeout 480 "$here/run.sh" run-lab --zoo --zoo-dir "$here/zoo" @CUDA_ZOO@ --out "$out/zoo-run" > "$out/zoo.txt" 2>&1; echo "exit $?" >> "$out/zoo.txt"
cp "$out"/default/report.json "$out/report-default.json" 2>/dev/null
cp "$out"/seed/report.json "$out/report-seed.json" 2>/dev/null
cp "$out"/zoo-run/zoo/report.json "$out/report-zoo.json" 2>/dev/null
tail -n 20 "$out"/*.txt "$out/gpu-tests.log" "$out/pytest-cuda.log"
"#;

const README_TXT: &str = "leaklab device bundle\n\n\
Needs: Linux x86-64, a python3 with torch 2.11.0 (LEAKLAB_PYTHON to pick one), a GPU for --device cuda.\n\
  ./run.sh run-lab --device cuda          # the lab on CUDA\n\
  ./run.sh run-lab --device cuda --scale seed\n\
  BIN=gpu-tests ./run.sh --test-threads=1 --include-ignored # the CUDA leak tests\n\
  BIN=leaklab-service ./run.sh serve --variant seed --device cuda\n\
  PYTHONPATH=python/zoo-vendor:python/zoo-vendor.zip:python ./run.sh run-lab --zoo --zoo-dir zoo --only cudnn_plan_cache\n\
  ./gpu-check.sh                          # all of the above and the CUDA zoo, figures under ./gpu-out\n";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dev_bundle_links_the_binaries_and_carries_the_python_package_and_its_cuda_test() {
        let dir = std::env::temp_dir().join(format!("leaklab-bundle-test-{}", std::process::id()));
        let (bins, out) = (dir.join("debug"), dir.join("bundle"));
        std::fs::create_dir_all(&bins).unwrap();
        for bin in ["leaklab-lab", "leaklab-service", "leaklab", "gpu-0123"] {
            std::fs::write(bins.join(bin), bin).unwrap();
        }
        assemble(&out, &bins, &bins.join("gpu-0123"), Profile::Dev).unwrap();
        for (bin, from) in [
            ("leaklab-lab", "leaklab-lab"),
            ("leaklab", "leaklab"),
            ("gpu-tests", "gpu-0123"),
        ] {
            assert_eq!(
                std::fs::read_to_string(out.join("bin").join(bin)).unwrap(),
                from
            );
        }
        assert!(
            out.join("python/leaklab/__init__.py").exists()
                && out.join("python/tests/test_pytest_plugin.py").exists()
        );
        assert!(
            !out.join("python/vendor").exists(),
            "the dev bundle vendors nothing"
        );
        let check = std::fs::read_to_string(out.join("gpu-check.sh")).unwrap();
        assert!(
            check.contains("--include-ignored")
                && check.contains(&format!("cuda_test=\"{PYTHON_CUDA_TEST}\""))
        );
        // The zoo travels, and the check runs each of its CUDA-only causes there (issue 49).
        assert!(out.join("zoo/serve.py").exists() && out.join("zoo/_zoo.py").exists());
        let cuda = cuda_causes(&out.join("zoo")).unwrap();
        assert_eq!(
            cuda,
            [
                "cuda_reserved_slack",
                "cudagraph_per_shape",
                "cudnn_plan_cache",
                "pinned_host_cache"
            ],
            "the zoo's CUDA-only entries, read from their ENTRY"
        );
        for name in &cuda {
            assert!(
                check.contains(&format!("--only {name}")),
                "{name} is run: {check}"
            );
        }
        assert!(!check.contains("@CUDA_ZOO@"));
        // The CUDA test it names exists in the suite it carries.
        let suite =
            std::fs::read_to_string(out.join("python/tests/test_pytest_plugin.py")).unwrap();
        assert!(suite.contains("def test_a_cuda_leak_fails_on_the_allocator_and_the_tensor_tally("));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_gpu_test_binary_is_found_among_cargos_messages() {
        // Trimmed from real `cargo test --no-run --message-format json` output: a library
        // artifact, a build-script run, the test artifact, and a line that is not JSON.
        let messages = r#"{"reason":"compiler-artifact","package_id":"leaklab-service","target":{"kind":["lib"],"crate_types":["lib"],"name":"leaklab_service","src_path":"/w/crates/service/src/lib.rs"},"executable":null,"fresh":true}
{"reason":"build-script-executed","package_id":"leaklab-probe","out_dir":"/w/target/release/build/x/out"}
{"reason":"compiler-artifact","package_id":"leaklab-service","target":{"kind":["test"],"crate_types":["bin"],"name":"gpu","src_path":"/w/crates/service/tests/gpu.rs"},"executable":"/w/target/release/deps/gpu-0123abcd","fresh":false}
warning: something cargo said in plain text
{"reason":"build-finished","success":true}"#;
        assert_eq!(
            test_executable(messages, "gpu"),
            Some(PathBuf::from("/w/target/release/deps/gpu-0123abcd"))
        );
        assert_eq!(
            test_executable(messages, "leaklab_service"),
            None,
            "a library is no test binary"
        );
        assert_eq!(test_executable("", "gpu"), None);
    }
}
