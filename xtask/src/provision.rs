//! Provisioning of libtorch 2.11.0 and the environment every cargo command runs in.
//!
//! Three sources, in order of precedence:
//! 1. `LIBTORCH` set by the user: used as is (tch's own convention).
//! 2. `LEAKLAB_PYTHON` set by the user: a python whose `torch` is 2.11.0.
//! 3. Otherwise a virtual environment owned by the xtask, in a per-user cache keyed by the
//!    torch version (`~/.cache/leaklab/torch-2.11.0`, or `LEAKLAB_VENV`), so fresh clones and
//!    CI runs on the same machine reuse it. It counts as ready only once a marker file, written
//!    after `import torch` succeeded and the libraries were found, says so; anything less is
//!    repaired rather than used.

use crate::process::run_as_is;
use anyhow::{bail, Context, Result};
use std::env;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The libtorch release that tch 0.24 is built for (torch-sys checks it at build time).
pub const TORCH_VERSION: &str = "2.11.0";
const MARKER: &str = "leaklab-torch-ready";

pub struct Torch {
    /// A python whose `torch` package is 2.11.0, when one is known (not with a bare `LIBTORCH`).
    pub python: Option<PathBuf>,
    /// The folder holding libtorch_cpu.so and friends.
    pub lib_dir: PathBuf,
    source: Source,
}

enum Source {
    UserLibtorch,
    UserPython,
    Venv(PathBuf),
}

impl Torch {
    pub fn ensure() -> Result<Torch> {
        if let Some(libtorch) = env::var_os("LIBTORCH") {
            let lib_dir = PathBuf::from(libtorch).join("lib");
            if !lib_dir.join("libtorch_cpu.so").exists() {
                bail!("LIBTORCH is set but {} holds no libtorch_cpu.so; unset LIBTORCH to let the xtask provision torch {TORCH_VERSION}", lib_dir.display());
            }
            let python = env::var_os("LEAKLAB_PYTHON").map(PathBuf::from);
            return Ok(Torch {
                python,
                lib_dir,
                source: Source::UserLibtorch,
            });
        }
        if let Some(python) = env::var_os("LEAKLAB_PYTHON") {
            let python = PathBuf::from(python);
            let lib_dir = probe_torch(&python).with_context(|| {
                format!(
                    "LEAKLAB_PYTHON={} has no usable torch {TORCH_VERSION}",
                    python.display()
                )
            })?;
            return Ok(Torch {
                python: Some(python),
                lib_dir,
                source: Source::UserPython,
            });
        }
        let venv = venv_dir()?;
        let lib_dir = ensure_venv(&venv)?;
        Ok(Torch {
            python: Some(venv.join("bin/python")),
            lib_dir,
            source: Source::Venv(venv),
        })
    }

    /// A `cargo` command with libtorch wired in: tch finds torch through the venv's python,
    /// and binaries and tests find its shared libraries on the loader path.
    pub fn cargo(&self) -> Command {
        let mut cmd = Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
        cmd.current_dir(workspace_root());
        for (key, value) in self.env() {
            cmd.env(key, value);
        }
        cmd
    }

    /// Builds the `leaklab` binary as the wheel ships it (release) and returns its path.
    pub fn release_leaklab(&self) -> Result<PathBuf> {
        let mut build = self.cargo();
        build.args([
            "build",
            "--release",
            "--package",
            "leaklab",
            "--bin",
            "leaklab",
        ]);
        crate::process::run(build)?;
        Ok(workspace_root().join("target/release/leaklab"))
    }

    /// The python whose torch this is, run from the workspace root with [`Torch::env`]; `what`
    /// says which task needs it, for the error where there is none (a bare `LIBTORCH`).
    pub fn python_command(&self, what: &str) -> Result<Command> {
        let python = self.python.as_ref().with_context(|| {
            format!("{what} need the provisioned python (unset LIBTORCH, or set LEAKLAB_PYTHON)")
        })?;
        let mut cmd = Command::new(python);
        cmd.current_dir(workspace_root()).envs(self.env());
        Ok(cmd)
    }

    /// The variables every command driven by the xtask gets.
    pub fn env(&self) -> Vec<(&'static str, OsString)> {
        let mut vars = vec![(
            "LD_LIBRARY_PATH",
            prepend_path(&self.lib_dir, "LD_LIBRARY_PATH"),
        )];
        if let Some(python) = &self.python {
            vars.push(("LEAKLAB_PYTHON", python.clone().into()));
        }
        if !matches!(self.source, Source::UserLibtorch) {
            let python = self.python.as_ref().expect("a python source has a python");
            let bin = python.parent().expect("python lives in a folder");
            vars.push(("LIBTORCH_USE_PYTORCH", "1".into()));
            vars.push(("PATH", prepend_path(bin, "PATH")));
            // torch-sys runs `python` when VIRTUAL_ENV is set, `python3` otherwise; both are the
            // venv's once its bin/ is first on PATH.
            if let Some(venv) = bin.parent() {
                vars.push(("VIRTUAL_ENV", venv.into()));
            }
        }
        vars
    }

    pub fn describe(&self) {
        let source = match &self.source {
            Source::UserLibtorch => "LIBTORCH (yours)".to_string(),
            Source::UserPython => "LEAKLAB_PYTHON (yours)".to_string(),
            Source::Venv(dir) => format!("xtask-owned venv {}", dir.display()),
        };
        println!("libtorch {TORCH_VERSION} from {source}");
        println!("  lib dir: {}", self.lib_dir.display());
        for (key, value) in self.env() {
            println!("  {key}={}", value.to_string_lossy());
        }
    }

    /// Builds `leaklab-lab` and `leaklab-service` in release mode and runs
    /// `leaklab-lab <sub> <args>`, exiting with its status: the lab's binary does the work and
    /// the reporting.
    pub fn lab(&self, sub: &[&str], args: &[String]) -> Result<()> {
        let mut build = self.cargo();
        // cargo's own progress, not --quiet: a cold release build takes minutes, and a terminal
        // that shows nothing for them cannot be told from a hang.
        build.args([
            "build",
            "--release",
            "--package",
            "leaklab-runner",
            "--package",
            "leaklab-service",
            "--bin",
            "leaklab-lab",
            "--bin",
            "leaklab-service",
        ]);
        // `run-lab --zoo` scans each cause with the instrument's own binary, found beside it,
        // and reads its documents (the runner's `instrument` feature: the scan and the judge),
        // as the corpus's table does (`judge-bench`, and `bench`, which writes it into
        // docs/benchmarks.md); the lab's own run needs none of it (the CLI, its fleet and watch
        // crates, the scan, the judge and rustls: built for nothing, they were most of the
        // build's last minute).
        let zoo = args.iter().any(|a| a == "--zoo");
        if zoo || sub.iter().any(|s| matches!(*s, "judge-bench" | "bench")) {
            build.args(["--features", INSTRUMENT]);
        }
        if zoo {
            build.args(["--package", "leaklab", "--bin", "leaklab"]);
            // The entries' own packages (onnxruntime, tokenizers, the MCP SDK, ...).
            self.ensure_python_packages()?;
        }
        eprintln!("leaklab: ── building the lab's binaries (release; minutes the first time)");
        let started = std::time::Instant::now();
        crate::process::run_built(build, "the lab's release build")?;
        eprintln!(
            "leaklab: ── built in {:.1} s; running `leaklab-lab {}`",
            started.elapsed().as_secs_f64(),
            sub.join(" ")
        );
        let mut cmd = Command::new(workspace_root().join("target/release/leaklab-lab"));
        cmd.envs(self.env()).args(sub).args(args);
        run_as_is(cmd)
    }

    /// The Python packages the tasks use, in the same python as torch: the twin's (FastAPI,
    /// uvicorn, safetensors, prometheus_client), the Kubernetes manifests' validator
    /// (kubernetes-validate, schemas bundled: works offline) and the Python package's tests
    /// and checks (pytest, httpx for Starlette's TestClient, ruff, mypy). Only what is missing,
    /// or pinned and at another version, is installed.
    pub fn ensure_python_packages(&self) -> Result<()> {
        let Some(python) = &self.python else {
            return Ok(());
        };
        let missing = unmet(python, PYTHON_PACKAGES);
        if !missing.is_empty() {
            eprintln!(
                "leaklab: installing {} into {}",
                missing.join(" "),
                python.display()
            );
            pip_install(python, &missing)?;
        }
        ensure_zoo_site(python)
    }
}

/// The folder, under the venv's prefix, of packages a zoo entry needs that must not be
/// importable by every service sharing the venv; the entry appends it to its own `sys.path`
/// (lab/zoo/_zoo.py's `zoo_site`), after the venv's packages.
const ZOO_SITE: &str = "leaklab-zoo-site";

/// What [`ZOO_SITE`] holds, pinned, each with `--no-deps` (their other dependencies are the
/// venv's): the MCP SDK of the zoo's mcp_session_per_client and what it needs that the venv
/// lacks. Not in the venv itself: LitServe 0.2.19 starts its MCP server wherever `mcp` is
/// importable (server.py asks for `mcp`) but imports that server's classes only where
/// `fastmcp` is (mcp.py), so with `mcp` alone every LitServe service died at start
/// ("NameError: name 'MCPServer' is not defined", 2026-12-07).
const ZOO_SITE_PACKAGES: &[&str] = &[
    "mcp==1.26.0",
    "httpx-sse==0.4.3",
    "pydantic-settings==2.16.3",
    "sse-starlette==3.7.1",
    "PyJWT==2.15.1",
];

/// Installs [`ZOO_SITE_PACKAGES`] into [`ZOO_SITE`] under `python`'s prefix, unless the list
/// it holds (its `requirements.txt`) is this one.
fn ensure_zoo_site(python: &Path) -> Result<()> {
    let out = Command::new(python)
        .args(["-c", "import sys; print(sys.prefix)"])
        .output()
        .with_context(|| format!("cannot run {}", python.display()))?;
    let site = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join(ZOO_SITE);
    let wanted = ZOO_SITE_PACKAGES.join("\n") + "\n";
    let stamp = site.join("requirements.txt");
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(wanted.as_str()) {
        return Ok(());
    }
    eprintln!(
        "leaklab: installing {} into {} (the zoo's own packages)",
        ZOO_SITE_PACKAGES.join(" "),
        site.display()
    );
    let target = site.display().to_string();
    let args: Vec<&str> = ["--no-deps", "--upgrade", "--target", target.as_str()]
        .into_iter()
        .chain(ZOO_SITE_PACKAGES.iter().copied())
        .collect();
    pip_install(python, &args)?;
    std::fs::write(&stamp, wanted).with_context(|| format!("cannot write {}", stamp.display()))
}

/// The runner's feature that builds the zoo and the corpus into `leaklab-lab`.
pub const INSTRUMENT: &str = "leaklab-runner/instrument";

/// (module to import, pip requirement) for every Python package a task needs.
const PYTHON_PACKAGES: &[(&str, &str)] = &[
    ("fastapi", "fastapi"),
    ("uvicorn", "uvicorn"),
    ("safetensors", "safetensors"),
    ("prometheus_client", "prometheus_client"),
    ("kubernetes_validate", "kubernetes-validate==1.37.0"),
    ("pytest", "pytest"),
    ("httpx", "httpx"),
    // The checkers pinned: a new release of either adds rules or changes its style, and would
    // fail unchanged code on a fresh machine (these are the versions the tree was checked with).
    ("ruff", "ruff==0.17.6"),
    ("mypy", "mypy==2.4.1"),
    // The zoo's onnxruntime_arena entry: ONNX Runtime's CPU arena, on a model built with onnx.
    ("onnxruntime", "onnxruntime==1.32.0"),
    ("onnx", "onnx==1.23.2"),
    // The zoo's tokenizer_growth entry: a BPE tokenizer trained in code.
    ("tokenizers", "tokenizers==0.22.2"),
    // The zoo's logging_handler_per_client entry: the SDK at the version of its report.
    ("paddle_billing", "paddle-python-sdk==1.10.0"),
    // The zoo's pyplot_figures_kept entry: pyplot's figure manager, drawn on Agg.
    ("matplotlib", "matplotlib==3.11.2"),
    // The agent's native trace (leaklab[native]) and its tests.
    ("memray", "memray==1.20.0"),
    // The servers people run (docs/servers.md), at the versions their tests were written on:
    // LitServe's inference workers, gunicorn with uvicorn's worker class.
    ("litserve", "litserve==0.2.19"),
    ("gunicorn", "gunicorn==27.0.1"),
    ("uvicorn_worker", "uvicorn-worker==0.4.0"),
    // BentoML's services with workers (docs/servers.md).
    ("bentoml", "bentoml==1.4.40"),
    // transformers generating with caches (docs/servers.md): 4.57, the last release that takes
    // tokenizers 0.22, the zoo's pin above (5.x asks for 0.23).
    ("transformers", "transformers==4.57.6"),
];

/// The requirements of `packages` (module to import, pip requirement) that `python` does not
/// meet, in one interpreter start: the module cannot be found, or a pinned distribution is at
/// another version (pip then installs the pin over it).
fn unmet<'a>(python: &Path, packages: &[(&str, &'a str)]) -> Vec<&'a str> {
    const SCRIPT: &str = "\
import importlib.metadata as md, importlib.util, sys
def met(module, spec):
    if importlib.util.find_spec(module) is None:
        return False
    dist, _, pin = spec.partition('==')
    try:
        return not pin or md.version(dist) == pin
    except md.PackageNotFoundError:
        return False
args = sys.argv[1:]
print(' '.join(s for m, s in zip(args[::2], args[1::2]) if not met(m, s)))";
    let specs = || packages.iter().map(|&(_, spec)| spec);
    match Command::new(python)
        .args(["-c", SCRIPT])
        .args(packages.iter().flat_map(|&(module, spec)| [module, spec]))
        .output()
    {
        Ok(out) if out.status.success() => {
            let unmet = String::from_utf8_lossy(&out.stdout).into_owned();
            let unmet: Vec<&str> = unmet.split_whitespace().collect();
            specs().filter(|spec| unmet.contains(spec)).collect()
        }
        _ => specs().collect(),
    }
}

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits in the workspace")
        .to_path_buf()
}

fn prepend_path(dir: &Path, var: &str) -> OsString {
    let mut parts = vec![dir.to_path_buf()];
    if let Some(old) = env::var_os(var) {
        parts.extend(env::split_paths(&old).filter(|p| p != dir));
    }
    env::join_paths(parts).expect("paths without separators")
}

fn cache_dir() -> Result<PathBuf> {
    let cache = match env::var_os("XDG_CACHE_HOME") {
        Some(dir) => PathBuf::from(dir),
        None => {
            PathBuf::from(env::var_os("HOME").context("neither HOME nor XDG_CACHE_HOME is set")?)
                .join(".cache")
        }
    };
    Ok(cache.join("leaklab"))
}

fn venv_dir() -> Result<PathBuf> {
    match env::var_os("LEAKLAB_VENV") {
        Some(dir) => Ok(PathBuf::from(dir)),
        None => Ok(cache_dir()?.join(format!("torch-{TORCH_VERSION}"))),
    }
}

/// The wheel's build tools, maturin and zig (from the ziglang wheel, for a binary linked
/// against glibc 2.28), pinned, in a small venv of their own beside the torch one: building
/// the instrument's wheel must not need the 4.6 GB torch install. Returns its python.
pub fn wheel_tools() -> Result<PathBuf> {
    // `wheel` packs the tests' wheel from the dev build (wheel::build_for_tests).
    const TOOLS: [&str; 3] = ["maturin==1.16.0", "ziglang==0.15.1", "wheel==0.48.0"];
    let venv = cache_dir()?.join("wheel-tools");
    let python = venv.join("bin/python");
    let marker = venv.join("leaklab-tools-ready");
    if std::fs::read_to_string(&marker).is_ok_and(|m| m == TOOLS.join("\n")) && python.exists() {
        return Ok(python);
    }
    create_venv(&venv)?;
    eprintln!(
        "leaklab: installing the wheel's build tools ({}) into {}",
        TOOLS.join(", "),
        venv.display()
    );
    pip_install(&python, &TOOLS)?;
    std::fs::write(&marker, TOOLS.join("\n"))
        .with_context(|| format!("cannot write {}", marker.display()))?;
    Ok(python)
}

/// Makes `venv` hold a working torch, installing or repairing as needed, and returns its lib dir.
fn ensure_venv(venv: &Path) -> Result<PathBuf> {
    let python = venv.join("bin/python");
    let marker = venv.join(MARKER);
    if let Ok(text) = std::fs::read_to_string(&marker) {
        if let Some(lib) = text.lines().find_map(|l| l.strip_prefix("lib=")) {
            let lib = PathBuf::from(lib);
            if python.exists() && lib.join("libtorch_cpu.so").exists() {
                return Ok(lib);
            }
        }
        eprintln!("leaklab: the torch venv at {} is damaged (marker present, files missing); repairing it", venv.display());
        std::fs::remove_file(&marker).ok();
    }
    if !python.exists()
        || Command::new(&python)
            .arg("-c")
            .arg("pass")
            .output()
            .map(|o| !o.status.success())
            .unwrap_or(true)
    {
        create_venv(venv)?;
    }
    // A venv without the marker was never verified: it may be empty, half-installed by an
    // interrupted run, or fine. `probe_torch` tells which, and pip fills in what is missing.
    let lib = match probe_torch(&python) {
        Ok(lib) => lib,
        Err(first) => {
            eprintln!("leaklab: installing torch=={TORCH_VERSION} from PyPI into {} (about 4.6 GB, about a minute on a fast link)", venv.display());
            eprintln!("leaklab: ({first:#})");
            pip_install(&python, &[&format!("torch=={TORCH_VERSION}")])?;
            match probe_torch(&python) {
                Ok(lib) => lib,
                Err(_) => {
                    eprintln!("leaklab: torch still does not import; reinstalling it from scratch");
                    pip_install(
                        &python,
                        &["--force-reinstall", &format!("torch=={TORCH_VERSION}")],
                    )?;
                    probe_torch(&python)
                        .context("torch does not import even after a forced reinstall")?
                }
            }
        }
    };
    std::fs::write(
        &marker,
        format!("torch=={TORCH_VERSION}\nlib={}\n", lib.display()),
    )
    .with_context(|| format!("cannot write {}", marker.display()))?;
    eprintln!("leaklab: torch {TORCH_VERSION} ready in {}", venv.display());
    Ok(lib)
}

fn create_venv(venv: &Path) -> Result<()> {
    eprintln!(
        "leaklab: creating a Python virtual environment at {}",
        venv.display()
    );
    if venv.exists() {
        std::fs::remove_dir_all(venv)
            .with_context(|| format!("cannot remove the broken venv {}", venv.display()))?;
    }
    std::fs::create_dir_all(venv.parent().unwrap_or(venv))?;
    let python3 = env::var_os("PYTHON3").unwrap_or_else(|| "python3".into());
    let status = Command::new(&python3)
        .args(["-m", "venv"])
        .arg(venv)
        .status()
        .context("python3 is needed to provision torch (set PYTHON3 to point at one)")?;
    if !status.success() {
        bail!("`python3 -m venv {}` failed; on Debian/Ubuntu install the python3-venv package, or set LEAKLAB_PYTHON to a python with torch {TORCH_VERSION}", venv.display());
    }
    Ok(())
}

fn pip_install(python: &Path, args: &[&str]) -> Result<()> {
    let mut cmd = Command::new(python);
    cmd.args([
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--progress-bar",
        "off",
    ])
    .args(args);
    crate::process::run_heard(
        cmd,
        "pip install",
        "still installing",
        "pip says nothing while it unpacks what it downloaded",
    )
    .context("pip install failed (PyPI must be reachable)")
}

/// Imports torch with `python` and returns its lib dir when the version is the pinned one.
fn probe_torch(python: &Path) -> Result<PathBuf> {
    let script = "import os, torch; print(torch.__version__); print(os.path.join(os.path.dirname(torch.__file__), 'lib'))";
    let out = Command::new(python)
        .args(["-c", script])
        .output()
        .with_context(|| format!("cannot run {}", python.display()))?;
    if !out.status.success() {
        bail!(
            "`import torch` failed: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("no output")
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut lines = stdout.lines();
    let version = lines.next().unwrap_or_default();
    let lib = PathBuf::from(lines.next().unwrap_or_default());
    if version.split('+').next() != Some(TORCH_VERSION) {
        bail!("torch {version} found, {TORCH_VERSION} needed");
    }
    if !lib.join("libtorch_cpu.so").exists() {
        bail!(
            "torch imports but {} holds no libtorch_cpu.so",
            lib.display()
        );
    }
    Ok(lib)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_requirement_is_unmet_when_its_module_is_absent_or_its_pin_is_another_version() {
        // The standard library's modules, met by any python3; pip's own distribution for a pin.
        let pip = Command::new("python3")
            .args([
                "-c",
                "import importlib.metadata as m; print(m.version('pip'))",
            ])
            .output()
            .expect("python3 runs");
        let pip = String::from_utf8(pip.stdout).unwrap().trim().to_string();
        assert!(!pip.is_empty(), "python3 has pip");
        let pinned = format!("pip=={pip}");
        let packages = [
            ("json", "json"),
            ("pip", pinned.as_str()),
            ("pip", "pip==0.0.1"),
            ("no_such_module_here", "no-such-module-here"),
            ("json", "no-such-distribution==1.0"),
        ];
        assert_eq!(
            unmet(Path::new("python3"), &packages),
            [
                "pip==0.0.1",
                "no-such-module-here",
                "no-such-distribution==1.0"
            ]
        );
    }
}
