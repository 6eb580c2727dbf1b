//! Every cause of the zoo (lab/zoo) is a test: the zoo's driver runs that entry alone, both
//! variants, each served as its own Python process (forked in turn from one that imported torch
//! once: most of a start-up) and scanned by the real `leaklab` binary with the entry's budget,
//! and the verdict must be what the entry predicted (a leak's leaky variant fails and its fix
//! passes; a must-pass entry passes both), and so must the diagnosis: the growth axis and the
//! owner the scan measures (its repeat phase, the process tree, the agent's census and trim
//! probe). A reading that sees less than the entry states is a miss: accepted only where the
//! entry declared that limit of the instrument before the run (`known_miss`), and reported as
//! a miss either way. One test per entry, so nextest runs them side by side; a tidy check keeps a new entry
//! from going untested.
//!
//! Needs $LEAKLAB_PYTHON with torch and FastAPI (`cargo xtask test` provisions it): under
//! CI=true its absence fails every test here; elsewhere the test says it skipped, and why.

use leaklab_report::Report;
use leaklab_runner::zoo::{self, ZooCommand, ZooReport};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn zoo_dir() -> PathBuf {
    root().join("lab/zoo")
}

/// Exits with the names of the modules given that this python cannot find (none: 0).
const FIND_SPECS: &str = "import importlib.util as u, sys; \
    gone = [m for m in sys.argv[1:] if u.find_spec(m) is None]; \
    sys.exit('no module ' + ', '.join(gone) if gone else None)";

/// The python with torch, FastAPI and uvicorn, or why there is none (None: run the test).
fn missing_python() -> Option<String> {
    static CHECKED: OnceLock<Option<String>> = OnceLock::new();
    CHECKED
        .get_or_init(|| {
            let Some(python) = std::env::var_os("LEAKLAB_PYTHON") else {
                let how = "run through `cargo xtask test`, which provisions torch";
                return Some(format!("LEAKLAB_PYTHON is not set ({how})"));
            };
            // Found, not imported: importing torch costs 2-2.5 s of CPU, and nextest runs every
            // entry in a process of its own; the services import it anyway.
            match Command::new(&python)
                .args(["-c", FIND_SPECS, "torch", "fastapi", "uvicorn"])
                .output()
            {
                Ok(out) if out.status.success() => None,
                Ok(out) => Some(format!(
                    "{} lacks torch, fastapi or uvicorn: {}",
                    PathBuf::from(&python).display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                )),
                Err(e) => Some(format!(
                    "cannot run {}: {e}",
                    PathBuf::from(&python).display()
                )),
            }
        })
        .clone()
}

/// `leaklab`, beside this test's target folder (built here when it is not there yet).
fn leaklab() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let exe = std::env::current_exe().expect("the test knows where it is");
            let path = exe
                .parent()
                .and_then(Path::parent)
                .expect("target/<profile>/deps")
                .join("leaklab");
            if !path.exists() {
                let cargo = option_env!("CARGO").unwrap_or("cargo");
                let status = Command::new(cargo)
                    .args(["build", "--package", "leaklab", "--bin", "leaklab"])
                    .status()
                    .expect("cargo runs");
                assert!(status.success(), "building leaklab failed");
            }
            path
        })
        .clone()
}

/// Runs entry `cause` through the zoo's driver and checks it against its prediction.
fn check(cause: &str) {
    if let Some(why) = missing_python() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true and no python to serve the zoo: {why}"
        );
        eprintln!("SKIPPED zoo entry {cause}: {why}");
        return;
    }
    let out = tempfile::Builder::new()
        .prefix(&format!("leaklab-zoo-{cause}-"))
        .tempdir()
        .unwrap();
    let mut cmd = ZooCommand::new(zoo_dir(), out.path().to_path_buf());
    cmd.leaklab = Some(leaklab());
    cmd.only = vec![cause.to_string()];
    // One service at a time within a test: nextest runs the entries side by side.
    cmd.jobs = 1;
    cmd.quiet = true;
    let report: ZooReport =
        zoo::run(&cmd).unwrap_or_else(|e| panic!("the zoo's driver could not run {cause}: {e:#}"));
    let entry = report
        .entries
        .iter()
        .find(|e| e.name == cause)
        .unwrap_or_else(|| panic!("lab/zoo/{cause}.py lists no entry named {cause}"));
    assert_eq!(
        entry.contract_broken(),
        None,
        "the entry's prediction breaks the zoo's contract"
    );
    assert_eq!(report.runs.len(), 2, "both variants ran");
    if report.outcome() != leaklab_report::Outcome::Pass {
        let kept = out.keep();
        let mut why = String::new();
        for r in report.runs.iter().filter(|r| !r.accepted) {
            why.push_str(&format!(
                "\n{}-{}: {}\n  axis: {}\n  owner: {}\n  diagnosis: {}\n  notes: {:?}\n  scan: {}",
                r.name,
                r.variant.name(),
                r.failure.as_deref().unwrap_or("as scanned"),
                r.axis.as_ref().map_or("-", |a| a.2.as_str()),
                r.owner.as_ref().map_or("-", |o| o.1.as_str()),
                r.diagnosis.as_deref().unwrap_or("-"),
                r.notes,
                r.command.join(" ")
            ));
        }
        panic!(
            "{cause} did not get the verdicts, axes and owners its entry predicted:\n{}{why}\nreports kept in {}",
            report.text(),
            kept.display()
        );
    }
}

/// One test per cause; `TESTED` is what the tidy check compares with lab/zoo. The CUDA-only
/// causes (`device="cuda"` in their entry) are device-only tests: the device check runs them,
/// and `cargo xtask test` lists them as not run here.
macro_rules! zoo_tests {
    ($($cause:ident),* $(,)?; cuda: $($gpu:ident),* $(,)?) => {
        $(
            #[test]
            fn $cause() {
                check(stringify!($cause));
            }
        )*
        $(
            #[test]
            #[ignore = "needs a GPU"]
            fn $gpu() {
                check(stringify!($gpu));
            }
        )*
        const TESTED: &[&str] = &[$(stringify!($cause),)* $(stringify!($gpu)),*];
    };
}

zoo_tests! {
    create_graph_cycle,
    dataloader_cow,
    exceptions_kept,
    forward_hook,
    gc_disabled_cycles,
    jit_trace_per_request,
    logging_handler_per_client,
    lru_cache_method,
    malloc_retention,
    mcp_session_per_client,
    metrics_label_cardinality,
    nograd_threadpool,
    onednn_cache,
    onnxruntime_arena,
    pyplot_figures_kept,
    shape_cache_capped,
    thread_per_request,
    tokenizer_growth,
    warnings_unique_text,
    worker_process,
    ;
    cuda:
    cuda_reserved_slack,
    cudagraph_per_shape,
    cudnn_plan_cache,
    pinned_host_cache,
}

/// The causes in lab/zoo: every `<name>.py` but the shared parts (`_zoo.py`), `serve.py` and
/// the Python tests (`test_*.py`), as serve.py finds them.
fn causes_on_disk() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(zoo_dir())
        .expect("lab/zoo exists")
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_suffix(".py")
                .map(str::to_string)
        })
        .filter(|n| !n.starts_with('_') && !n.starts_with("test_") && n != "serve")
        .collect();
    names.sort();
    names
}

/// A new entry cannot go untested, and a test cannot outlive its entry. Each entry is named as
/// its file is, which is how serve.py finds it. Needs no python.
#[test]
fn every_zoo_cause_has_a_test() {
    let on_disk = causes_on_disk();
    let untested: Vec<&String> = on_disk
        .iter()
        .filter(|n| !TESTED.contains(&n.as_str()))
        .collect();
    assert!(
        untested.is_empty(),
        "lab/zoo causes without a test: {untested:?}: add each to zoo_tests! in {}",
        file!()
    );
    let gone: Vec<&&str> = TESTED
        .iter()
        .filter(|t| !on_disk.iter().any(|n| n == *t))
        .collect();
    assert!(gone.is_empty(), "tests of causes not in lab/zoo: {gone:?}");
    for name in &on_disk {
        let text = std::fs::read_to_string(zoo_dir().join(format!("{name}.py"))).unwrap();
        assert!(
            text.contains(&format!("name=\"{name}\"")),
            "lab/zoo/{name}.py: its ENTRY is named `{name}`, as its file is (serve.py finds it so)"
        );
    }
}
