//! House rules, checked as a test (rust-analyzer's `tidy`): every source file opens with a `//!`
//! doc, a test is ignored only as `#[ignore = "needs a GPU"]` (the device check runs those; the
//! tidy run prints them), no trailing whitespace, every deliberate leak has
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
        let missing: Vec<_> = sources()
            .into_iter()
            .filter(|p| !std::fs::read_to_string(p).unwrap().starts_with("//!"))
            .collect();
        assert!(
            missing.is_empty(),
            "files without a leading //! doc: {missing:?}"
        );
    }

    /// The one reason a test may be ignored: it needs a GPU, and the device check runs it
    /// (`--include-ignored`). Any other ignore (bare, another reason, through `cfg_attr`) hides
    /// a test from CI and is refused.
    const GPU_IGNORE: &str = "#[ignore = \"needs a GPU\"]";

    /// Every `path:line` that ignores a test, and whether it is the allowed attribute.
    fn ignores(path: &Path, text: &str) -> Vec<(String, bool)> {
        let attribute = ["#[", "ignore"].concat();
        let mut found = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            let bare = code.contains(&attribute)
                || (code.contains("cfg_attr(") && code.contains("ignore"));
            if bare {
                found.push((format!("{}:{}", path.display(), i + 1), code == GPU_IGNORE));
            }
        }
        found
    }

    #[test]
    fn tests_are_ignored_only_as_needing_a_gpu_and_no_trailing_whitespace() {
        let mut allowed = Vec::new();
        for path in sources() {
            let text = std::fs::read_to_string(&path).unwrap();
            // This file writes the attributes out, to look for them.
            let scanned = if path.ends_with("xtask/src/tidy.rs") {
                Vec::new()
            } else {
                ignores(&path, &text)
            };
            for (place, ok) in scanned {
                assert!(ok, "{place} ignores a test: only `{GPU_IGNORE}` is allowed, on a line of its own (the device check runs those)");
                allowed.push(place);
            }
            for (i, line) in text.lines().enumerate() {
                assert_eq!(
                    line.trim_end(),
                    line,
                    "{}:{} has trailing whitespace",
                    path.display(),
                    i + 1
                );
            }
        }
        // Printed for the run's log (`cargo xtask test` runs tidy with --nocapture).
        eprintln!(
            "tidy: {} test(s) ignored as needing a GPU{}{}",
            allowed.len(),
            if allowed.is_empty() { "" } else { ": " },
            allowed.join(", ")
        );
    }

    #[test]
    fn only_the_gpu_reason_passes_the_ignore_rule() {
        let path = Path::new("t.rs");
        let verdicts = |text: &str| {
            ignores(path, text)
                .into_iter()
                .map(|(_, ok)| ok)
                .collect::<Vec<_>>()
        };
        assert_eq!(verdicts(&format!("    {GPU_IGNORE}\nfn f() {{}}")), [true]);
        let bare = ["#[", "ignore]"].concat();
        let other = ["#[", "ignore = \"slow\"]"].concat();
        let spaced = ["#[", "ignore=\"needs a GPU\"]"].concat();
        let conditional = "#[cfg_attr(not(feature = \"x\"), ignore)]";
        for text in [bare.as_str(), &other, &spaced, conditional] {
            assert_eq!(verdicts(text), [false], "{text}");
        }
        assert!(verdicts(&format!("// {bare} in a comment")).is_empty());
    }

    #[test]
    fn every_deliberate_leak_sits_beside_its_fix() {
        let mut leaks = 0;
        for path in sources() {
            let text = std::fs::read_to_string(&path).unwrap();
            for cause in ["graph", "refs", "cache", "conv"] {
                let (leak, fix) = (format!("LEAK({cause})"), format!("FIX({cause})"));
                if text.contains(&leak) {
                    leaks += 1;
                    assert!(
                        text.contains(&fix),
                        "{} marks {leak} without its {fix} twin",
                        path.display()
                    );
                }
            }
        }
        assert!(leaks >= 3, "the three causes are marked");
    }

    #[test]
    fn the_code_map_names_every_crate() {
        let root = workspace_root();
        let map = std::fs::read_to_string(root.join("docs/architecture.md"))
            .expect("docs/architecture.md exists");
        for entry in std::fs::read_dir(root.join("crates")).unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            assert!(
                map.contains(&format!("crates/{name}")),
                "docs/architecture.md does not mention crates/{name}"
            );
        }
    }

    /// The libtorch-free side: what installs without a torch install, and the xtask, which
    /// provisions libtorch and so must build without it. Every crate is on one side or the
    /// other, so a new crate has to be placed.
    const LIBTORCH_FREE: [&str; 13] = [
        "leaklab-vocab",
        "leaklab-proc",
        "leaklab-detect",
        "leaklab-judge",
        "leaklab-report",
        "leaklab-runner",
        "leaklab-client",
        "leaklab-snapshot",
        "leaklab-scan",
        "leaklab-fleet",
        "leaklab-watch",
        "leaklab",
        "xtask",
    ];
    const TORCH_SIDE: [&str; 4] = [
        "leaklab-probe",
        "leaklab-model",
        "leaklab-service",
        "leaklab-exercises",
    ];

    /// The workspace's packages, as cargo reads the manifests (`cargo metadata`).
    fn package_names() -> Vec<String> {
        let out = std::process::Command::new(env!("CARGO"))
            .current_dir(workspace_root())
            .args([
                "metadata",
                "--format-version",
                "1",
                "--no-deps",
                "--offline",
            ])
            .output()
            .expect("cargo metadata runs");
        assert!(
            out.status.success(),
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let metadata: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON");
        let mut names: Vec<String> = metadata["packages"]
            .as_array()
            .expect("cargo metadata lists packages")
            .iter()
            .map(|p| p["name"].as_str().expect("a package has a name"))
            .map(str::to_string)
            .collect();
        names.sort();
        assert!(
            names.len() >= LIBTORCH_FREE.len(),
            "cargo metadata lists {names:?}"
        );
        names
    }

    #[test]
    fn every_crate_is_placed_on_one_side_of_the_libtorch_line() {
        for name in package_names() {
            assert!(
                LIBTORCH_FREE.contains(&name.as_str()) ^ TORCH_SIDE.contains(&name.as_str()),
                "{name}: add it to LIBTORCH_FREE or TORCH_SIDE in xtask/src/tidy.rs"
            );
        }
    }

    /// The crates `name` builds with, one `name version` a line, as cargo resolves them: normal
    /// and build dependencies (what a `cargo install` builds), not dev-dependencies.
    fn dependency_tree(name: &str) -> String {
        let out = std::process::Command::new(env!("CARGO"))
            .current_dir(workspace_root())
            .args([
                "tree",
                "--offline",
                "--package",
                name,
                "--edges",
                "normal,build",
                "--prefix",
                "none",
                "--format",
                "{p}",
            ])
            .output()
            .expect("cargo tree runs");
        let tree = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success() && tree.contains(name),
            "cargo tree -p {name} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        tree
    }

    #[test]
    fn the_libtorch_free_side_has_no_torch_sys_in_its_tree() {
        for name in LIBTORCH_FREE {
            let tree = dependency_tree(name);
            let torch: Vec<&str> = tree
                .lines()
                .filter(|l| {
                    l.starts_with("torch-sys ")
                        || l.starts_with("tch ")
                        || l.starts_with("leaklab-probe ")
                })
                .collect();
            assert!(
                torch.is_empty(),
                "{name} depends on libtorch through {torch:?}"
            );
        }
    }

    /// What each crate takes of the report crate is what it needs: the detector (an API
    /// boundary for users' tests) only its units, so no page, plot or progress bar under it; the
    /// fleet scan no plots.
    #[test]
    fn the_detector_draws_nothing_and_the_fleet_no_plots() {
        for (name, absent) in [
            (
                "leaklab-detect",
                &["plotters", "image", "maud", "indicatif", "tempfile"][..],
            ),
            ("leaklab-fleet", &["plotters", "image"][..]),
        ] {
            let found = found_in_tree(name, absent);
            assert!(
                found.is_empty(),
                "{name} depends on {found:?}: ask leaklab-report for fewer features"
            );
        }
    }

    /// The crates of `absent` found in `name`'s dependency tree.
    fn found_in_tree(name: &str, absent: &[&str]) -> Vec<String> {
        dependency_tree(name)
            .lines()
            .filter(|l| absent.iter().any(|a| l.starts_with(&format!("{a} "))))
            .map(str::to_string)
            .collect()
    }

    /// The judgement is a pure function of its evidence: nothing in its tree reads a process, a
    /// file format of its own, the network, a clock-driven runtime or a GPU, nor draws.
    #[test]
    fn the_judge_reads_nothing_but_its_evidence() {
        let absent = [
            "tokio",
            "reqwest",
            "leaklab-proc",
            "leaklab-snapshot",
            "leaklab-client",
            "nvml-wrapper",
            "plotters",
            "maud",
            "indicatif",
            "tempfile",
        ];
        let found = found_in_tree("leaklab-judge", &absent);
        assert!(
            found.is_empty(),
            "leaklab-judge depends on {found:?}: it takes evidence in and gives a judgement out"
        );
    }

    /// The names `Probe::name` gives, each written there and nowhere else as a string of its own
    /// (a selector such as `leaklab_memory_bytes{probe="cpu_allocator_live"}`, or a comment, may
    /// name one). `rss` is left out: `scan` has a series of that name, the process tree's RSS
    /// from `smaps_rollup`, which is the same memory seen from outside.
    #[test]
    fn a_probes_name_is_written_only_in_probe_name() {
        let home = workspace_root().join("crates/vocab/src/probe.rs");
        let names = [
            "cpu_allocator_live",
            "malloc_heap",
            "cuda_allocated",
            "cuda_reserved",
            "nvml_process",
        ];
        let home_text = std::fs::read_to_string(&home).unwrap();
        for name in names {
            assert_eq!(
                home_text.matches(&format!("\"{name}\"")).count(),
                1,
                "{}: `{name}` is written once, in Probe::name",
                home.display()
            );
        }
        // This file names them too, to look for them.
        for path in sources()
            .into_iter()
            .filter(|p| *p != home && !p.ends_with("xtask/src/tidy.rs"))
        {
            let text = std::fs::read_to_string(&path).unwrap();
            for name in names {
                assert!(
                    !text.contains(&format!("\"{name}\"")),
                    "{} writes the probe name \"{name}\": use Probe::{{..}}.name()",
                    path.display()
                );
            }
        }
    }

    /// The xtask's modules: one per task, over helpers. A task imports helpers only, so each
    /// task can be read (and changed) alone; `wheel` and `bundle` build the two shipped
    /// artifacts, which their own commands and `test` (CI) share, so they are helpers too.
    const XTASK_TASKS: [&str; 7] = ["run_lab", "test", "bench", "soak", "serve", "lab", "corpus"];
    const XTASK_HELPERS: [&str; 5] = ["provision", "process", "apt", "wheel", "bundle"];

    #[test]
    fn no_xtask_task_imports_another_tasks_module() {
        let src = workspace_root().join("xtask/src");
        let main = std::fs::read_to_string(src.join("main.rs")).unwrap();
        let declared: Vec<&str> = main
            .lines()
            .filter_map(|l| l.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')))
            .collect();
        for module in &declared {
            assert!(XTASK_TASKS.contains(module) ^ XTASK_HELPERS.contains(module) ^ (*module == "tidy"), "xtask module `{module}`: add it to XTASK_TASKS or XTASK_HELPERS in xtask/src/tidy.rs");
        }
        for task in XTASK_TASKS {
            let text = std::fs::read_to_string(src.join(format!("{task}.rs"))).unwrap();
            for other in declared
                .iter()
                .filter(|m| !XTASK_HELPERS.contains(m) && **m != task)
            {
                for import in [
                    format!("crate::{other}::"),
                    format!("crate::{other};"),
                    format!("crate::{other}}}"),
                    format!("crate::{other},"),
                ] {
                    assert!(!text.contains(&import), "xtask/src/{task}.rs imports the `{other}` task ({import}): move what both need into a helper");
                }
            }
        }
    }

    /// The snapshot crate is layered one way: a module names (`crate::` paths, in `use` lines
    /// or inline) only modules of its own layer or below. `lib` is the crate root, and any
    /// `crate::Item` that is not a module is the root's.
    #[test]
    fn the_snapshot_crate_is_layered_one_way() {
        const SNAPSHOT_LAYERS: [&[&str]; 4] = [
            &["pickle"],
            &["model", "build", "record"],
            &["explain", "diff"],
            &["trim", "render", "report", "lib"],
        ];
        let layer = |module: &str| SNAPSHOT_LAYERS.iter().position(|l| l.contains(&module));
        // The first segment of every `crate::` path in the code (comments left out).
        fn named(text: &str) -> Vec<String> {
            let code: String = text
                .lines()
                .map(|l| l.split("//").next().unwrap_or(""))
                .collect::<Vec<_>>()
                .join("\n");
            let ident = |s: &str| {
                s.trim_start()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect::<String>()
            };
            let mut out = Vec::new();
            for (at, _) in code.match_indices("crate::") {
                if code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == '$') {
                    continue;
                }
                let rest = &code[at + "crate::".len()..];
                match rest.strip_prefix('{') {
                    Some(group) => {
                        let (mut depth, mut start) = (0, 0);
                        for (i, c) in group.char_indices() {
                            match c {
                                '{' => depth += 1,
                                '}' if depth == 0 => {
                                    out.push(ident(&group[start..i]));
                                    break;
                                }
                                '}' => depth -= 1,
                                ',' if depth == 0 => {
                                    out.push(ident(&group[start..i]));
                                    start = i + 1;
                                }
                                _ => {}
                            }
                        }
                    }
                    None => out.push(ident(rest)),
                }
            }
            out.retain(|m| !m.is_empty());
            out
        }
        // The checker catches both forms, and not what a comment says.
        let sample = "use crate::{explain::View, model::{Since, Snapshot}};\nlet t = crate::trim::trim(); // crate::report\n";
        assert_eq!(named(sample), ["explain", "model", "trim"]);
        let src = workspace_root().join("crates/snapshot/src");
        let mut wrong = Vec::new();
        for entry in std::fs::read_dir(&src).unwrap().flatten() {
            let path = entry.path();
            let module = path.file_stem().unwrap().to_string_lossy().to_string();
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let own = layer(&module).unwrap_or_else(|| panic!("crates/snapshot/src/{module}.rs is in no layer: add it to SNAPSHOT_LAYERS in xtask/src/tidy.rs"));
            for name in named(&std::fs::read_to_string(&path).unwrap()) {
                let theirs = layer(&name).unwrap_or(SNAPSHOT_LAYERS.len() - 1);
                if theirs > own {
                    wrong.push(format!(
                        "{module}.rs (layer {own}) names crate::{name} (layer {theirs})"
                    ));
                }
            }
        }
        assert!(wrong.is_empty(), "the snapshot crate imports upward (layers, lowest first: {SNAPSHOT_LAYERS:?}): {wrong:#?}");
    }
}
