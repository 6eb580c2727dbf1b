//! The wheel as a Python engineer meets it: `pip install` of the built wheel into a virtual
//! environment that holds nothing else (not the torch venv) and fetches nothing (`--no-index`),
//! `leaklab` on PATH and behind `python -m leaklab`, the package importable without torch, and
//! one real `leaklab scan` of the lab's Python twin from the installed binary.
//! `cargo xtask test` packs the wheel from its dev build first and names it in LEAKLAB_WHEEL
//! (tagged `linux_x86_64`; `cargo xtask wheel` builds and checks the manylinux_2_28 release one).

mod common;

use common::{body, twin};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

fn wheel() -> PathBuf {
    PathBuf::from(std::env::var("LEAKLAB_WHEEL").expect("run through `cargo xtask test`, which builds the wheel (cargo xtask wheel) and sets LEAKLAB_WHEEL"))
}

fn output(cmd: &mut Command) -> (bool, String) {
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// A fresh venv from the machine's own python3, with the wheel and nothing else in it.
fn install(dir: &Path) -> PathBuf {
    let venv = dir.join("venv");
    let python3 = std::env::var("PYTHON3").unwrap_or_else(|_| "python3".into());
    let (ok, said) = output(Command::new(python3).args(["-m", "venv"]).arg(&venv));
    assert!(ok, "python3 -m venv: {said}");
    let started = Instant::now();
    let (ok, said) = output(
        Command::new(venv.join("bin/python"))
            .args([
                "-m",
                "pip",
                "install",
                "--no-index",
                "--disable-pip-version-check",
                "--quiet",
            ])
            .arg(wheel()),
    );
    assert!(ok, "pip install --no-index of the wheel: {said}");
    eprintln!(
        "installed {} into an empty venv in {:.2} s",
        wheel().display(),
        started.elapsed().as_secs_f64()
    );
    venv
}

#[test]
fn the_wheel_installs_into_an_empty_venv_and_its_binary_scans_the_twin() {
    let name = wheel().file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with("leaklab-")
            && name.contains("-py3-none-")
            && name.ends_with("linux_x86_64.whl"),
        "{name}"
    );
    let size = std::fs::metadata(wheel()).unwrap().len();
    // The goal is under 10 MB (measured 4.2 MB).
    assert!(size < 10_000_000, "the wheel is {size} bytes");
    let dir = tempfile::tempdir().unwrap();
    let venv = install(dir.path());
    let bin = venv.join("bin");

    let version = format!("leaklab {}", env!("CARGO_PKG_VERSION"));
    let (ok, said) = output(Command::new(bin.join("leaklab")).arg("--version"));
    assert!(ok && said.trim() == version, "{said}");
    let (ok, said) = output(Command::new(bin.join("python")).args(["-m", "leaklab", "--version"]));
    assert!(ok && said.trim() == version, "python -m leaklab: {said}");
    // The package imports without torch (the venv has none), and its finder names this binary.
    let (ok, said) = output(Command::new(bin.join("python")).args([
        "-c",
        "import sys, leaklab; assert 'torch' not in sys.modules; print(leaklab.find_leaklab_bin())",
    ]));
    assert!(
        ok && Path::new(said.trim()) == bin.join("leaklab"),
        "{said}"
    );
    let (ok, said) = output(Command::new(bin.join("python")).args(["-c", "import torch"]));
    assert!(!ok, "the venv must hold no torch: {said}");

    // One real scan of the twin's graph-leaky variant, by PID, from the installed binary.
    let service = twin("graph-leaky", &[]);
    let body = body(dir.path());
    let out = Command::new(bin.join("leaklab"))
        .args([
            "scan",
            &format!("{}/v1/infer", service.base),
            "--header",
            "content-type: application/json",
            "--vary",
            "--pid",
            &service.pid(),
            "--requests",
            "200",
            "--warmup",
            "20",
            "--capacity",
            "8GiB",
            "--rate",
            "5",
            "--fail-if-oom-within",
            "2d",
            "--json",
            "--out",
        ])
        .arg(dir.path().join("report"))
        .arg("--body")
        .arg(&body)
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(out.status.code(), Some(1), "graph-leaky fails: {report}");
    let anon = report["series"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["series"] == "anonymous")
        .unwrap();
    assert_eq!(anon["judgement"]["verdict"], "leak", "{anon}");
}
