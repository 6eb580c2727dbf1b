//! House rules, checked as a test (rust-analyzer's `tidy`): every source file opens with a `//!`
//! doc, no test carries an ignore attribute, no trailing whitespace, every deliberate leak has
//! its fix in the same file, the code map names every crate, a probe's name is written only in
//! `Probe::name`, no xtask task imports another task's module, and the layering holds: the
//! libtorch-free side (the xtask included) has no `torch-sys` anywhere in its dependency tree.

#[cfg(test)]
mod tests {
    use crate::provision::workspace_root;
    use std::path::{Path, PathBuf};

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().to_string();
            if path.is_dir() && name != "target" && !name.starts_with('.') {
                rust_files(&path, out);
            } else if name.ends_with(".rs") {
                out.push(path);
            }
        }
    }

    fn sources() -> Vec<PathBuf> {
        let root = workspace_root();
        let mut files = Vec::new();
        for dir in ["crates", "xtask", "lab"] {
            if root.join(dir).exists() {
                rust_files(&root.join(dir), &mut files);
            }
        }
        assert!(files.len() > 20, "found only {} sources", files.len());
        files
    }

    #[test]
    fn every_source_file_opens_with_a_doc_comment() {
        let missing: Vec<_> = sources().into_iter().filter(|p| !std::fs::read_to_string(p).unwrap().starts_with("//!")).collect();
        assert!(missing.is_empty(), "files without a leading //! doc: {missing:?}");
    }

    #[test]
    fn no_ignored_tests_and_no_trailing_whitespace() {
        let ignore = ["#[", "ignore]"].concat();
        for path in sources() {
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(!text.contains(&ignore), "{} ignores a test", path.display());
            for (i, line) in text.lines().enumerate() {
                assert_eq!(line.trim_end(), line, "{}:{} has trailing whitespace", path.display(), i + 1);
            }
        }
    }

    #[test]
    fn every_deliberate_leak_sits_beside_its_fix() {
        let mut leaks = 0;
        for path in sources() {
            let text = std::fs::read_to_string(&path).unwrap();
            for cause in ["graph", "refs", "cache"] {
                let (leak, fix) = (format!("LEAK({cause})"), format!("FIX({cause})"));
                if text.contains(&leak) {
                    leaks += 1;
                    assert!(text.contains(&fix), "{} marks {leak} without its {fix} twin", path.display());
                }
            }
        }
        assert!(leaks >= 3, "the three causes are marked");
    }

    #[test]
    fn the_code_map_names_every_crate() {
        let root = workspace_root();
        let map = std::fs::read_to_string(root.join("docs/architecture.md")).expect("docs/architecture.md exists");
        for entry in std::fs::read_dir(root.join("crates")).unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            assert!(map.contains(&format!("crates/{name}")), "docs/architecture.md does not mention crates/{name}");
        }
    }

    /// The libtorch-free side: what installs without a torch install, and the xtask, which
    /// provisions libtorch and so must build without it. Every crate is on one side or the
    /// other, so a new crate has to be placed.
    const LIBTORCH_FREE: [&str; 11] =
        ["leaklab-vocab", "leaklab-proc", "leaklab-detect", "leaklab-report", "leaklab-runner", "leaklab-client", "leaklab-snapshot", "leaklab-scan", "leaklab-fleet", "leaklab", "xtask"];
    const TORCH_SIDE: [&str; 4] = ["leaklab-probe", "leaklab-model", "leaklab-service", "leaklab-exercises"];

    fn package_names() -> Vec<String> {
        let root = workspace_root();
        let mut names = Vec::new();
        for dir in ["crates", "lab", "."] {
            for entry in std::fs::read_dir(root.join(dir)).unwrap().flatten() {
                let manifest = if dir == "." { root.join("xtask/Cargo.toml") } else { entry.path().join("Cargo.toml") };
                if let Ok(text) = std::fs::read_to_string(&manifest) {
                    if let Some(name) = text.lines().find_map(|l| l.strip_prefix("name = \"").and_then(|r| r.strip_suffix('"'))) {
                        names.push(name.to_string());
                    }
                }
                if dir == "." {
                    break;
                }
            }
        }
        names.sort();
        names.dedup();
        names
    }

    #[test]
    fn every_crate_is_placed_on_one_side_of_the_libtorch_line() {
        for name in package_names() {
            assert!(LIBTORCH_FREE.contains(&name.as_str()) ^ TORCH_SIDE.contains(&name.as_str()), "{name}: add it to LIBTORCH_FREE or TORCH_SIDE in xtask/src/tidy.rs");
        }
    }

    /// The crates `name` builds with, one `name version` a line, as cargo resolves them: normal
    /// and build dependencies (what a `cargo install` builds), not dev-dependencies.
    fn dependency_tree(name: &str) -> String {
        let out = std::process::Command::new(env!("CARGO"))
            .current_dir(workspace_root())
            .args(["tree", "--offline", "--package", name, "--edges", "normal,build", "--prefix", "none", "--format", "{p}"])
            .output()
            .expect("cargo tree runs");
        let tree = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success() && tree.contains(name), "cargo tree -p {name} failed: {}", String::from_utf8_lossy(&out.stderr));
        tree
    }

    #[test]
    fn the_libtorch_free_side_has_no_torch_sys_in_its_tree() {
        for name in LIBTORCH_FREE {
            let tree = dependency_tree(name);
            let torch: Vec<&str> = tree.lines().filter(|l| l.starts_with("torch-sys ") || l.starts_with("tch ") || l.starts_with("leaklab-probe ")).collect();
            assert!(torch.is_empty(), "{name} depends on libtorch through {torch:?}");
        }
    }

    /// What each crate takes of the report crate is what it needs: the detector (an API
    /// boundary for users' tests) only its units, so no page, plot or progress bar under it; the
    /// fleet scan no plots.
    #[test]
    fn the_detector_draws_nothing_and_the_fleet_no_plots() {
        for (name, absent) in [("leaklab-detect", &["plotters", "image", "maud", "indicatif", "tempfile"][..]), ("leaklab-fleet", &["plotters", "image"][..])] {
            let tree = dependency_tree(name);
            let found: Vec<&str> = tree.lines().filter(|l| absent.iter().any(|a| l.starts_with(&format!("{a} ")))).collect();
            assert!(found.is_empty(), "{name} depends on {found:?}: ask leaklab-report for fewer features");
        }
    }

    /// The names `Probe::name` gives, each written there and nowhere else as a string of its own
    /// (a selector such as `leaklab_memory_bytes{probe="cpu_allocator_live"}`, or a comment, may
    /// name one). `rss` is left out: `scan` has a series of that name, the process tree's RSS
    /// from `smaps_rollup`, which is the same memory seen from outside.
    #[test]
    fn a_probes_name_is_written_only_in_probe_name() {
        let home = workspace_root().join("crates/vocab/src/probe.rs");
        let names = ["cpu_allocator_live", "malloc_heap", "cuda_allocated", "cuda_reserved", "nvml_process"];
        let home_text = std::fs::read_to_string(&home).unwrap();
        for name in names {
            assert_eq!(home_text.matches(&format!("\"{name}\"")).count(), 1, "{}: `{name}` is written once, in Probe::name", home.display());
        }
        // This file names them too, to look for them.
        for path in sources().into_iter().filter(|p| *p != home && !p.ends_with("xtask/src/tidy.rs")) {
            let text = std::fs::read_to_string(&path).unwrap();
            for name in names {
                assert!(!text.contains(&format!("\"{name}\"")), "{} writes the probe name \"{name}\": use Probe::{{..}}.name()", path.display());
            }
        }
    }

    /// The xtask's modules: one per task, over helpers. A task imports helpers only, so each
    /// task can be read (and changed) alone; `wheel` and `bundle` build the two shipped
    /// artifacts, which their own commands and `test` (CI) share, so they are helpers too.
    const XTASK_TASKS: [&str; 6] = ["run_lab", "test", "bench", "soak", "serve", "lab"];
    const XTASK_HELPERS: [&str; 5] = ["provision", "process", "apt", "wheel", "bundle"];

    #[test]
    fn no_xtask_task_imports_another_tasks_module() {
        let src = workspace_root().join("xtask/src");
        let main = std::fs::read_to_string(src.join("main.rs")).unwrap();
        let declared: Vec<&str> = main.lines().filter_map(|l| l.strip_prefix("mod ").and_then(|r| r.strip_suffix(';'))).collect();
        for module in &declared {
            assert!(XTASK_TASKS.contains(module) ^ XTASK_HELPERS.contains(module) ^ (*module == "tidy"), "xtask module `{module}`: add it to XTASK_TASKS or XTASK_HELPERS in xtask/src/tidy.rs");
        }
        for task in XTASK_TASKS {
            let text = std::fs::read_to_string(src.join(format!("{task}.rs"))).unwrap();
            for other in declared.iter().filter(|m| !XTASK_HELPERS.contains(m) && **m != task) {
                for import in [format!("crate::{other}::"), format!("crate::{other};"), format!("crate::{other}}}"), format!("crate::{other},")] {
                    assert!(!text.contains(&import), "xtask/src/{task}.rs imports the `{other}` task ({import}): move what both need into a helper");
                }
            }
        }
    }
}
