//! `cargo xtask bench`: the criterion groups (the fixes, the probes and native-stack capture,
//! snapshot explain of every writer's shape at 1 GB and of 5 GB, fleet judging), the Python
//! agent's costs (crates/cli/python/bench/census_bench.py) and the pytest plugin's
//! (plugin_overhead.py), then the HTTP comparison with the
//! Python twin (`leaklab-lab bench`); writes docs/benchmarks.md.

use crate::process::run;
use crate::provision::{workspace_root, Torch};
use anyhow::{Context, Result};

pub fn run_all(torch: &Torch, args: &[String]) -> Result<()> {
    torch.ensure_python_packages()?;
    let pickled = python_pickled_snapshots(torch)?;
    let mut criterion = torch.cargo();
    criterion.env("LEAKLAB_SNAPSHOT_BENCH_FILES", pickled.join(","));
    criterion.args([
        "bench",
        "--package",
        "leaklab-service",
        "--bench",
        "fixes",
        "--package",
        "leaklab-probe",
        "--bench",
        "probe_overhead",
        "--package",
        "leaklab-snapshot",
        "--bench",
        "explain",
        "--package",
        "leaklab-fleet",
        "--bench",
        "fleet_judge",
    ]);
    run(criterion)?;
    agent_costs(torch)?;
    torch.lab(&["bench"], args)
}

/// 1 GB snapshots of three shapes written by CPython's own pickle (benches/python_snapshot.py),
/// bytes this project's writer did not produce, for the snapshot bench to read beside its own;
/// kept in target/snapshot-bench between runs (each takes minutes and 5 GB to write).
fn python_pickled_snapshots(torch: &Torch) -> Result<Vec<String>> {
    let dir = "target/snapshot-bench";
    std::fs::create_dir_all(workspace_root().join(dir))?;
    let mut files = Vec::new();
    for shape in ["shared", "fresh", "segments"] {
        let file = format!("{dir}/py-{shape}.pickle");
        if !workspace_root().join(&file).exists() {
            // Written under another name and renamed, so that an interrupted run leaves no
            // half file to be measured next time.
            let partial = format!("{file}.partial");
            let mut cmd = torch.python_command("the snapshot bench's CPython files")?;
            cmd.args([
                "crates/snapshot/benches/python_snapshot.py",
                &partial,
                "1024",
                shape,
            ]);
            run(cmd)?;
            std::fs::rename(
                workspace_root().join(&partial),
                workspace_root().join(&file),
            )?;
        }
        files.push(file);
    }
    Ok(files)
}

/// The middleware's cost per request, the census's time and pause, and the native trace's
/// window, written where `leaklab bench` reads them (target/criterion/agent/census.json and
/// native.json).
fn agent_costs(torch: &Torch) -> Result<()> {
    let out = workspace_root().join("target/criterion/agent");
    std::fs::create_dir_all(&out)?;
    let output = torch
        .python_command("the agent's bench")?
        .arg("crates/cli/python/bench/census_bench.py")
        .output()
        .context("run census_bench.py")?;
    anyhow::ensure!(
        output.status.success(),
        "census_bench.py failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    std::fs::write(out.join("census.json"), output.stdout)?;
    let output = torch
        .python_command("the native trace's bench")?
        .arg("crates/cli/python/bench/native_window.py")
        .output()
        .context("run native_window.py")?;
    anyhow::ensure!(
        output.status.success(),
        "native_window.py failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    std::fs::write(out.join("native.json"), output.stdout)?;
    // The judge a user's check runs: the wheel's binary, a release build (the tests' wheel
    // carries the dev build, 15 ms a judgement against 4 ms).
    let leaklab = torch.release_leaklab()?;
    let mut plugin = torch.python_command("the pytest plugin's bench")?;
    plugin
        .env("LEAKLAB_BIN", leaklab)
        .args([
            "crates/cli/python/bench/plugin_overhead.py",
            "--repeat",
            "5",
            "--json",
        ])
        .arg(out.join("plugin.json"));
    run(plugin).context("plugin_overhead.py failed")?;
    Ok(())
}
