//! The Python package's suite (crates/cli/python/tests) and the zoo's in-process checks
//! (lab/zoo/test_zoo_plugin.py), a pytest process per module, as tests of the one nextest pool:
//! the modules run beside each other and beside the Rust tests instead of one after another at
//! the end (130 s on 2 cores, 2026-12-05), and the pool's slots keep a timing-sensitive test
//! alone. `cargo xtask test` installs the wheel into the torch venv first, so the suite tests
//! the installed package and its `leaklab` binary; elsewhere the package comes from the source
//! tree (conftest.py). A module of its own also keeps the zoo's checks out of the package's
//! process (collected together, torch._inductor's test operators registered twice).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `module` (relative to the repository's root) under pytest in the torch venv's python.
fn pytest(module: &str) {
    let path = root().join(module);
    assert!(path.is_file(), "{} is not there", path.display());
    let out = Command::new(common::python())
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .arg(&path)
        .current_dir(root())
        .output()
        .expect("the torch venv's python runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // pytest exits 5 when it collected nothing: a module whose tests all vanished fails too.
    assert!(
        out.status.success(),
        "pytest {module}: {}\n{text}",
        out.status
    );
    eprintln!("{text}");
}

macro_rules! modules {
    ($($name:ident => $path:literal,)*) => {
        $(#[test] fn $name() { pytest($path) })*
        const MODULES: &[&str] = &[$($path),*];
    };
}

modules! {
    agent => "crates/cli/python/tests/test_agent.py",
    ceilings => "crates/cli/python/tests/test_ceilings.py",
    census => "crates/cli/python/tests/test_census.py",
    holders => "crates/cli/python/tests/test_holders.py",
    native => "crates/cli/python/tests/test_native.py",
    process_state => "crates/cli/python/tests/test_process_state.py",
    pytest_plugin => "crates/cli/python/tests/test_pytest_plugin.py",
    pytest_plugin_twin => "crates/cli/python/tests/test_pytest_plugin_twin.py",
    workers => "crates/cli/python/tests/test_workers.py",
    zoo_plugin => "lab/zoo/test_zoo_plugin.py",
}

/// A new `test_*.py` runs nowhere until it is listed above.
#[test]
fn every_python_test_module_is_listed() {
    let mut found = Vec::new();
    for dir in ["crates/cli/python/tests", "lab/zoo"] {
        for entry in std::fs::read_dir(root().join(dir)).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            if name.starts_with("test_") && name.ends_with(".py") {
                found.push(format!("{dir}/{name}"));
            }
        }
    }
    let missing: Vec<&String> = found
        .iter()
        .filter(|m| !MODULES.contains(&m.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "list these in crates/cli/tests/python.rs: {missing:?}"
    );
}
