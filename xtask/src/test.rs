//! `cargo xtask test`: everything CI runs, cheapest first, every step timed (a table at the end).
//!
//! 1. What the tests need: the Python packages, Debian's prometheus (promtool) and chromium.
//!    Under `CI=true` a missing one fails the run; elsewhere it is a SKIPPED row in the table.
//! 2. The cheap checks, failing fast before any big build: tidy (the xtask's own tests), ruff,
//!    ruff format --check, mypy --strict, promtool's rule tests, the Kubernetes manifests,
//!    `cargo fmt --check`. clippy (`-D warnings`) lints every workspace crate inside the build.
//! 3. One dev-profile build of every crate and test (the GPU tests compiled, not run), the
//!    tests' wheel packed from that build's `leaklab` and installed into the torch venv, the
//!    Rust tests and the Python suite (a test per pytest module, crates/cli/tests/python.rs)
//!    under cargo-nextest in one pool (`.config/nextest.toml`: the slow ones first, the
//!    timing-sensitive ones alone), the benches once each in test mode, the doc tests, and the
//!    device bundle's launcher run here on CPU from the same dev binaries.
//! 4. The table, and the tests left to the device check (the `gpu` binary, `#[ignore = "needs
//!    a GPU"]`).
//!
//! Extra arguments go to `cargo nextest run` (a filter, `--no-capture`) and leave out every
//! step that the tests do not need.

use crate::process::run;
use crate::provision::{workspace_root, Torch};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use yaml_rust2::{Yaml, YamlEmitter, YamlLoader};

/// What every cargo command of the run selects, so that each crate is built once: the whole
/// workspace but the xtask (whose tests, tidy, run first on their own), with the GPU tests
/// compiled (their binary is left out of the run and listed; the device check runs it).
const SELECTION: [&str; 5] = [
    "--workspace",
    "--exclude",
    "xtask",
    "--features",
    "leaklab-service/gpu-tests,leaklab-runner/instrument",
];

/// What nextest runs: every target but the benches, whose mains (criterion's, or the snapshot
/// reader's own) cannot answer nextest's `--list`; `cargo test --bench '*'` runs those once each.
const NEXTEST_TARGETS: [&str; 4] = ["--lib", "--bins", "--tests", "--examples"];

/// The test binary that needs a CUDA device (`crates/service/tests/gpu.rs`).
const GPU_BINARY: &str = "leaklab-service::gpu";

pub fn run_all(torch: &Torch, args: &[String]) -> Result<()> {
    let mut steps = Steps::default();
    let result = pipeline(torch, args, &mut steps);
    steps.print();
    result
}

fn pipeline(torch: &Torch, args: &[String], steps: &mut Steps) -> Result<()> {
    steps.run("python packages", || torch.ensure_python_packages())?;
    let promtool = steps.need(
        "promtool",
        "prometheus",
        "the alert rules' tests and the fleet tests",
    )?;
    steps.need(
        "chromium",
        "chromium",
        "the report pages in a browser (crates/cli/tests/html.rs)",
    )?;
    let runner = steps.run("cargo-nextest", nextest)?;
    lint_in_build(steps)?;
    if ci() {
        // CI builds once, from nothing: incremental compilation's records are work nobody reads
        // there (docs/ci.md: with the dependency trims, 715 s of CPU for the build became 656 s).
        // SAFETY (edition 2021: set_var is safe): one thread, before any child starts.
        std::env::set_var("CARGO_INCREMENTAL", "0");
    }
    if args.is_empty() {
        // tidy reads the dependency trees offline (`cargo tree --offline`): on a fresh machine
        // the crates the xtask's own build fetched are not all of them.
        steps.run("crates downloaded (cargo fetch)", || {
            let mut fetch = torch.cargo();
            fetch.arg("fetch");
            run(fetch)
        })?;
        cheap_checks(torch, promtool, steps)?;
    }
    steps.run("build (dev, every crate and test)", || {
        let mut build = torch.cargo();
        build
            .args(["test", "--no-run", "--all-targets"])
            .args(SELECTION);
        crate::process::run_built(build, "the tests' build")
    })?;
    let leaklab = workspace_root().join("target/debug/leaklab");
    let wheel = steps.run("wheel (dev, for the tests)", || {
        crate::wheel::build_for_tests(&leaklab)
    })?;
    // The Python suite runs in the Rust tests' pool (crates/cli/tests/python.rs), over the
    // wheel installed here first, before any service imports the package.
    steps.run("wheel installed into the torch venv", || {
        install_wheel(torch, &wheel)
    })?;
    // From here on every step runs, and the run fails at the end if any did.
    let mut failed = Vec::new();
    let rust = steps.run("rust and python tests", || {
        rust_tests(torch, runner, &wheel, args)
    });
    failed.extend(rust.err());
    let listed = steps.run("device-only tests listed", || device_only(torch, runner));
    if args.is_empty() {
        // The bundle's smoke run needs no cargo, whose lock would queue it behind the two
        // cargo steps, and the benches keep at most one core busy: it runs beside them.
        std::thread::scope(|scope| {
            let smoke = scope.spawn(|| {
                timed(|| match &listed {
                    Ok(device) => crate::bundle::smoke_dev(torch, &device.gpu_binary),
                    Err(e) => Err(anyhow::anyhow!("no GPU test binary to bundle: {e:#}")),
                })
            });
            let benches = steps.run("benches (test mode, once each)", || {
                let mut benches = torch.cargo();
                benches
                    // The bench targets alone: `--benches` also takes every lib and bin (their
                    // `bench = true` default), which ran the unit tests the pool had run again
                    // and built the harness of each main that has none (`test = false`).
                    .args(["test", "--no-fail-fast", "--bench", "*"])
                    .args(SELECTION);
                run(benches)
            });
            failed.extend(benches.err());
            let docs = steps.run("doc tests", || {
                let mut docs = torch.cargo();
                docs.args(["test", "--no-fail-fast", "--doc"])
                    .args(SELECTION);
                run(docs)
            });
            failed.extend(docs.err());
            let (smoke, took) = smoke.join().unwrap_or_else(|_| {
                (
                    Err(anyhow::anyhow!("the smoke run panicked")),
                    Duration::ZERO,
                )
            });
            steps.record_beside(
                "device bundle (dev) on CPU, beside the two above",
                took,
                Outcome::of(&smoke),
            );
            failed.extend(smoke.err());
        });
    }
    match listed {
        Ok(device) => steps.device_only = device.tests,
        Err(e) => failed.push(e),
    }
    // The Python suite's one device-only test: it skips here, gpu-check.sh runs it.
    steps.device_only.push(format!(
        "crates/cli/python/tests/{}",
        crate::bundle::PYTHON_CUDA_TEST
    ));
    none_failed(&failed, "step")
}

/// Ok where `failed` is empty; else one error that lists each, `what` naming what failed.
fn none_failed(failed: &[anyhow::Error], what: &str) -> Result<()> {
    if failed.is_empty() {
        return Ok(());
    }
    let each: Vec<String> = failed.iter().map(|e| format!("{e:#}")).collect();
    bail!(
        "{} {what}(s) failed:\n  {}",
        failed.len(),
        each.join("\n  ")
    )
}

/// A check of [`cheap_checks`]: its row's name and what it runs.
type Check<'a> = (&'static str, Box<dyn FnOnce() -> Result<()> + Send + 'a>);

/// Each check here takes seconds and needs no build of the workspace. They run side by side
/// (one process each, mostly one core: 11 s one after another, 2026-12-06), each with its row,
/// and the run ends after them if any failed.
fn cheap_checks(torch: &Torch, promtool: bool, steps: &mut Steps) -> Result<()> {
    let package = workspace_root().join("crates/cli/python");
    let zoo = workspace_root().join("lab/zoo");
    // The judge's corpus: its subjects and its recorder.
    let corpus = workspace_root().join("lab/corpus");
    // The twin and the lab's other Python: linted, not yet formatted by ruff.
    let lab_python = workspace_root().join("lab/python");
    let python = || torch.python_command("the Python package's checks");
    let mut checks: Vec<Check> = vec![
        (
            "tidy (cargo test -p xtask)",
            Box::new(|| {
                let mut tidy = torch.cargo();
                tidy.args(["test", "--quiet", "--package", "xtask", "--", "--nocapture"]);
                run(tidy).context("tidy: the house rules are broken (xtask/src/tidy.rs)")
            }),
        ),
        (
            "ruff check",
            Box::new(|| {
                let mut ruff = python()?;
                ruff.args(["-m", "ruff", "check"])
                    .arg(&package)
                    .arg(&zoo)
                    .arg(&corpus)
                    .arg(&lab_python);
                run(ruff).context(
                    "ruff finds problems in crates/cli/python, lab/zoo, lab/corpus or lab/python",
                )
            }),
        ),
        (
            "ruff format --check",
            Box::new(|| {
                let mut format = python()?;
                format
                    .args(["-m", "ruff", "format", "--check"])
                    .arg(&package)
                    .arg(&zoo)
                    .arg(&corpus);
                run(format).context(
                    "not formatted: run `ruff format crates/cli/python lab/zoo lab/corpus`",
                )
            }),
        ),
        (
            "mypy --strict",
            Box::new(|| {
                let mut mypy = python()?;
                let config = workspace_root().join("crates/cli/pyproject.toml");
                mypy.args(["-m", "mypy", "--strict", "--config-file"])
                    .arg(config)
                    .arg(package.join("leaklab"));
                run(mypy).context("mypy --strict finds problems in the leaklab package")
            }),
        ),
    ];
    if promtool {
        checks.push((
            "promtool test rules",
            Box::new(|| {
                let mut cmd = Command::new("promtool");
                cmd.current_dir(workspace_root().join("docs/prometheus"))
                    .args(["test", "rules", "leaklab-alerts.test.yml"]);
                run(cmd).context("the alert rules' promtool test failed")
            }),
        ));
    }
    checks.push((
        "kubernetes manifests",
        Box::new(|| kubernetes(torch, promtool)),
    ));
    checks.push((
        "cargo fmt --check",
        Box::new(|| {
            let mut fmt = torch.cargo();
            fmt.args(["fmt", "--all", "--check"]);
            run(fmt).context("the tree is not formatted: run `cargo fmt --all` (rustfmt.toml)")
        }),
    ));
    let started = Instant::now();
    let done: Vec<(&str, Duration, Result<()>)> = std::thread::scope(|scope| {
        let running: Vec<_> = checks
            .into_iter()
            .map(|(name, check)| {
                eprintln!("leaklab: ── {name}");
                (name, scope.spawn(move || timed(check)))
            })
            .collect();
        running
            .into_iter()
            .map(|(name, thread)| {
                let (result, took) = thread
                    .join()
                    .unwrap_or_else(|_| (Err(anyhow::anyhow!("{name} panicked")), Duration::ZERO));
                (name, took, result)
            })
            .collect()
    });
    let mut failed = Vec::new();
    for (name, took, result) in done {
        steps.record_beside(name, took, Outcome::of(&result));
        failed.extend(result.err());
    }
    let all = none_failed(&failed, "cheap check");
    steps.record(
        "the cheap checks above, side by side",
        started.elapsed(),
        Outcome::of(&all),
    );
    all
}

/// clippy, `-D warnings`, inside the build itself: cargo runs every workspace crate's compiler
/// through clippy-driver (`RUSTC_WORKSPACE_WRAPPER`, what `cargo clippy` sets, with the same
/// `CLIPPY_ARGS`), which lints and then compiles as rustc does. The dependencies are not
/// wrapped, so clippy adds its lint passes over the workspace and nothing else: a separate
/// `cargo clippy` re-checked every dependency (12 min 25 s on two loaded cores, 2026-12-05).
/// Set for every cargo command of the run, so none rebuilds what another built; where
/// clippy-driver is missing (no clippy component), the lints are off, which CI refuses.
fn lint_in_build(steps: &mut Steps) -> Result<()> {
    let driver = Command::new("rustup")
        .args(["which", "clippy-driver"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|p| !p.is_empty());
    match driver {
        Some(driver) => {
            // SAFETY (edition 2021: set_var is safe): one thread, before any child starts.
            std::env::set_var("RUSTC_WORKSPACE_WRAPPER", driver);
            std::env::set_var(
                "CLIPPY_ARGS",
                "-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__",
            );
            steps.record(
                "clippy -D warnings (in the build)",
                Duration::ZERO,
                Outcome::Passed,
            );
            Ok(())
        }
        None if ci() => {
            steps.record(
                "clippy -D warnings (in the build)",
                Duration::ZERO,
                Outcome::Failed,
            );
            bail!("clippy-driver is missing (rustup component add clippy), and CI=true")
        }
        None => {
            eprintln!(
                "leaklab: SKIPPED clippy: clippy-driver is missing (rustup component add clippy)"
            );
            steps.record(
                "clippy -D warnings (in the build)",
                Duration::ZERO,
                Outcome::Skipped,
            );
            Ok(())
        }
    }
}

/// Whether this is a CI run (`CI=true`, as CI services set it, and as `.ci/run` does): there a
/// missing dependency fails instead of being skipped.
fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !matches!(v.as_str(), "" | "0" | "false"))
}

/// How the Rust tests run.
#[derive(Clone, Copy, PartialEq)]
enum Runner {
    /// cargo-nextest: every test a process, one pool for all binaries.
    Nextest,
    /// `cargo test`, binary after binary: where nextest is missing and cannot be installed.
    CargoTest,
}

/// cargo-nextest, installed with `cargo install --locked` where missing (about 5 minutes once
/// per machine); `cargo test` if that fails too, which is slower but runs the same tests.
fn nextest() -> Result<Runner> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let present = || {
        Command::new(&cargo)
            .args(["nextest", "--version"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if present() {
        return Ok(Runner::Nextest);
    }
    eprintln!(
        "leaklab: cargo-nextest is missing; installing it (cargo install cargo-nextest --locked)"
    );
    let installed = Command::new(&cargo)
        .args(["install", "cargo-nextest", "--locked"])
        .status()
        .is_ok_and(|s| s.success());
    if installed && present() {
        return Ok(Runner::Nextest);
    }
    eprintln!("leaklab: cargo-nextest could not be installed: the Rust tests run under `cargo test`, one binary after another");
    Ok(Runner::CargoTest)
}

fn rust_tests(torch: &Torch, runner: Runner, wheel: &Path, args: &[String]) -> Result<()> {
    let mut tests = torch.cargo();
    tests.env("LEAKLAB_WHEEL", wheel);
    // Two tests share two cores, each with services whose OpenMP threads spin between
    // parallel regions by default (libgomp's spin: 10.8 % of a drill service's CPU samples
    // under `perf`, 2026-12-05): idle threads sleep instead, so the tests' CPU goes to work.
    tests.env("OMP_WAIT_POLICY", "PASSIVE");
    match runner {
        Runner::Nextest => {
            // The GPU binary is left out by the profile's default-filter, which bounds any
            // filter given here (filtersets on the command line are a union).
            // A slot per core for the tests that keep one busy (the `busy` test group in
            // .config/nextest.toml) and one more for the watch's, which mostly wait.
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            tests
                .args(["nextest", "run", "--no-fail-fast"])
                .arg(format!("--test-threads={}", cores + 1))
                .args(NEXTEST_TARGETS)
                .args(SELECTION)
                .args(args);
        }
        Runner::CargoTest => {
            // libtest cannot leave out one binary: the GPU tests are skipped by their names.
            let mut skip = vec!["--".to_string(), "--exact".to_string()];
            for name in gpu_test_names(torch)? {
                skip.extend(["--skip".to_string(), name]);
            }
            tests
                .args(["test", "--no-fail-fast"])
                .args(NEXTEST_TARGETS)
                .args(SELECTION)
                .args(args)
                .args(skip);
        }
    }
    run(tests).context("Rust tests failed")
}

/// The tests that only the device check runs, and the GPU test binary it bundles.
struct DeviceOnly {
    tests: Vec<String>,
    gpu_binary: PathBuf,
}

/// nextest's list (JSON, `--run-ignored all`, and past the default filter, without which the
/// GPU binary's tests go unlisted): every test of the GPU binary and every test anywhere that
/// carries `#[ignore = "needs a GPU"]`.
fn device_only(torch: &Torch, runner: Runner) -> Result<DeviceOnly> {
    if runner == Runner::CargoTest {
        let gpu_binary = gpu_binary_from_cargo(torch)?;
        let tests = gpu_test_names(torch)?
            .into_iter()
            .map(|t| format!("{GPU_BINARY} {t}"))
            .collect();
        return Ok(DeviceOnly { tests, gpu_binary });
    }
    let mut list = torch.cargo();
    list.args([
        "nextest",
        "list",
        "--run-ignored",
        "all",
        "--ignore-default-filter",
        "--message-format",
        "json",
    ])
    .args(NEXTEST_TARGETS)
    .args(SELECTION);
    if let Some(binaries) = device_only_binaries() {
        list.args(["-E", &binaries]);
    }
    let output = list.output().context("cannot run cargo nextest list")?;
    if !output.status.success() {
        bail!(
            "cargo nextest list failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    parse_list(&String::from_utf8_lossy(&output.stdout))
}

/// The binaries that can hold a device-only test, as a nextest filter that names binaries only
/// (nextest then lists no other binary): the GPU binary and each integration test
/// (`tests/NAME.rs`) that carries the GPU ignore, the one ignore tidy allows. `None` where one
/// sits anywhere else (a unit test, a module a test includes): then every binary is listed.
/// Each binary that links libtorch loads it to list its tests: all of them took 10.3 s, these
/// two 2.2 s (2026-12-06).
fn device_only_binaries() -> Option<String> {
    let ignore = ["#[", "ignore = \"needs a GPU\"]"].concat();
    let mut filter = vec![format!("binary_id({GPU_BINARY})")];
    let mut dirs = vec![
        workspace_root().join("crates"),
        workspace_root().join("lab"),
    ];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).ok()?.flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let is_rust = path.extension().is_some_and(|e| e == "rs");
            if !is_rust || !std::fs::read_to_string(&path).ok()?.contains(&ignore) {
                continue;
            }
            let in_tests = path.parent()?.file_name()? == "tests";
            if !in_tests {
                return None;
            }
            filter.push(format!("binary(={})", path.file_stem()?.to_str()?));
        }
    }
    Some(filter.join(" | "))
}

fn parse_list(json: &str) -> Result<DeviceOnly> {
    let list: serde_json::Value =
        serde_json::from_str(json).context("cargo nextest list printed no JSON list")?;
    let suites = list["rust-suites"]
        .as_object()
        .context("cargo nextest list printed no rust-suites")?;
    let gpu = suites
        .get(GPU_BINARY)
        .with_context(|| format!("no {GPU_BINARY} test binary in the list"))?;
    fn cases(suite: &serde_json::Value) -> impl Iterator<Item = (&String, &serde_json::Value)> {
        suite["testcases"].as_object().into_iter().flatten()
    }
    if cases(gpu).next().is_none() {
        bail!("the {GPU_BINARY} binary lists no tests");
    }
    let gpu_binary = gpu["binary-path"]
        .as_str()
        .map(PathBuf::from)
        .with_context(|| format!("the {GPU_BINARY} binary has no binary-path"))?;
    let mut tests = Vec::new();
    for (id, suite) in suites {
        for (name, case) in cases(suite) {
            if case["ignored"] == true || id == GPU_BINARY {
                tests.push(format!("{id} {name}"));
            }
        }
    }
    Ok(DeviceOnly { tests, gpu_binary })
}

/// Where cargo put the GPU test binary (already built: this only asks).
fn gpu_binary_from_cargo(torch: &Torch) -> Result<PathBuf> {
    let mut cargo = torch.cargo();
    cargo
        .args([
            "test",
            "--no-run",
            "--all-targets",
            "--message-format",
            "json",
        ])
        .args(SELECTION);
    let output = cargo.output().context("cannot run cargo test --no-run")?;
    let name = GPU_BINARY.rsplit("::").next().unwrap_or(GPU_BINARY);
    crate::bundle::test_executable(&String::from_utf8_lossy(&output.stdout), name)
        .context("cargo did not report the GPU test binary")
}

/// The GPU binary's tests, as it lists them itself.
fn gpu_test_names(torch: &Torch) -> Result<Vec<String>> {
    let binary = gpu_binary_from_cargo(torch)?;
    let output = Command::new(&binary)
        .args(["--list", "--format", "terse"])
        .envs(torch.env())
        .output()?;
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .map(String::from)
        .collect())
}

/// The Python package as its users get it: the wheel installed into the torch venv (so the
/// pytest11 entry point is registered as pip registers it), and its suite under pytest.
fn install_wheel(torch: &Torch, wheel: &Path) -> Result<()> {
    let mut install = torch.python_command("the Python package's tests")?;
    install
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-index",
            "--no-deps",
            "--force-reinstall",
        ])
        .arg(wheel);
    run(install).context("the wheel does not install into the torch venv")
}

/// docs/kubernetes: the core objects under `kubernetes-validate --strict`, and the
/// PrometheusRule, whose `spec.groups` must be docs/prometheus/leaklab-alerts.yml's `groups`
/// (compared parsed, so layout and comments may differ), under `promtool check rules`.
fn kubernetes(torch: &Torch, promtool: bool) -> Result<()> {
    let dir = workspace_root().join("docs/kubernetes");
    let validator = torch
        .python
        .as_ref()
        .map(|p| p.with_file_name("kubernetes-validate"))
        .filter(|v| v.exists());
    match validator {
        Some(v) => {
            let mut cmd = Command::new(v);
            cmd.args(["--strict", "--quiet"])
                .arg(dir.join("inference.yaml"))
                .arg(dir.join("watch.yaml"));
            run(cmd).context("docs/kubernetes/inference.yaml or watch.yaml does not validate")?;
        }
        None if ci() => bail!("kubernetes-validate is missing and CI=true: it is installed into the torch venv (unset LIBTORCH or set LEAKLAB_PYTHON)"),
        None => eprintln!("leaklab: SKIPPED kubernetes-validate: no python environment to install it in"),
    }
    let rules =
        std::fs::read_to_string(workspace_root().join("docs/prometheus/leaklab-alerts.yml"))?;
    let monitoring = std::fs::read_to_string(dir.join("monitoring.yaml"))?;
    let groups = same_rule_groups(&rules, &monitoring)?;
    if promtool {
        let extracted = workspace_root().join("target/leaklab/prometheus-rule-groups.yml");
        std::fs::create_dir_all(extracted.parent().context("a parent folder")?)?;
        std::fs::write(&extracted, groups)?;
        let mut cmd = Command::new("promtool");
        cmd.args(["check", "rules"]).arg(&extracted);
        run(cmd).context("the PrometheusRule's rules do not pass promtool check rules")?;
    }
    Ok(())
}

/// Checks that the PrometheusRule document of `monitoring` (a multi-document manifest) carries
/// exactly the `groups` of `rules` under its `spec`, and returns them as a rules file.
fn same_rule_groups(rules: &str, monitoring: &str) -> Result<String> {
    let rules = YamlLoader::load_from_str(rules).context("leaklab-alerts.yml is not YAML")?;
    let expected = rules
        .first()
        .map(|doc| &doc["groups"])
        .filter(|groups| !groups.is_badvalue())
        .context("leaklab-alerts.yml has no groups")?;
    let manifests = YamlLoader::load_from_str(monitoring).context("monitoring.yaml is not YAML")?;
    let rule = manifests
        .iter()
        .find(|doc| doc["kind"].as_str() == Some("PrometheusRule"))
        .context("monitoring.yaml has no PrometheusRule")?;
    let embedded = &rule["spec"]["groups"];
    if embedded.is_badvalue() {
        bail!("monitoring.yaml's PrometheusRule has no spec.groups");
    }
    if embedded != expected {
        bail!("docs/kubernetes/monitoring.yaml's PrometheusRule is not docs/prometheus/leaklab-alerts.yml's groups: copy them over (under spec:)");
    }
    let mut file = yaml_rust2::yaml::Hash::new();
    file.insert(Yaml::String("groups".into()), embedded.clone());
    let mut text = String::new();
    YamlEmitter::new(&mut text)
        .dump(&Yaml::Hash(file))
        .context("cannot write the rule groups as YAML")?;
    Ok(text)
}

/// How a step ended.
#[derive(Clone, Copy, PartialEq)]
enum Outcome {
    Passed,
    Failed,
    /// Not run: a dependency is missing (never under CI).
    Skipped,
}

impl Outcome {
    fn of<T>(result: &Result<T>) -> Outcome {
        if result.is_ok() {
            Outcome::Passed
        } else {
            Outcome::Failed
        }
    }
}

/// `step`'s result and how long it took.
fn timed<T>(step: impl FnOnce() -> T) -> (T, Duration) {
    let started = Instant::now();
    let result = step();
    (result, started.elapsed())
}

/// The steps as they ran, for the table at the end.
#[derive(Default)]
struct Steps {
    rows: Vec<(String, Duration, Outcome)>,
    /// Time of steps that ran beside others: in their rows, not in the total.
    beside: Duration,
    device_only: Vec<String>,
}

impl Steps {
    fn run<T>(&mut self, name: &str, step: impl FnOnce() -> Result<T>) -> Result<T> {
        eprintln!("leaklab: ── {name}");
        let (result, took) = timed(step);
        self.record(name, took, Outcome::of(&result));
        result
    }

    fn record(&mut self, name: &str, took: Duration, outcome: Outcome) {
        eprintln!(
            "leaklab: ── {name}: {:.1} s{}",
            took.as_secs_f64(),
            if outcome == Outcome::Failed {
                ", FAILED"
            } else {
                ""
            }
        );
        self.rows.push((name.to_string(), took, outcome));
    }

    /// [`Steps::record`] for a step that ran beside the others, so the total stays the wall time.
    fn record_beside(&mut self, name: &str, took: Duration, outcome: Outcome) {
        self.beside += took;
        self.record(name, took, outcome);
    }

    /// Makes `program` available (Debian's `package`, see [`crate::apt`]); false where it is
    /// missing and this is not CI, an error under CI.
    fn need(&mut self, program: &str, package: &str, for_what: &str) -> Result<bool> {
        let name = format!("{program} (apt {package})");
        let present = self.run(&name, || Ok(crate::apt::ensure(program, package)))?;
        if present {
            return Ok(true);
        }
        if ci() {
            self.rows.last_mut().expect("just recorded").2 = Outcome::Failed;
            bail!("{program} is missing and could not be installed (apt-get install {package}), and CI=true: {for_what} cannot run");
        }
        eprintln!("leaklab: SKIPPED {for_what}: {program} is not installed and could not be (apt-get install {package})");
        self.rows.last_mut().expect("just recorded").2 = Outcome::Skipped;
        Ok(false)
    }

    fn print(&self) {
        let total = self.rows.iter().map(|r| r.1).sum::<Duration>() - self.beside;
        let width = self
            .rows
            .iter()
            .map(|r| r.0.chars().count())
            .max()
            .unwrap_or(4)
            .max(5);
        println!("\n{:<width$}  {:>7}  result", "step", "seconds");
        println!("{:-<width$}  {:-<7}  {:-<7}", "", "", "");
        for (name, took, outcome) in &self.rows {
            let result = match outcome {
                Outcome::Passed => "ok",
                Outcome::Failed => "FAILED",
                Outcome::Skipped => "SKIPPED",
            };
            println!("{name:<width$}  {:>7.1}  {result}", took.as_secs_f64());
        }
        println!("{:<width$}  {:>7.1}", "total", total.as_secs_f64());
        if !self.device_only.is_empty() {
            println!(
                "\nNot run here, run by the device check (gpu-check.sh): {} tests",
                self.device_only.len()
            );
            for test in &self.device_only {
                println!("  {test}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: &str = "# comment\ngroups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up == 0\n        for: 5m\n";

    #[test]
    fn the_rule_groups_compare_parsed_not_as_text() {
        // The same groups, laid out as a manifest does: indented, flow style, other quotes.
        let monitoring = "kind: PodMonitor\nspec: {}\n---\napiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nspec:\n  groups:\n  - name: 'g'\n    rules: [{alert: A, expr: \"up == 0\", for: 5m}]\n";
        let groups = same_rule_groups(RULES, monitoring).unwrap();
        assert_eq!(
            YamlLoader::load_from_str(&groups).unwrap()[0],
            YamlLoader::load_from_str(RULES).unwrap()[0]
        );
        let changed = monitoring.replace("for: 5m", "for: 10m");
        assert!(same_rule_groups(RULES, &changed)
            .unwrap_err()
            .to_string()
            .contains("copy them over"));
        assert!(same_rule_groups(RULES, "kind: PodMonitor\n")
            .unwrap_err()
            .to_string()
            .contains("no PrometheusRule"));
    }

    #[test]
    fn nextests_default_filter_leaves_out_the_gpu_binary() {
        let config =
            std::fs::read_to_string(workspace_root().join(".config/nextest.toml")).unwrap();
        assert!(
            config.contains(&format!(
                "\ndefault-filter = 'not binary_id({GPU_BINARY})'\n"
            )),
            "{config}"
        );
    }

    #[test]
    fn the_device_list_asks_for_the_gpu_binary_and_the_zoo() {
        // The zoo's CUDA entries are today's only ignored tests (crates/runner/tests/zoo.rs).
        assert_eq!(
            device_only_binaries().as_deref(),
            Some("binary_id(leaklab-service::gpu) | binary(=zoo)")
        );
    }

    #[test]
    fn the_device_only_tests_are_read_from_nextests_list() {
        // Trimmed from `cargo nextest list --run-ignored all --message-format json`.
        let json = r#"{"rust-build-meta":{},"test-count":4,"rust-suites":{
            "leaklab-service::gpu":{"binary-path":"/t/debug/deps/gpu-1","testcases":{"graph_leaks_on_cuda":{"ignored":false,"filter-match":{"status":"matches"}}}},
            "leaklab-probe::devices":{"binary-path":"/t/debug/deps/devices-2","testcases":{"cuda_figures":{"ignored":true,"filter-match":{"status":"matches"}},"cpu_figures":{"ignored":false,"filter-match":{"status":"matches"}}}}}}"#;
        let device = parse_list(json).unwrap();
        assert_eq!(device.gpu_binary, PathBuf::from("/t/debug/deps/gpu-1"));
        assert_eq!(
            device.tests,
            [
                "leaklab-probe::devices cuda_figures",
                "leaklab-service::gpu graph_leaks_on_cuda"
            ]
        );
        assert!(
            parse_list(r#"{"rust-suites":{}}"#).is_err(),
            "a list without the GPU binary is an error"
        );
        let unlisted =
            r#"{"rust-suites":{"leaklab-service::gpu":{"binary-path":"/t/gpu-1","testcases":{}}}}"#;
        assert!(
            parse_list(unlisted).is_err(),
            "a GPU binary without tests is an error"
        );
    }
}
