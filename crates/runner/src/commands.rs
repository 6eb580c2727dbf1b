//! The lab's commands (run-lab, soak, bench), which the `leaklab-lab` binary runs: each is its
//! flags (a clap `Args` struct, the place to add one), one call that returns its report, and
//! `leaklab_report::finish`, which prints, writes and exits with what comes back.
//!
//! The service is another program (`leaklab-service`, which links libtorch); it is found next
//! to the running `leaklab-lab`, or named with `--service` / `LEAKLAB_SERVICE`.

use crate::bench::{bench as run_bench, BenchOptions, BenchReport};
use crate::driver::{PythonTwin, RunOptions};
use crate::report::LabRun;
use crate::soak::{self, SoakReport};
use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use leaklab_report::{finish, Outcome, Output, Report};
use leaklab_vocab::{Device, DeviceRequest, Scale, Variant};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

/// `leaklab-lab`: the lab's commands, which need its service (`leaklab-service`, built by
/// `cargo xtask run-lab` from a clone); the instrument (`leaklab scan`, `snapshot`, `judge`) is
/// the `leaklab` binary.
#[derive(Parser)]
#[command(
    name = "leaklab-lab",
    version,
    about = "The lab: every variant of its service run under load, judged and written up"
)]
pub struct LabCli {
    #[command(subcommand)]
    pub command: LabSubcommand,
}

#[derive(Subcommand)]
pub enum LabSubcommand {
    /// Run every variant of the lab's service under load, judge it and write the report.
    /// Exit 0 every verdict as expected, 1 one is not, 2 could not judge.
    RunLab(LabCommand),
    /// Sustained load against the fixed variants and the baseline.
    Soak(SoakCommand),
    /// The HTTP side of the benchmarks (Rust against the Python twin) and docs/benchmarks.md.
    Bench(BenchCommand),
    /// The judge's false alarms and sensitivity on the corpus of recordings (lab/corpus), per
    /// regime, calibration and validation side by side; with --write, into docs/benchmarks.md.
    JudgeBench(JudgeBenchCommand),
}

#[derive(Args)]
pub struct JudgeBenchCommand {
    /// The recordings (REGIME/SUBJECT/RUN.json.gz).
    #[arg(long, default_value = "lab/corpus/recordings")]
    pub corpus: PathBuf,
    /// The page whose generated section holds the table.
    #[arg(long, default_value = "docs/benchmarks.md")]
    pub docs: PathBuf,
    /// Write the table into the page's generated section.
    #[arg(long)]
    pub write: bool,
}

/// What a command of the zoo or the corpus says in a `leaklab-lab` built without them.
#[cfg(not(feature = "instrument"))]
const WITHOUT_INSTRUMENT: &str = "this leaklab-lab was built without the zoo and the corpus (the `instrument` feature): `cargo xtask run-lab --zoo` and `cargo xtask judge-bench` build it with them";

/// `leaklab-lab judge-bench`: prints the table, and writes it where asked.
#[cfg(not(feature = "instrument"))]
pub fn judge_bench(_: &JudgeBenchCommand) -> anyhow::Result<()> {
    anyhow::bail!(WITHOUT_INSTRUMENT)
}

/// `leaklab-lab judge-bench`: prints the table, and writes it where asked.
#[cfg(feature = "instrument")]
pub fn judge_bench(cmd: &JudgeBenchCommand) -> anyhow::Result<()> {
    let entries = crate::corpus::read(&cmd.corpus)?;
    print!("{}", crate::corpus::table(&entries));
    if cmd.write {
        let doc = std::fs::read_to_string(&cmd.docs)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", cmd.docs.display()))?;
        let section = crate::corpus::markdown(&cmd.corpus);
        std::fs::write(&cmd.docs, crate::corpus::replace_section(&doc, &section)?)?;
        eprintln!("leaklab: the table is in {}", cmd.docs.display());
    }
    Ok(())
}

/// Runs one command of the lab to its exit code.
pub fn dispatch(command: LabSubcommand) -> ExitCode {
    match command {
        LabSubcommand::RunLab(mut cmd) if cmd.zoo.zoo => {
            let exe = std::env::current_exe().ok();
            cmd.zoo.zoo_dir = zoo_dir(cmd.zoo.zoo_dir, exe.as_deref());
            #[cfg(feature = "instrument")]
            return crate::zoo::finish(cmd.zoo, &cmd.out, cmd.json);
            #[cfg(not(feature = "instrument"))]
            {
                eprintln!("leaklab-lab run-lab --zoo: {WITHOUT_INSTRUMENT}");
                ExitCode::from(2)
            }
        }
        LabSubcommand::RunLab(cmd) => {
            let output = Output::folder(&cmd.out, cmd.json);
            finish("run-lab", run_lab(cmd), &output)
        }
        LabSubcommand::Soak(cmd) => {
            let output = Output {
                json: cmd.json,
                markdown: Some(cmd.out.join("soak.md")),
            };
            finish("soak", soak(cmd), &output)
        }
        LabSubcommand::Bench(cmd) => {
            let output = Output {
                json: false,
                markdown: Some(cmd.out.clone()),
            };
            finish("bench", bench(cmd), &output)
        }
        LabSubcommand::JudgeBench(cmd) => match judge_bench(&cmd) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("leaklab-lab judge-bench: {e:#}");
                ExitCode::from(2)
            }
        },
    }
}

pub const SERVICE_VAR: &str = "LEAKLAB_SERVICE";
const SERVICE_EXE: &str = "leaklab-service";

/// The `leaklab-service` binary: `explicit`, else `$LEAKLAB_SERVICE`, else the one beside
/// the running executable (where cargo and the device bundle put it).
pub fn locate_service(explicit: Option<PathBuf>) -> Result<PathBuf> {
    let candidate = explicit
        .or_else(|| std::env::var_os(SERVICE_VAR).map(PathBuf::from))
        .or_else(|| {
            std::env::current_exe()
                .ok()
                .and_then(|exe| exe.parent().map(|d| d.join(SERVICE_EXE)))
        });
    match candidate {
        Some(path) if path.is_file() => Ok(path),
        Some(path) => bail!(
            "the lab's service binary is not at {}: build it with `cargo build --release -p leaklab-service` (cargo xtask run-lab does), or name it with --service or {SERVICE_VAR}",
            path.display()
        ),
        None => bail!("cannot tell where the lab's service binary is: name it with --service or {SERVICE_VAR}"),
    }
}

/// What `request` (cpu, cuda or auto) means on this machine, as the service binary (the one
/// that links libtorch) sees it. CUDA asked for and absent is its clear error, passed on.
pub fn resolve_device(service: &Path, request: DeviceRequest) -> Result<Device> {
    let out = Command::new(service)
        .args(["device", "--device", request.name()])
        .output()
        .with_context(|| format!("cannot run {}", service.display()))?;
    if !out.status.success() {
        bail!(
            "{}",
            String::from_utf8_lossy(&out.stderr)
                .trim()
                .trim_start_matches("Error: ")
        );
    }
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .map_err(anyhow::Error::msg)
}

/// `leaklab-lab run-lab`.
#[derive(Args)]
pub struct LabCommand {
    /// Variants to run (repeat the flag); all eight when absent.
    #[arg(long = "variant")]
    pub variants: Vec<Variant>,
    /// Measured requests per variant (default: 200, or 30 at the seed scale).
    #[arg(long)]
    pub requests: Option<usize>,
    /// Warm-up requests per variant, not judged (default: 20, or 5 at the seed scale).
    #[arg(long)]
    pub warmup: Option<usize>,
    #[arg(long, default_value_t = 2)]
    pub concurrency: usize,
    /// default (CPU-sized) or seed (the reference scenario).
    #[arg(long, default_value = "default")]
    pub scale: Scale,
    /// cpu, cuda, or auto (CUDA when a device is visible).
    #[arg(long, default_value = "auto")]
    pub device: DeviceRequest,
    /// Report folder.
    #[arg(long, default_value = "target/leaklab")]
    pub out: PathBuf,
    /// Print the report as JSON and nothing else (and draw nothing on stderr).
    #[arg(long)]
    pub json: bool,
    /// Alloc/free events each service records for its memory_viz snapshot.
    #[arg(long, default_value_t = 20_000)]
    pub memory_history: usize,
    /// The lab's service binary (default: $LEAKLAB_SERVICE, else beside this one).
    #[arg(long)]
    pub service: Option<PathBuf>,
    #[command(flatten)]
    pub zoo: ZooArgs,
}

/// `leaklab-lab run-lab --zoo`'s flags, flattened into run-lab's.
#[derive(Debug, Clone, clap::Args)]
pub struct ZooArgs {
    /// Run the zoo instead of the lab's service: every cause of lab/zoo, leaky and fixed,
    /// scanned and compared with its entry's prediction (report in OUT/zoo).
    #[arg(long)]
    pub zoo: bool,
    /// With --zoo: only this cause (repeat the flag).
    #[arg(long, requires = "zoo", value_name = "NAME")]
    pub only: Vec<String>,
    /// With --zoo: the folder of the entries and serve.py.
    #[arg(long, requires = "zoo", default_value = "lab/zoo")]
    pub zoo_dir: PathBuf,
    /// With --zoo: services at a time.
    #[arg(long, requires = "zoo", default_value_t = 2)]
    pub jobs: usize,
}

/// `--zoo-dir` as given, unless it is relative and holds no serve.py (`cargo xtask run-lab
/// --zoo` run from elsewhere than the repository's root, with the default `lab/zoo`): then the
/// same path under the repository that built the running binary (`target/<profile>/` is two
/// folders below it), where serve.py is.
fn zoo_dir(given: PathBuf, exe: Option<&Path>) -> PathBuf {
    if given.is_absolute() || given.join("serve.py").is_file() {
        return given;
    }
    exe.and_then(|exe| exe.ancestors().nth(3))
        .map(|root| root.join(&given))
        .filter(|dir| dir.join("serve.py").is_file())
        .unwrap_or(given)
}

/// Runs the lab: every variant judged, with what each brought back for the charts and pickles.
pub fn run_lab(cmd: LabCommand) -> Result<LabRun> {
    let service = locate_service(cmd.service)?;
    let device = resolve_device(&service, cmd.device)?;
    let seed = cmd.scale == Scale::Seed;
    let options = RunOptions {
        service,
        scale: cmd.scale,
        device,
        warmup: cmd.warmup.unwrap_or(if seed { 5 } else { 20 }),
        requests: cmd.requests.unwrap_or(if seed { 30 } else { 200 }),
        concurrency: cmd.concurrency,
        memory_history_entries: cmd.memory_history,
        start_timeout: Duration::from_secs(180),
        twin: None,
        threads: None,
        malloc_arenas: None,
    };
    let variants = if cmd.variants.is_empty() {
        Variant::ALL.to_vec()
    } else {
        cmd.variants
    };
    if !cmd.json {
        eprintln!(
            "leaklab: {} variants, {} warm-up + {} requests each, scale {}, device {device}",
            variants.len(),
            options.warmup,
            options.requests,
            options.scale.name()
        );
    }
    Ok(runtime()?.block_on(crate::run_lab(&options, &variants, cmd.json)))
}

/// `leaklab-lab soak`.
#[derive(Args)]
pub struct SoakCommand {
    /// The CI-sized run: 600 requests per variant at concurrency 8.
    #[arg(long)]
    pub short: bool,
    /// Requests per variant (default 100000, or 600 with --short).
    #[arg(long)]
    pub requests: Option<usize>,
    /// Concurrent clients (default 16, or 8 with --short).
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Variants (repeat); the fixed ones and baseline when absent.
    #[arg(long = "variant")]
    pub variants: Vec<Variant>,
    #[arg(long, default_value = "target/leaklab/soak")]
    pub out: PathBuf,
    /// Print the results as JSON and nothing else (and draw nothing on stderr).
    #[arg(long)]
    pub json: bool,
    /// The lab's service binary (default: $LEAKLAB_SERVICE, else beside this one).
    #[arg(long)]
    pub service: Option<PathBuf>,
}

/// Runs the soak: every variant's allocator slope, errors and latency drift.
pub fn soak(cmd: SoakCommand) -> Result<SoakReport> {
    let requests = cmd
        .requests
        .unwrap_or(if cmd.short { 600 } else { 100_000 });
    let options = RunOptions {
        service: locate_service(cmd.service)?,
        scale: Scale::Default,
        device: Device::Cpu,
        // The fixed cache (32 batches) is full well inside the warm-up.
        warmup: (requests / 10).clamp(50, 2000),
        requests,
        concurrency: cmd.concurrency.unwrap_or(if cmd.short { 8 } else { 16 }),
        memory_history_entries: 0,
        start_timeout: Duration::from_secs(180),
        twin: None,
        threads: None,
        malloc_arenas: None,
    };
    let variants = if cmd.variants.is_empty() {
        soak::VARIANTS.to_vec()
    } else {
        cmd.variants
    };
    if !cmd.json {
        eprintln!(
            "leaklab soak: {} variants, {} warm-up + {} requests each at concurrency {}",
            variants.len(),
            options.warmup,
            options.requests,
            options.concurrency
        );
    }
    Ok(runtime()?.block_on(soak::soak(&options, &variants, cmd.json)))
}

/// `leaklab-lab bench`.
#[derive(Args)]
pub struct BenchCommand {
    /// Requests for each throughput run (Rust, then Python).
    #[arg(long, default_value_t = 2000)]
    pub requests: usize,
    /// Requests for each leak cross-check run.
    #[arg(long, default_value_t = 150)]
    pub leak_requests: usize,
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// Torch threads, the same for both services and for the criterion groups' raw forward.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// The python of the twin (default: $LEAKLAB_PYTHON, else python3).
    #[arg(long)]
    pub python: Option<PathBuf>,
    #[arg(long, default_value = "lab/python/twin_service.py")]
    pub script: PathBuf,
    #[arg(long, default_value = "target/criterion")]
    pub criterion_dir: PathBuf,
    /// The markdown written (its JSON beside it).
    #[arg(long, default_value = "docs/benchmarks.md")]
    pub out: PathBuf,
    /// The lab's service binary (default: $LEAKLAB_SERVICE, else beside this one).
    #[arg(long)]
    pub service: Option<PathBuf>,
}

/// The HTTP side of the benchmarks beside criterion's figures (docs/benchmarks.md).
pub fn bench(cmd: BenchCommand) -> Result<BenchReport> {
    let service = locate_service(cmd.service)?;
    let weights_dir = tempfile::tempdir()?;
    let weights = weights_dir.path().join("default.safetensors");
    let status = Command::new(&service)
        .args(["export-weights", "--scale", "default", "--out"])
        .arg(&weights)
        .status()?;
    if !status.success() {
        bail!("{} export-weights failed ({status})", service.display());
    }
    let python = cmd
        .python
        .or_else(|| std::env::var_os("LEAKLAB_PYTHON").map(PathBuf::from))
        .unwrap_or_else(|| "python3".into());
    let threads = cmd.threads;
    let rust = RunOptions {
        service,
        scale: Scale::Default,
        device: Device::Cpu,
        warmup: 20,
        requests: cmd.requests,
        concurrency: cmd.concurrency,
        memory_history_entries: 0,
        start_timeout: Duration::from_secs(180),
        twin: None,
        threads: Some(threads),
        malloc_arenas: None,
    };
    let options = BenchOptions {
        rust,
        twin: PythonTwin {
            python,
            script: cmd.script,
            weights,
            threads,
        },
        criterion_dir: cmd.criterion_dir,
        leak_requests: cmd.leak_requests,
    };
    eprintln!("leaklab bench: Rust and Python services, {} requests each at concurrency {}, {threads} torch threads", cmd.requests, cmd.concurrency);
    Ok(runtime()?.block_on(run_bench(&options)))
}

/// The command docs/benchmarks.md says it was produced by.
const BENCH_COMMAND: &str = "cargo xtask bench";

impl Report for BenchReport {
    /// Runs that failed leave figures missing: nothing to compare.
    fn outcome(&self) -> Outcome {
        if self.failures.is_empty() {
            Outcome::Pass
        } else {
            Outcome::CannotJudge
        }
    }

    fn text(&self) -> String {
        self.markdown(BENCH_COMMAND)
    }

    fn markdown(&self) -> String {
        self.markdown(BENCH_COMMAND)
    }

    fn problem(&self) -> Option<String> {
        (!self.failures.is_empty()).then(|| {
            format!(
                "{} runs failed: {}",
                self.failures.len(),
                self.failures.join("; ")
            )
        })
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_zoo_is_found_above_the_binary_when_it_is_not_under_the_cwd() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("lab/zoo")).unwrap();
        std::fs::write(root.path().join("lab/zoo/serve.py"), "").unwrap();
        let exe = root.path().join("target/release/leaklab-lab");
        // The tests run in crates/runner, which has no lab/zoo.
        assert_eq!(
            zoo_dir("lab/zoo".into(), Some(&exe)),
            root.path().join("lab/zoo")
        );
        // No zoo above the binary either: as given, for the driver to say where it looked.
        let elsewhere = root.path().join("other/target/release/leaklab-lab");
        assert_eq!(
            zoo_dir("lab/zoo".into(), Some(&elsewhere)),
            PathBuf::from("lab/zoo")
        );
        assert_eq!(
            zoo_dir("/srv/zoo".into(), Some(&exe)),
            PathBuf::from("/srv/zoo")
        );
    }
}
