//! `cargo xtask test`: everything CI runs. The wheel built first (its test installs it into an
//! empty venv), the Python packages, Prometheus (server and promtool, for the fleet tests) and
//! chromium (for the report pages) installed; unit, integration and doc tests (the benches once
//! each in test mode); the Python package's own suite (pytest over the installed wheel, ruff,
//! mypy --strict); the alert rules under promtool, the Kubernetes manifests validated, and the
//! device bundle built and run here on CPU. Extra arguments go to `cargo test` and skip the
//! steps after it.

use crate::process::run;
use crate::provision::{workspace_root, Torch};
use anyhow::{Context, Result};
use std::path::Path;
use std::process::Command;

pub fn run_all(torch: &Torch, args: &[String]) -> Result<()> {
    torch.ensure_python_packages()?;
    let promtool = crate::apt::ensure("promtool", "prometheus");
    // The report pages are opened in a real browser by crates/cli/tests/html.rs.
    if !crate::apt::ensure("chromium", "chromium") {
        eprintln!("leaklab: SKIPPED the report pages in a browser: chromium is not installed and could not be (apt-get install chromium)");
    }
    let wheel = crate::wheel::build()?;
    let mut all = torch.cargo();
    all.env("LEAKLAB_WHEEL", &wheel).args(["test", "--workspace", "--no-fail-fast", "--all-targets"]).args(args);
    let mut docs = torch.cargo();
    docs.args(["test", "--workspace", "--no-fail-fast", "--doc"]).args(args);
    let (all, docs) = (run(all), run(docs));
    all.and(docs)?;
    if args.is_empty() {
        python_package(torch, &wheel)?;
        promtool_rules(promtool)?;
        kubernetes(torch, promtool)?;
        crate::bundle::build_and_smoke(torch)?;
    }
    Ok(())
}

/// The Python package as its users get it: the wheel installed into the torch venv (so the
/// pytest11 entry point is registered as pip registers it), its suite under pytest, and the
/// package's source under ruff and mypy --strict.
fn python_package(torch: &Torch, wheel: &Path) -> Result<()> {
    let package = workspace_root().join("crates/cli/python");
    let python = || torch.python_command("the Python package's tests");
    let mut install = python()?;
    install.args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-index", "--no-deps", "--force-reinstall"]).arg(wheel);
    run(install).context("the wheel does not install into the torch venv")?;
    let mut ruff = python()?;
    ruff.args(["-m", "ruff", "check"]).arg(&package);
    run(ruff).context("ruff finds problems in crates/cli/python")?;
    let mut format = python()?;
    format.args(["-m", "ruff", "format", "--check"]).arg(&package);
    run(format).context("crates/cli/python is not formatted: run `ruff format crates/cli/python`")?;
    let mut mypy = python()?;
    mypy.args(["-m", "mypy", "--strict", "--config-file"]).arg(workspace_root().join("crates/cli/pyproject.toml")).arg(package.join("leaklab"));
    run(mypy).context("mypy --strict finds problems in the leaklab package")?;
    let mut pytest = python()?;
    pytest.args(["-m", "pytest", "-q", "-p", "no:cacheprovider"]).arg(package.join("tests"));
    run(pytest).context("the Python package's tests failed")
}

/// `promtool test rules` on the alert rules.
fn promtool_rules(installed: bool) -> Result<()> {
    if !installed {
        eprintln!("leaklab: SKIPPED promtool test rules: promtool is not installed and could not be (apt-get install prometheus)");
        return Ok(());
    }
    let mut cmd = Command::new("promtool");
    cmd.current_dir(workspace_root().join("docs/prometheus")).args(["test", "rules", "leaklab-alerts.test.yml"]);
    run(cmd).context("the alert rules' promtool test failed")
}

/// docs/kubernetes: the core objects under `kubernetes-validate --strict`, and the
/// PrometheusRule's groups, which must be docs/prometheus/leaklab-alerts.yml's `groups` indented
/// under `spec:`, under `promtool check rules`.
fn kubernetes(torch: &Torch, promtool: bool) -> Result<()> {
    let dir = workspace_root().join("docs/kubernetes");
    let validator = torch.python.as_ref().map(|p| p.with_file_name("kubernetes-validate"));
    match validator.filter(|v| v.exists()) {
        Some(v) => {
            let mut cmd = Command::new(v);
            cmd.args(["--strict", "--quiet"]).arg(dir.join("inference.yaml"));
            run(cmd).context("docs/kubernetes/inference.yaml does not validate")?;
        }
        None => eprintln!("leaklab: SKIPPED kubernetes-validate: no python environment to install it in"),
    }
    let rules = std::fs::read_to_string(workspace_root().join("docs/prometheus/leaklab-alerts.yml"))?;
    let monitoring = std::fs::read_to_string(dir.join("monitoring.yaml"))?;
    let embedded = monitoring.split_once("kind: PrometheusRule").and_then(|(_, rest)| rest.split_once("\nspec:\n")).map(|(_, spec)| spec).context("monitoring.yaml has no PrometheusRule spec")?;
    let groups: String = embedded.lines().map(|l| l.strip_prefix("  ").unwrap_or(l)).map(|l| format!("{l}\n")).collect();
    let expected = &rules[rules.find("groups:").context("no groups in leaklab-alerts.yml")?..];
    anyhow::ensure!(groups == expected, "docs/kubernetes/monitoring.yaml's PrometheusRule is not docs/prometheus/leaklab-alerts.yml's groups: copy them over (indented two spaces under spec:)");
    if promtool {
        let extracted = workspace_root().join("target/leaklab/prometheus-rule-groups.yml");
        std::fs::create_dir_all(extracted.parent().unwrap())?;
        std::fs::write(&extracted, groups)?;
        let mut cmd = Command::new("promtool");
        cmd.args(["check", "rules"]).arg(&extracted);
        run(cmd).context("the PrometheusRule's rules do not pass promtool check rules")?;
    }
    Ok(())
}
