//! House rules, checked as a test (rust-analyzer's `tidy`): every source file opens with a `//!`
//! doc, no test carries an ignore attribute, no trailing whitespace, every deliberate leak has
//! its fix in the same file, the code map names every crate, and the layering holds: the
//! libtorch-free side has no `torch-sys` anywhere in its dependency tree.

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

    /// The libtorch-free side: what installs without a torch install. Every crate is on one
    /// side or the other, so a new crate has to be placed.
    const LIBTORCH_FREE: [&str; 8] = ["leaklab-vocab", "leaklab-detect", "leaklab-runner", "leaklab-client", "leaklab-snapshot", "leaklab-scan", "leaklab-fleet", "leaklab"];
    const TORCH_SIDE: [&str; 5] = ["leaklab-probe", "leaklab-model", "leaklab-service", "leaklab-exercises", "xtask"];

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

    #[test]
    fn the_libtorch_free_side_has_no_torch_sys_in_its_tree() {
        // The resolved graph, as cargo metadata has it: normal and build dependencies (what a
        // `cargo install` builds), not dev-dependencies.
        for name in LIBTORCH_FREE {
            let out = std::process::Command::new(env!("CARGO"))
                .current_dir(workspace_root())
                .args(["tree", "--offline", "--package", name, "--edges", "normal,build", "--prefix", "none", "--format", "{p}"])
                .output()
                .expect("cargo tree runs");
            let tree = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success() && tree.contains(name), "cargo tree -p {name} failed: {}", String::from_utf8_lossy(&out.stderr));
            let torch: Vec<&str> = tree.lines().filter(|l| l.starts_with("torch-sys ") || l.starts_with("tch ") || l.starts_with("leaklab-probe ")).collect();
            assert!(torch.is_empty(), "{name} depends on libtorch through {torch:?}");
        }
    }
}
