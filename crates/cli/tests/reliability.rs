//! The drivers under faults, the service's exposure, and the short soak.

mod common;

use common::leaklab;
use std::process::Stdio;

#[test]
fn run_lab_survives_a_service_that_dies_mid_run() {
    let out = tempfile::tempdir().unwrap();
    let output = leaklab()
        .env("LEAKLAB_CRASH_AFTER", "refs-leaky:15")
        .args(["run-lab", "--json", "--device", "cpu", "--warmup", "5", "--requests", "40", "--variant", "refs-leaky", "--variant", "baseline", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "an unexpected verdict (a failed run) exits 1");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let crashed = &report["variants"][0];
    assert_eq!(crashed["variant"], "refs-leaky");
    assert_eq!(crashed["outcome"], "failed");
    let reason = crashed["reason"].as_str().unwrap();
    assert!(reason.contains("service exited") && reason.contains("crashing on purpose"), "{reason}");
    let baseline = &report["variants"][1];
    assert_eq!(baseline["passed"], true, "the other variants go on");
    assert!(out.path().join("report.md").exists());
    assert!(std::fs::read_to_string(out.path().join("report.md")).unwrap().contains("Run failed: service exited"));
}

#[test]
fn a_killed_run_leaves_no_half_written_report() {
    let out = tempfile::tempdir().unwrap();
    let mut child = leaklab().args(["run-lab", "--device", "cpu", "--requests", "100000", "--out"]).arg(out.path()).stderr(Stdio::null()).stdout(Stdio::null()).spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_secs(3));
    child.kill().unwrap();
    child.wait().unwrap();
    // Nothing is written until the run ends, and then only through temp file + rename.
    let names: Vec<String> = std::fs::read_dir(out.path()).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    assert!(names.is_empty(), "files from a killed run: {names:?}");
    // And its service process went with it (parent-death signal), rather than serving on.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let orphans: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains("leaklab-service") && c.contains("serve --variant graph-leaky") && c.contains("20000"))
        .collect();
    assert!(orphans.is_empty(), "a service outlived its killed lab: {orphans:?}");
}

#[test]
fn the_short_soak_holds_every_fixed_variant_at_zero_bytes_per_request() {
    let out = tempfile::tempdir().unwrap();
    let output = leaklab().args(["soak", "--short", "--json", "--requests", "300", "--out"]).arg(out.path()).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
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
