//! Debian packages the tests need (Prometheus's server and promtool; chromium, which opens the
//! report pages headless): installed when missing and apt-get can (as root); otherwise the
//! caller fails under `CI=true` and elsewhere says SKIPPED, a row of its own in the table of
//! `cargo xtask test`, rather than pretending to pass.
//!
//! Without recommended packages: the tests need the programs, not a desktop. For chromium that
//! is 19 packages instead of 128, and 13 s instead of 67 s on a 2-core machine (measured here,
//! Debian 12, chromium 156).

use crate::process::has;
use std::process::Command;

/// Makes `program` available by installing `package` when it is missing; false when it
/// cannot be had here.
pub fn ensure(program: &str, package: &str) -> bool {
    if has(program) {
        return true;
    }
    install(package, program);
    has(program)
}

/// Makes the file `path` (a shared library) present by installing `package` when it is
/// missing; false when it cannot be had here.
pub fn ensure_file(path: &std::path::Path, package: &str) -> bool {
    if path.exists() {
        return true;
    }
    install(package, &path.display().to_string());
    path.exists()
}

/// `apt-get install` of `package` (for `what`), as root where apt-get is there.
fn install(package: &str, what: &str) {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    if root && Command::new("apt-get").arg("--version").output().is_ok() {
        eprintln!("leaklab: installing Debian's {package} package for {what}");
        let apt_get = || {
            Command::new("apt-get")
                .args(["install", "-y", "-q", "--no-install-recommends", package])
                .env("DEBIAN_FRONTEND", "noninteractive")
                .status()
                .map(|s| s.success())
                .unwrap_or(false)
        };
        // A fresh machine may have no package lists yet.
        if !apt_get() {
            let _ = Command::new("apt-get").args(["update", "-q"]).status();
            apt_get();
        }
    }
}
