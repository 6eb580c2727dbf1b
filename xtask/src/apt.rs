//! Debian packages the tests need (Prometheus's server and promtool): installed when missing
//! and apt-get can (as root); otherwise the caller says SKIPPED rather than pretending to pass.

use crate::process::has;
use std::process::Command;

/// Makes `program` available by installing `package` when it is missing; false when it
/// cannot be had here.
pub fn ensure(program: &str, package: &str) -> bool {
    if has(program) {
        return true;
    }
    let root = Command::new("id").arg("-u").output().map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0").unwrap_or(false);
    if root && Command::new("apt-get").arg("--version").output().is_ok() {
        eprintln!("leaklab: installing Debian's {package} package for {program}");
        let install = || Command::new("apt-get").args(["install", "-y", "-q", package]).env("DEBIAN_FRONTEND", "noninteractive").status().map(|s| s.success()).unwrap_or(false);
        // A fresh machine may have no package lists yet.
        if !install() {
            let _ = Command::new("apt-get").args(["update", "-q"]).status();
            install();
        }
    }
    has(program)
}
