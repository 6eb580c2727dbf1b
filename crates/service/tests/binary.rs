//! The `leaklab-service` binary as a user meets it: loopback by default, CUDA refused clearly
//! where there is none, unknown variants named with the known ones, weights exported.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

fn service() -> Command {
    Command::new(env!("CARGO_BIN_EXE_leaklab-service"))
}

#[test]
fn the_service_binds_loopback_by_default() {
    let mut child = service()
        .args(["serve", "--variant", "baseline", "--port", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(line.contains("listening on http://127.0.0.1:"), "{line}");
}

#[test]
fn cuda_is_refused_without_a_gpu_with_a_clear_message() {
    if leaklab_probe::cuda::is_available() {
        return; // On a CUDA host this is the gpu-tests' ground.
    }
    for args in [
        &[
            "serve",
            "--variant",
            "baseline",
            "--device",
            "cuda",
            "--port",
            "0",
        ][..],
        &["device", "--device", "cuda"],
    ] {
        let output = service().args(args).output().unwrap();
        assert!(!output.status.success());
        assert!(
            String::from_utf8_lossy(&output.stderr).contains("CUDA not available"),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let auto = service()
        .args(["device", "--device", "auto"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&auto.stdout).trim(), "cpu");
}

#[test]
fn unknown_variants_are_named_with_the_known_ones() {
    let output = service()
        .args(["serve", "--variant", "nope"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("known: graph-leaky"));
}

#[test]
fn weights_export_with_their_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("w.safetensors");
    let status = service()
        .args(["export-weights", "--out"])
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success());
    assert!(std::fs::metadata(&out).unwrap().len() > 4 * 512 * 2048);
    let shapes: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("w.safetensors.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        (shapes["input"].as_i64(), shapes["batch"].as_i64()),
        (Some(512), Some(8))
    );
}
