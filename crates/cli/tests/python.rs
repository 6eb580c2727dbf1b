//! The Python package's suite (crates/cli/python/tests) and the zoo's in-process checks
//! (lab/zoo/test_zoo_plugin.py), a pytest process per group of modules, as tests of the one
//! nextest pool: the groups run beside each other and beside the Rust tests instead of one after
//! another at the end (130 s on 2 cores, 2026-12-05), and the pool's slots keep a
//! timing-sensitive test alone. A group shares one interpreter, one `import torch` (1.6 to 2.3 s
//! of CPU) and one pytest start-up (2.6 to 2.8 s in all): the agent's and the census's six
//! modules took 24 and 28 s of CPU as one process against 42 to 52 s as six (2026-12-06, side by
//! side on a loaded machine). `cargo xtask test` installs the wheel into the torch venv first,
//! so the suite tests the installed package and its `leaklab` binary; elsewhere the package
//! comes from the source tree (conftest.py). A group of its own also keeps the zoo's checks out
//! of the package's process (collected together, torch._inductor's test operators registered
//! twice).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `modules` (relative to the repository's root), in that order, in one pytest process in
/// the torch venv's python.
fn pytest(modules: &[&str]) {
    let mut command = Command::new(common::python());
    command.args(["-m", "pytest", "-q", "-p", "no:cacheprovider"]);
    for module in modules {
        let path = root().join(module);
        assert!(path.is_file(), "{} is not there", path.display());
        command.arg(path);
    }
    let out = command
        .current_dir(root())
        .output()
        .expect("the torch venv's python runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // pytest exits 5 when it collected nothing: a group whose tests all vanished fails too.
    assert!(
        out.status.success(),
        "pytest {}: {}\n{text}",
        modules.join(" "),
        out.status
    );
    eprintln!("{text}");
}

macro_rules! groups {
    ($($name:ident => [$($path:literal),+ $(,)?],)*) => {
        $(#[test] fn $name() { pytest(&[$($path),+]) })*
        const MODULES: &[&str] = &[$($($path),+),*];
    };
}

// Each test a group of modules in one pytest process, in the order listed; a module's tests
// must not depend on running alone (each holds its own state: its fixtures, its KEEP lists,
// the collector as it found it).
groups! {
    // The agent, the census, the twin under the plugin and the native trace: 54 s of CPU in
    // all. Each module's own CPU in this process and alone (one run each, 2026-12-06): the twin
    // 17.9 s against 17.8, the native trace 11.9 against 11.2; each saves a start-up. The native
    // trace last: joined before test_process_state.py, whose trim probe then read 35 MB given
    // back of 71 MB freed (one run at a load of 12; its bound is 90 %).
    package_modules => [
        "crates/cli/python/tests/test_agent.py",
        "crates/cli/python/tests/test_ceilings.py",
        "crates/cli/python/tests/test_census.py",
        "crates/cli/python/tests/test_holders.py",
        "crates/cli/python/tests/test_generated_names.py",
        "crates/cli/python/tests/test_process_state.py",
        "crates/cli/python/tests/test_workers.py",
        "crates/cli/python/tests/test_serve_agent.py",
        "crates/cli/python/tests/test_pytest_plugin_twin.py",
        "crates/cli/python/tests/test_native.py",
        "crates/cli/python/tests/test_pytrace.py",
    ],
    // Alone: after the plugin's inline sessions (whose objects outlive them) the twin's module
    // took 26 s of CPU, alone 18 s (one run each).
    pytest_plugin => ["crates/cli/python/tests/test_pytest_plugin.py"],
    zoo_plugin => ["lab/zoo/test_zoo_plugin.py"],
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
