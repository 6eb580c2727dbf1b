//! Shared by the `leaklab` binary's tests: the binary, the lab's `leaklab-lab` beside it, both
//! wired to the lab's service binary; and what a test does when a real dependency is missing.

#[allow(dead_code)]
pub mod tls;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

/// `leaklab-service`, built beside `leaklab` (cargo builds it for `cargo test --workspace`;
/// a `cargo test -p leaklab` alone builds it here, once).
pub fn service_exe() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| sibling_exe("leaklab-service", "leaklab-service"))
        .clone()
}

/// `leaklab-exercises` (the workshop, with the incident drill's services as shipped), likewise.
#[allow(dead_code)]
pub fn exercises_exe() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| sibling_exe("leaklab-exercises", "leaklab-exercises"))
        .clone()
}

/// `leaklab-lab` (crates/runner), the lab's commands (run-lab, soak, bench), likewise: a
/// workspace test run builds it (crates/runner has tests of its own, so cargo builds its binary).
#[allow(dead_code)]
pub fn lab_exe() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| sibling_exe("leaklab-runner", "leaklab-lab"))
        .clone()
}

/// Binary `bin` of `package`, beside `leaklab`; built first (in the profile of these tests)
/// when it is not there.
fn sibling_exe(package: &str, bin: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_BIN_EXE_leaklab")).with_file_name(bin);
    if !path.exists() {
        let dir = path
            .parent()
            .and_then(Path::file_name)
            .and_then(|d| d.to_str())
            .unwrap_or("debug");
        let profile = if dir == "debug" { "dev" } else { dir };
        let cargo = option_env!("CARGO").unwrap_or("cargo");
        let status = Command::new(cargo)
            .args([
                "build",
                "--profile",
                profile,
                "--package",
                package,
                "--bin",
                bin,
            ])
            .status()
            .expect("cargo runs");
        assert!(status.success(), "building {bin} failed");
    }
    path
}

#[allow(dead_code)]
pub fn leaklab() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_leaklab"));
    command.env("LEAKLAB_SERVICE", service_exe());
    command
}

/// `leaklab-lab`, wired to the lab's service binary.
#[allow(dead_code)]
pub fn lab() -> Command {
    let mut command = Command::new(lab_exe());
    command.env("LEAKLAB_SERVICE", service_exe());
    command
}

/// Said by a test that returns early because its real `dependency` is missing. Under CI (`CI`
/// set, and not `false` or `0`) it fails the test instead, since a skip there would pass unseen;
/// elsewhere it says SKIPPED on the terminal itself, past the test harness's capture.
#[allow(dead_code)]
pub fn skip_missing(test: &str, dependency: &str) {
    let ci = std::env::var("CI").is_ok_and(|v| !matches!(v.as_str(), "" | "false" | "0"));
    assert!(
        !ci,
        "{test} needs {dependency}, which is missing: under CI a missing dependency fails the test"
    );
    let line = format!("\n*** SKIPPED {test}: {dependency} is missing; this test PASSES WITHOUT RUNNING (under CI=true it fails) ***\n");
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
}

/// A service process on a free loopback port, killed when dropped.
#[allow(dead_code)]
pub struct Service {
    pub child: Child,
    pub base: String,
}

#[allow(dead_code)]
impl Service {
    pub fn start(mut command: Command) -> Service {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let base = lines
            .find_map(|l| {
                l.ok().and_then(|l| {
                    l.split("listening on ")
                        .nth(1)
                        .map(|u| u.trim().to_string())
                })
            })
            .expect("the service prints its address");
        std::thread::spawn(move || lines.for_each(drop));
        Service { child, base }
    }

    pub fn pid(&self) -> String {
        self.child.id().to_string()
    }

    /// [`Service::start`] for a service that prints its address before it binds it (uvicorn
    /// importing the app again first): waits up to a minute for the port to take connections.
    pub fn start_bound(command: Command) -> Service {
        let s = Service::start(command);
        let address = s.base.trim_start_matches("http://").to_string();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while std::net::TcpStream::connect(&address).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "nothing took connections at {address} within a minute"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        s
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        // Its own processes too: uvicorn's `--workers` are `multiprocessing` children that
        // outlive a killed parent (two per run of the watch's two-worker test were left alive).
        // Listed before the parent dies, whose children then go to init; killed after it, so no
        // supervisor starts a new worker.
        let tree = leaklab_proc::process_tree(self.child.id());
        let _ = self.child.kill();
        if tree.len() > 1 {
            let _ = Command::new("kill")
                .arg("-KILL")
                .args(tree[1..].iter().map(u32::to_string))
                .status();
        }
        let _ = self.child.wait();
    }
}

#[allow(dead_code)]
pub fn rust(variant: &str) -> Service {
    rust_with(variant, &[])
}

/// The lab's Rust service with more `serve` flags (e.g. `--memory-history 20000`).
#[allow(dead_code)]
pub fn rust_with(variant: &str, extra: &[&str]) -> Service {
    let mut c = Command::new(service_exe());
    c.args([
        "serve",
        "--variant",
        variant,
        "--port",
        "0",
        "--threads",
        "1",
        "--debug-endpoints",
    ])
    .args(extra);
    Service::start(c)
}

/// The lab's Rust service with a fault injected after `after` requests: `var` is
/// `LEAKLAB_CRASH_AFTER` (it aborts) or `LEAKLAB_FAIL_AFTER` (it answers HTTP 500), as
/// crates/service/src/fault.rs reads them.
#[allow(dead_code)]
pub fn rust_faulty(variant: &str, var: &str, after: u32) -> Service {
    let mut c = Command::new(service_exe());
    c.env(var, format!("{variant}:{after}")).args([
        "serve",
        "--variant",
        variant,
        "--port",
        "0",
        "--threads",
        "1",
    ]);
    Service::start(c)
}

/// A request body of the lab's model (8 rows × 512), as a user would save one.
#[allow(dead_code)]
pub fn body(dir: &Path) -> PathBuf {
    let path = dir.join("body.json");
    let rows: Vec<Vec<f32>> = (0..8)
        .map(|r| {
            (0..512)
                .map(|c| ((r * 512 + c) % 97) as f32 / 97.0 - 0.5)
                .collect()
        })
        .collect();
    std::fs::write(
        &path,
        serde_json::to_vec(&serde_json::json!({ "inputs": rows })).unwrap(),
    )
    .unwrap();
    path
}

/// The python that has torch and the twin's packages (`cargo xtask test` sets it).
#[allow(dead_code)]
pub fn python() -> String {
    std::env::var("LEAKLAB_PYTHON").expect("run through `cargo xtask test`, which sets LEAKLAB_PYTHON and installs the twin's packages")
}

/// The lab's Python twin (FastAPI + PyTorch) of `variant`, with the Rust model's weights
/// ([`twin_weights`]), and `extra` flags.
#[allow(dead_code)]
pub fn twin(variant: &str, extra: &[&str]) -> Service {
    let mut c = Command::new(python());
    c.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../lab/python/twin_service.py"))
        .args([
            "--variant",
            variant,
            "--port",
            "0",
            "--threads",
            "1",
            "--weights",
        ])
        .arg(twin_weights())
        .args(extra);
    Service::start(c)
}

/// The Rust model's weights (`leaklab-service export-weights`), exported once per build of the
/// service (0.5 s of CPU a twin before).
#[allow(dead_code)]
pub fn twin_weights() -> PathBuf {
    let exe = service_exe();
    made_once(&exe, "twin-weights", |folder| {
        assert!(Command::new(&exe)
            .args(["export-weights", "--out"])
            .arg(folder.join("w.safetensors"))
            .status()
            .unwrap()
            .success());
    })
    .join("w.safetensors")
}

/// A folder of files that `make` writes from the binary `exe`, made once per build of `exe` in
/// `CARGO_TARGET_TMPDIR` rather than once per test: named by the binary's size and time, made
/// under a file lock (tests started side by side wait for one to make it, not each make their
/// own) and renamed into place whole, so that no test reads a half-made folder.
#[allow(dead_code)]
pub fn made_once(exe: &Path, what: &str, make: impl FnOnce(&Path)) -> PathBuf {
    let meta = std::fs::metadata(exe).unwrap();
    let built = meta
        .modified()
        .unwrap()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let folder = tmp.join(format!("{what}-{}-{built}", meta.len()));
    std::fs::create_dir_all(tmp).unwrap();
    let lock = std::fs::File::create(tmp.join(format!("{what}.lock"))).unwrap();
    lock.lock().unwrap(); // released when `lock` is dropped
    if !folder.exists() {
        let fresh = tempfile::tempdir_in(tmp).unwrap();
        make(fresh.path());
        // Another test may have put the same folder there first: theirs serves as well, and
        // ours goes with `fresh`.
        let renamed = std::fs::rename(fresh.path(), &folder);
        assert!(folder.exists(), "{}: {renamed:?}", folder.display());
        // Those of earlier builds go.
        for old in std::fs::read_dir(tmp).unwrap().filter_map(Result::ok) {
            let name = old.file_name().to_string_lossy().into_owned();
            if name.starts_with(&format!("{what}-")) && old.path() != folder {
                let _ = std::fs::remove_dir_all(old.path());
            }
        }
    }
    folder
}

/// A scan's or a watch's recording beside its report (`evidence.json`), re-judged by `leaklab
/// judge --evidence`: the same exit code and the same report, to the last figure, as the live
/// one's.
#[allow(dead_code)]
pub fn assert_rejudged_alike(out: &Path, code: i32, live: &serde_json::Value) {
    let evidence = out.join("evidence.json");
    let again = leaklab()
        .args(["judge", "--json", "--evidence"])
        .arg(&evidence)
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap_or_else(|e| {
        panic!(
            "{}: {e}: {}",
            evidence.display(),
            String::from_utf8_lossy(&again.stderr)
        )
    });
    assert_eq!(again.status.code(), Some(code), "{report}");
    if let Some(at) = first_difference(&report, live, String::new()) {
        panic!(
            "{}: re-judged differently from the live report, first at {at}",
            evidence.display()
        );
    }
}

/// The JSON pointer of the first place `a` and `b` differ, with both values there.
fn first_difference(a: &serde_json::Value, b: &serde_json::Value, at: String) -> Option<String> {
    use serde_json::Value::{Array, Object};
    match (a, b) {
        (Object(x), Object(y)) => x
            .keys()
            .chain(y.keys().filter(|k| !x.contains_key(*k)))
            .find_map(|k| {
                let (u, v) = (x.get(k), y.get(k));
                match (u, v) {
                    (Some(u), Some(v)) => first_difference(u, v, format!("{at}/{k}")),
                    _ => Some(format!("{at}/{k}: {u:?} against {v:?}")),
                }
            }),
        (Array(x), Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (u, v))| first_difference(u, v, format!("{at}/{i}"))),
        _ => (a != b).then(|| format!("{at}: {a} against {b}")),
    }
}
