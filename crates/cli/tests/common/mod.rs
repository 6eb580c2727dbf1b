//! Shared by the `leaklab` binary's tests: the binary, wired to the lab's service binary.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// `leaklab-service`, built beside `leaklab` (cargo builds it for `cargo test --workspace`;
/// a `cargo test -p leaklab` alone builds it here, once).
pub fn service_exe() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let path = PathBuf::from(env!("CARGO_BIN_EXE_leaklab")).with_file_name("leaklab-service");
            if !path.exists() {
                let cargo = option_env!("CARGO").unwrap_or("cargo");
                let status = Command::new(cargo).args(["build", "--package", "leaklab-service", "--bin", "leaklab-service"]).status().expect("cargo runs");
                assert!(status.success(), "building leaklab-service failed");
            }
            path
        })
        .clone()
}

pub fn leaklab() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_leaklab"));
    command.env("LEAKLAB_SERVICE", service_exe());
    command
}
