//! The drivers under faults, reports killed while they are written (whole or absent, never
//! torn), and the short soak: `leaklab-lab`'s commands.

mod common;

use common::lab;
use std::process::Stdio;
use std::time::{Duration, Instant};

#[test]
fn run_lab_survives_a_service_that_dies_mid_run() {
    let out = tempfile::tempdir().unwrap();
    let output = lab()
        .env("LEAKLAB_CRASH_AFTER", "refs-leaky:15")
        .args([
            "run-lab",
            "--json",
            "--device",
            "cpu",
            "--warmup",
            "5",
            "--requests",
            "40",
            "--variant",
            "refs-leaky",
            "--variant",
            "baseline",
            "--out",
        ])
        .arg(out.path())
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(1),
        "an unexpected verdict (a failed run) exits 1"
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let crashed = &report["variants"][0];
    assert_eq!(crashed["variant"], "refs-leaky");
    assert_eq!(crashed["outcome"], "failed");
    let reason = crashed["reason"].as_str().unwrap();
    assert!(
        reason.contains("service exited") && reason.contains("crashing on purpose"),
        "{reason}"
    );
    let baseline = &report["variants"][1];
    assert_eq!(baseline["passed"], true, "the other variants go on");
    assert!(out.path().join("report.md").exists());
    assert!(std::fs::read_to_string(out.path().join("report.md"))
        .unwrap()
        .contains("Run failed: service exited"));
}

/// A process's state letter and parent, from /proc/PID/stat; None once it is gone.
fn state_and_parent(pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name, in parentheses, may hold spaces: the fields after it are fixed.
    let mut rest = stat[stat.rfind(')')? + 1..].split_whitespace();
    Some((rest.next()?.chars().next()?, rest.next()?.parse().ok()?))
}

/// The `leaklab-service serve` processes whose parent is `parent`.
fn services_of(parent: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| state_and_parent(pid).is_some_and(|(_, ppid)| ppid == parent))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("leaklab-service\0serve\0"))
        })
        .collect()
}

/// Whether `pid` holds an established TCP connection (a client is talking to it): one of its
/// socket inodes in state 01 of /proc/net/tcp or tcp6.
fn serving(pid: u32) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    let sockets: Vec<String> = fds
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|l| {
            l.to_str()?
                .strip_prefix("socket:[")?
                .strip_suffix(']')
                .map(String::from)
        })
        .collect();
    ["tcp", "tcp6"]
        .iter()
        .filter_map(|t| std::fs::read_to_string(format!("/proc/{pid}/net/{t}")).ok())
        .any(|table| {
            // Fields: sl local remote st tx:rx tr:when retrnsmt uid timeout inode ...
            table
                .lines()
                .skip(1)
                .map(|l| l.split_whitespace().collect::<Vec<_>>())
                .any(|f| f.len() > 9 && f[3] == "01" && sockets.iter().any(|s| s == f[9]))
        })
}

#[test]
fn a_run_killed_before_its_end_writes_nothing_and_takes_its_service_with_it() {
    let out = tempfile::tempdir().unwrap();
    let mut child = lab()
        .args([
            "run-lab",
            "--device",
            "cpu",
            "--requests",
            "100000",
            "--out",
        ])
        .arg(out.path())
        .stderr(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    // Killed mid-run: once its first service is answering its load, not after a guessed sleep
    // that a slow start-up outlasts.
    let deadline = Instant::now() + Duration::from_secs(120);
    let service = loop {
        if let Some(&pid) = services_of(child.id()).iter().find(|&&pid| serving(pid)) {
            break pid;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "run-lab ended before a service of it was under load"
        );
        assert!(
            Instant::now() < deadline,
            "no service of run-lab under load in 120 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    child.kill().unwrap();
    child.wait().unwrap();
    let killed = Instant::now();
    // Nothing is written until the run ends (that the writes are then atomic is the next test's).
    let names: Vec<String> = std::fs::read_dir(out.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.is_empty(), "files from a killed run: {names:?}");
    // And that service went with it (its parent-death signal is SIGKILL), rather than serving on:
    // gone, or a zombie nobody reaps (no init in a container). Measured: gone 74 µs to 9.1 ms
    // after the kill in six runs; 10 s only tells a slow machine from a service that serves on.
    while state_and_parent(service).is_some_and(|(state, _)| state != 'Z') {
        assert!(
            killed.elapsed() < Duration::from_secs(10),
            "service {service} outlived its killed lab by 10 s"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    eprintln!(
        "service {service} gone {:?} after its lab was killed",
        killed.elapsed()
    );
}

/// Set in the child of the next test: the folder its writer loop writes reports into.
const WRITER: &str = "LEAKLAB_TEST_REPORT_WRITER";

/// A report of `version` (0 or 1): about 2.5 MB of JSON whose every part names the version, and
/// its markdown, whose last line says it is the end.
fn report(version: u64) -> (Vec<u8>, String) {
    let rows: Vec<serde_json::Value> = (0..40_000).map(|i| serde_json::json!({"version": version, "row": i, "bytes_per_request": 16384.0 + i as f64})).collect();
    let json =
        serde_json::to_vec(&serde_json::json!({"version": version, "rows": rows, "end": version}))
            .unwrap();
    let md = format!(
        "# report {version}\n\n{}\n(end of report {version})\n",
        "| a | row |\n".repeat(100_000)
    );
    (json, md)
}

/// The child: writes its two versions in turn, again and again, through the writer every
/// command uses, until it is killed. Made once, so that the loop does nothing but write.
fn write_reports_until_killed(dir: &std::path::Path) -> ! {
    let versions = [report(0), report(1)];
    // The parent kills only once this is said, so that it kills a writer, not a start-up.
    println!("writing");
    loop {
        for (json, md) in &versions {
            leaklab_report::files::write_atomic(&dir.join("report.json"), json).unwrap();
            leaklab_report::files::write_atomic(&dir.join("report.md"), md.as_bytes()).unwrap();
        }
    }
}

/// Killed with SIGKILL (what the OOM killer and a CI timeout send) at ten moments while it
/// rewrites its report, a process leaves every report file whole: the last version it finished,
/// never part of the one it was writing. A plain `std::fs::write` in its place failed this in
/// each of twelve tries, at the first or second round: the child spends nearly all its time
/// inside a write.
#[test]
fn a_report_killed_mid_write_is_the_last_whole_version() {
    if let Some(dir) = std::env::var_os(WRITER) {
        write_reports_until_killed(std::path::Path::new(&dir));
    }
    let versions = [report(0), report(1)];
    let dir = tempfile::tempdir().unwrap();
    for round in 0..10u64 {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "a_report_killed_mid_write_is_the_last_whole_version",
                "--test-threads",
                "1",
                "--nocapture",
            ])
            .env(WRITER, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let said = std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()))
            .map_while(Result::ok)
            .any(|l| l.ends_with("writing"));
        assert!(said, "the writer did not start");
        // Kill once this writer has touched a file (on a busy machine it may not run at once),
        // at a moment spread over its next few writes.
        let stamp = || {
            ["report.json", "report.md"].map(|f| {
                std::fs::metadata(dir.path().join(f)).ok().map(|m| {
                    (
                        std::os::unix::fs::MetadataExt::ino(&m),
                        m.len(),
                        m.modified().ok(),
                    )
                })
            })
        };
        let (before, deadline) = (
            stamp(),
            std::time::Instant::now() + std::time::Duration::from_secs(60),
        );
        while stamp() == before {
            assert!(
                std::time::Instant::now() < deadline,
                "round {round}: the writer wrote nothing in 60 s"
            );
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        std::thread::sleep(std::time::Duration::from_micros(round * 2_371 % 13_000));
        child.kill().unwrap();
        child.wait().unwrap();
        for entry in std::fs::read_dir(dir.path()).unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            // A write killed before its rename leaves its temporary file, hidden, never a report.
            if name.starts_with(".leaklab-") && name.ends_with(".tmp") {
                continue;
            }
            let bytes = std::fs::read(entry.path()).unwrap();
            match name.as_str() {
                "report.json" => {
                    let doc: serde_json::Value =
                        serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                            panic!(
                                "round {round}: report.json is torn ({} bytes): {e}",
                                bytes.len()
                            )
                        });
                    let version = doc["version"].as_u64().unwrap() as usize;
                    assert!(
                        bytes == versions[version].0,
                        "round {round}: report.json is not version {version} whole"
                    );
                }
                "report.md" => {
                    let text = String::from_utf8(bytes).unwrap();
                    let version: usize = text
                        .lines()
                        .next()
                        .and_then(|l| l.strip_prefix("# report "))
                        .and_then(|v| v.parse().ok())
                        .unwrap_or_else(|| {
                            panic!(
                                "round {round}: report.md is torn at its start ({} bytes)",
                                text.len()
                            )
                        });
                    assert!(
                        text == versions[version].1,
                        "round {round}: report.md is not version {version} whole ({} bytes)",
                        text.len()
                    );
                }
                other => panic!("round {round}: a file no writer makes: {other}"),
            }
        }
    }
}

#[test]
fn the_short_soak_holds_every_fixed_variant_at_zero_bytes_per_request() {
    let out = tempfile::tempdir().unwrap();
    // 150 requests a variant after the 50 of the warm-up (300 cost 10.9 s of CPU, 150 6.9 s): the
    // exact allocator reads a fixed variant at 0 B a request over either (flat, every variant),
    // and a variant that kept bytes a request would move the slope off 0.
    let output = lab()
        .args(["soak", "--short", "--json", "--requests", "150", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let results: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let results = results.as_array().unwrap();
    assert_eq!(results.len(), 4);
    for r in results {
        assert_eq!(r["errors"], 0, "{r}");
        assert_eq!(r["allocator"]["slope"]["bytes_per_request"], 0.0, "{r}");
        assert!(r["latency_end"]["p99_ms"].as_f64().unwrap() > 0.0);
    }
    assert!(out.path().join("soak.md").exists());
}
