//! House rules, checked as a test (rust-analyzer's `tidy`): every source file opens with a `//!`
//! doc, no test carries an ignore attribute, no trailing whitespace, every deliberate leak has its fix in the
//! same file, and the code map names every crate.

#[cfg(test)]
mod tests {
    use crate::torch::workspace_root;
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
}
