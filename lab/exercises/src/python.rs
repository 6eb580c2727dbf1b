//! The Python exercises (5 and 6): a FastAPI service the learner edits, checked from outside.
//!
//! The check serves the copy with `lab/exercises/python/_check.py serve` (it prints the zoo's
//! `listening on http://...` line), scans it with the `leaklab` binary under an explicit
//! budget, then sends inputs the scan never sent and compares every answer with the model's
//! own (`_check.py verify`, the truth in `_contract.py`, which the learner does not edit,
//! computed once and kept in target/).

use crate::{Info, Kind, Outcome, Version};
use anyhow::{bail, Context, Result};
use leaklab_report::human_bytes;
use serde_json::Value;
use std::hash::{Hash, Hasher};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// How one Python exercise is scanned: requests, budget and, for a per-shape cache, the most
/// the process may rise over the judged requests.
struct Plan {
    warmup: usize,
    requests: usize,
    budget: &'static [&'static str],
    /// A per-shape cache reads as a plateau while it fills, and a plateau passes every budget:
    /// so exercise 5 also bounds the rise itself (its original rose 52-62 MB over 200 new
    /// sizes, its solution 0 MB, measured with the scan below).
    max_rise_bytes: Option<f64>,
    /// How many answers `verify` checks.
    verified: usize,
}

fn plan(n: usize) -> Result<Plan> {
    Ok(match n {
        // 20 + 200 requests, every one a new image size; a small pod's budget (lab/zoo's).
        5 => Plan {
            warmup: 20,
            requests: 200,
            budget: &[
                "--capacity",
                "1GiB",
                "--rate",
                "1",
                "--fail-if-oom-within",
                "1d",
            ],
            max_rise_bytes: Some(10e6),
            verified: 20,
        },
        // The same body 20 + 200 times; the zoo's nograd_threadpool budget.
        6 => Plan {
            warmup: 20,
            requests: 200,
            budget: &[
                "--capacity",
                "8GiB",
                "--rate",
                "5",
                "--fail-if-oom-within",
                "2d",
            ],
            max_rise_bytes: None,
            verified: 20,
        },
        _ => bail!("exercise {n} is not a Python exercise"),
    })
}

fn lab() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The folder of the Python exercises (the learner's copies, `_check.py`, `_contract.py`).
pub fn folder() -> PathBuf {
    lab().join("exercises/python")
}

/// Where a Python exercise's file lives, in each version.
pub fn file(info: &Info, version: Version) -> PathBuf {
    match version {
        Version::Learner => folder().join(info.file),
        Version::Original => folder().join("original").join(info.file),
        Version::Solution => lab().join("solutions/python").join(info.file),
    }
}

/// The python with torch and FastAPI: `LEAKLAB_PYTHON` (the xtask sets it), else `python3`.
pub fn python() -> PathBuf {
    std::env::var_os("LEAKLAB_PYTHON").map_or_else(|| "python3".into(), PathBuf::from)
}

/// The `leaklab` binary: `LEAKLAB_BIN`, else the workspace's `target/debug/leaklab`.
pub fn leaklab_bin() -> PathBuf {
    std::env::var_os("LEAKLAB_BIN")
        .map_or_else(|| lab().join("../target/debug/leaklab"), PathBuf::from)
}

/// The served copy; killed when dropped.
struct Served {
    child: Child,
    stderr: PathBuf,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn check_py() -> Command {
    let mut cmd = Command::new(python());
    cmd.arg(folder().join("_check.py"));
    cmd
}

/// Serves `path` and waits (up to two minutes: torch loads slowly on a busy machine) for the
/// line that gives its address.
fn serve(n: usize, path: &Path, dir: &Path) -> Result<(Served, String)> {
    let stderr = dir.join("service.stderr");
    let mut child = check_py()
        .args(["serve", &n.to_string()])
        .arg(path)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr)?)
        .spawn()
        .with_context(|| format!("could not start {}", python().display()))?;
    let stdout = child.stdout.take().expect("piped");
    let served = Served { child, stderr };
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(at) = line.find("listening on http://") {
                let _ = tx.send(line[at + "listening on ".len()..].trim().to_string());
            }
        }
    });
    match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(url) => Ok((served, url)),
        Err(_) => {
            let mut err = String::new();
            let _ =
                std::fs::File::open(&served.stderr).and_then(|mut f| f.read_to_string(&mut err));
            let tail: Vec<&str> = err.lines().rev().take(15).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            bail!(
                "{} did not start serving:\n{}",
                path.display(),
                tail.join("\n")
            )
        }
    }
}

/// The true answers `verify` compares with, computed by `_check.py truths` once per version of
/// the contract and the checker and per python, and kept in target/ (torch's import and the
/// model cost about 2 s of CPU a check).
fn truths(n: usize, count: usize) -> Result<PathBuf> {
    let mut key = std::collections::hash_map::DefaultHasher::new();
    for file in ["_contract.py", "_check.py"] {
        std::fs::read(folder().join(file))?.hash(&mut key);
    }
    (python(), count).hash(&mut key);
    let dir = crate::drill::workspace_root().join("target/leaklab/exercise-truths");
    let path = dir.join(format!("{n}-{:016x}.json", key.finish()));
    if !path.exists() {
        std::fs::create_dir_all(&dir)?;
        run_ok(
            check_py()
                .args(["truths", &n.to_string()])
                .arg(&path)
                .arg(count.to_string()),
            "_check.py truths",
            "compute the true answers",
        )?;
    }
    Ok(path)
}

fn run(cmd: &mut Command, what: &str) -> Result<std::process::Output> {
    let out = cmd
        .output()
        .with_context(|| format!("could not run {what}"))?;
    Ok(out)
}

/// [`run`], for a command whose output is its files: an error with its stderr if it failed.
fn run_ok(cmd: &mut Command, what: &str, doing: &str) -> Result<()> {
    let out = run(cmd, what)?;
    if !out.status.success() {
        bail!(
            "could not {doing}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Checks Python exercise `n` in the given version: the scan says memory no longer grows, and
/// every answer is the model's.
pub fn check(n: usize, version: Version) -> Result<Outcome> {
    let info = crate::info(n)?;
    if info.kind != Kind::Python {
        bail!("exercise {n} is a Rust exercise");
    }
    check_file(n, &file(info, version))
}

/// Checks the service in `path` as exercise `n` (the tests check "fixes" written elsewhere).
pub fn check_file(n: usize, path: &Path) -> Result<Outcome> {
    let info = crate::info(n)?;
    // The learner's scan report is kept (target/leaklab/exercise-N); the tests' go with their
    // temporary folder.
    let kept = (*path == file(info, Version::Learner))
        .then(|| lab().join(format!("../target/leaklab/exercise-{n}")));
    check_service(n, path, &format!("Exercise {n} ({})", info.name), kept)
}

/// Checks the service in `path` on exercise `n`'s requests, answers and budget, its text
/// starting with `title`; the scan's report goes to `kept` (shown to the learner), else into a
/// temporary folder. The Python incident drill checks its service so too (exercise 6's).
pub fn check_service(n: usize, path: &Path, title: &str, kept: Option<PathBuf>) -> Result<Outcome> {
    let plan = plan(n)?;
    let leaklab = leaklab_bin();
    if !leaklab.is_file() {
        bail!(
            "no leaklab binary at {}: `cargo build -p leaklab` (or set LEAKLAB_BIN)",
            leaklab.display()
        );
    }
    let dir = tempfile::tempdir()?;
    let (served, url) = serve(n, path, dir.path())?;
    // Served as the zoo serves (lab/zoo/_zoo.py): leaklab's agent mounted at /debug/leaklab.
    let agent = format!("{url}/debug/leaklab");
    let url = format!("{url}/predict");

    let bodies = dir.path().join("bodies");
    let count = if n == 5 {
        plan.warmup + plan.requests
    } else {
        1
    };
    run_ok(
        check_py()
            .args(["bodies", &n.to_string()])
            .arg(&bodies)
            .arg(count.to_string()),
        "_check.py bodies",
        "write the bodies",
    )?;
    let body = if n == 5 {
        bodies.clone()
    } else {
        bodies.join("000000.json")
    };
    let learner = kept.is_some();
    let out = kept.unwrap_or_else(|| dir.path().join("report"));
    let scan = run(
        Command::new(&leaklab)
            .args(["scan", &url, "--body"])
            .arg(&body)
            .args(["--pid", &served.child.id().to_string()])
            .args(["--header", "content-type: application/json"])
            .args([
                "--requests",
                &plan.requests.to_string(),
                "--warmup",
                &plan.warmup.to_string(),
            ])
            .args(plan.budget)
            // The census names what still holds the memory, in the check's words too.
            .args(["--agent", &agent])
            .arg("--out")
            .arg(&out)
            .arg("--json"),
        "leaklab scan",
    )?;
    let report: Value = serde_json::from_slice(&scan.stdout).with_context(|| {
        format!(
            "the scan printed no report (exit {}): {}",
            scan.status,
            String::from_utf8_lossy(&scan.stderr)
        )
    })?;
    let verify = run(
        check_py()
            .args(["verify", &n.to_string(), &url, &plan.verified.to_string()])
            .arg(truths(n, plan.verified)?),
        "_check.py verify",
    )?;
    drop(served);
    let answers: Value = serde_json::from_slice(&verify.stdout).with_context(|| {
        format!(
            "the answers could not be verified: {}",
            String::from_utf8_lossy(&verify.stderr)
        )
    })?;

    let mut text = format!(
        "{title}, {} warm-up + {} requests{}, scanned by leaklab under {}:\n",
        plan.warmup,
        plan.requests,
        if n == 5 {
            " (every one a new image size)"
        } else {
            ""
        },
        plan.budget.join(" ")
    );
    let (grows, memory) = memory_finding(&report, &plan);
    text.push_str(&memory);
    if let Some(top) = report["census"]["grown"].get(0).filter(|_| grows) {
        text.push_str(&format!(
            "  The agent's census: what grew most is held by {} (+{} a request).\n",
            top["holder"].as_str().unwrap_or("?"),
            human_bytes(top["bytes_per_step"].as_f64().unwrap_or(f64::NAN))
        ));
    }
    if learner {
        let html = out.join("report.html");
        let html = std::fs::canonicalize(&html).unwrap_or(html);
        text.push_str(&format!("  The scan's report: {}\n", html.display()));
    }
    let wrong: Vec<&str> = answers["wrong"]
        .as_array()
        .map(|w| w.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let checked = answers["checked"].as_u64().unwrap_or(0);
    if wrong.is_empty() && checked > 0 {
        text.push_str(&format!(
            "  Answers are right on all {checked} inputs the scan never sent.\n"
        ));
    } else {
        let first = wrong.first().copied().unwrap_or("none checked");
        text.push_str(&format!(
            "  Answers are WRONG on {} of {checked} inputs, e.g. {first}.\n",
            wrong.len()
        ));
    }
    let passed = !grows && wrong.is_empty() && checked > 0;
    text.push_str(if passed {
        "  PASS: the leak is gone and the service still answers right.\n"
    } else {
        "  NOT YET: see above; lab/README.md has hints.\n"
    });
    Ok(Outcome { passed, text })
}

/// What the scan found on the anonymous-memory series, in plain words; whether it still grows.
fn memory_finding(report: &Value, plan: &Plan) -> (bool, String) {
    let outcome = report["outcome"].as_str().unwrap_or("none");
    let series = report["series"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["series"] == "anonymous"));
    let Some(j) = series.map(|s| &s["judgement"]).filter(|j| j.is_object()) else {
        return (true, format!("  No verdict on the process's memory (outcome {outcome}): is the service answering?\n"));
    };
    let verdict = j["verdict"].as_str().unwrap_or("?");
    let slope = j["slope"]["bytes_per_request"].as_f64().unwrap_or(f64::NAN);
    let rise = j["rise_bytes"].as_f64().unwrap_or(f64::NAN);
    let mut text = format!(
        "  The process's anonymous memory: {verdict}, {} per request, rising {} over the judged requests.\n",
        human_bytes(slope),
        human_bytes(rise)
    );
    let mut grows = false;
    if outcome != "pass" {
        text.push_str(
            "  It still leaks: the scan fails it under the budget above (memory runs out).\n",
        );
        grows = true;
    }
    if let Some(max) = plan.max_rise_bytes {
        if rise.is_nan() || rise > max {
            text.push_str(&format!(
                "  It still grows with every new size: {} over {} new sizes (at most {} passes).\n",
                human_bytes(rise),
                plan.requests,
                human_bytes(max)
            ));
            grows = true;
        }
    }
    if !grows {
        text.push_str("  Memory no longer grows per request.\n");
    }
    (grows, text)
}
