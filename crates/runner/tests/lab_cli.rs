//! `leaklab-lab`'s command line, before any service starts: what it says when the service binary
//! is missing or a flag names nothing it knows. (Its runs against real services are
//! crates/cli/tests/run_lab.rs, reliability.rs, bench_smoke.rs and html.rs; being here also has
//! a workspace test run build this binary for them.)

use std::process::{Command, Output};

/// `leaklab-lab ARGS` with a service binary that is not there.
fn lab(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_leaklab-lab"))
        .env("LEAKLAB_SERVICE", "/nonexistent/leaklab-service")
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn a_missing_service_binary_is_named_with_the_way_to_build_it() {
    for sub in ["run-lab", "soak", "bench"] {
        let output = lab(&[sub]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{sub}: {stderr}");
        assert!(
            stderr.contains("/nonexistent/leaklab-service")
                && stderr.contains("cargo build --release -p leaklab-service"),
            "{sub}: {stderr}"
        );
    }
}

#[test]
fn unknown_variants_and_devices_are_named_with_the_known_ones() {
    let output = lab(&["run-lab", "--variant", "nope"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("known: graph-leaky"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // The device is a vocabulary type from the flag on: refused before any service starts.
    let output = lab(&["run-lab", "--device", "gpu"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&output.stderr)
            .contains("unknown device `gpu`: use cpu, cuda or auto"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
