//! `leaklab run-lab` end to end: real service processes, real HTTP, real libtorch. The stable
//! parts of the verdict table are a snapshot, so a change that reintroduces a leak, or breaks a
//! leaky variant's leak, fails `cargo xtask test`.

mod common;

use common::leaklab;
use leaklab_vocab::Stage;

#[test]
fn every_leaky_variant_leaks_and_every_fixed_one_does_not() {
    let out = tempfile::tempdir().unwrap();
    let output = leaklab()
        .args(["run-lab", "--json", "--device", "cpu", "--warmup", "10", "--requests", "60", "--memory-history", "5000", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "run-lab failed\nstdout: {stdout}\nstderr: {}", String::from_utf8_lossy(&output.stderr));
    let report: leaklab_runner::LabReport = serde_json::from_str(&stdout).unwrap();
    assert!(report.passed);
    insta::assert_snapshot!(report.stable_table());

    // Exact slopes of the leaky variants at the default scale and batch (8 rows).
    let variant = |name: &str| report.variants.iter().find(|v| v.variant.name() == name).unwrap();
    let slope = |name: &str| variant(name).primary().unwrap().judgement.slope.bytes_per_request;
    assert_eq!(slope("graph-leaky"), 81_920.0);
    assert_eq!(slope("refs-leaky"), 16_384.0);
    assert_eq!(slope("cache-leaky"), 16_384.0);
    assert_eq!(slope("seed"), 98_304.0);
    let stages = |name: &str| variant(name).stages.clone();
    assert_eq!(stages("graph-leaky")[0].stage, Stage::Forward);
    assert_eq!(stages("cache-leaky")[0].stage, Stage::Preprocess);
    // The baseline's bounded cache fills inside this short window: a plateau, born in preprocess.
    let baseline = stages("baseline");
    assert!(baseline.iter().all(|s| s.verdict == leaklab_detect::Verdict::Plateau && s.stage == Stage::Preprocess), "{baseline:?}");

    // Who holds what the run kept, from each variant's snapshot and its native stacks: the top
    // holder of each leaky variant names the file and line of its cause (the graph's forward
    // and the refs' outputs are born in `causes/graph.rs`'s forward, the cache's entries in
    // the pipeline's preprocessing), with at least one block per judged request; the fixed
    // variants keep nothing but their bounded cache.
    for (name, file) in [("graph-leaky", "causes/graph.rs:"), ("refs-leaky", "causes/graph.rs:"), ("cache-leaky", "pipeline.rs:")] {
        let top = &variant(name).holders[0];
        let names_it = std::iter::once(&top.site).chain(&top.stack).any(|f| f.contains(&format!("crates/service/src/{file}")));
        assert!(names_it && top.blocks >= 60, "{name}: {top:?}");
    }
    assert!(variant("refs-leaky").holders[0].stack.iter().any(|f| f.ends_with("forward")), "{:?}", variant("refs-leaky").holders[0]);
    assert!(variant("cache-leaky").holders[0].site.ends_with("preprocess"), "{:?}", variant("cache-leaky").holders[0]);
    for name in ["graph-fixed", "refs-fixed"] {
        assert!(variant(name).holders.is_empty(), "{name} keeps {:?}", variant(name).holders);
    }
    for name in ["cache-fixed", "baseline"] {
        let kept: u64 = variant(name).holders.iter().map(|h| h.blocks).sum();
        assert!(kept <= 32, "{name}: the bounded cache holds 32 entries at most, the snapshot shows {kept} blocks kept");
    }
    assert!(std::fs::read_to_string(out.path().join("report.md")).unwrap().contains("Who holds the memory the run kept"));

    // Every file of the report is there, and the snapshots are memory_viz pickles.
    for name in ["report.md", "report.json", "overlay.svg", "overlay.png", "graph-leaky.svg", "seed.png", "seed.pickle"] {
        let meta = std::fs::metadata(out.path().join(name)).unwrap_or_else(|_| panic!("{name} missing"));
        assert!(meta.len() > 100, "{name} is nearly empty");
    }
    let png = std::fs::read(out.path().join("overlay.png")).unwrap();
    assert_eq!(&png[1..4], b"PNG");
    let pickle = std::fs::read(out.path().join("graph-leaky.pickle")).unwrap();
    assert_eq!(pickle[0], 0x80, "pickle protocol header");
    let leftovers: Vec<_> = std::fs::read_dir(out.path()).unwrap().filter_map(|e| e.ok()).filter(|e| e.file_name().to_string_lossy().ends_with(".tmp")).collect();
    assert!(leftovers.is_empty(), "temporary files left behind");
}

#[test]
fn run_lab_refuses_cuda_without_a_gpu_with_a_clear_message_and_exit_2() {
    let output = leaklab().args(["run-lab", "--device", "cuda", "--variant", "baseline"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    if output.status.success() {
        return; // A CUDA host: the gpu-tests' ground.
    }
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("CUDA not available"), "{stderr}");
}

#[test]
fn a_missing_service_binary_is_named_with_the_way_to_build_it() {
    let output = leaklab().env("LEAKLAB_SERVICE", "/nonexistent/leaklab-service").args(["run-lab"]).output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("cargo build --release -p leaklab-service"), "{}", String::from_utf8_lossy(&output.stderr));
}

#[test]
fn unknown_variants_and_devices_are_named_with_the_known_ones() {
    let output = leaklab().args(["run-lab", "--variant", "nope"]).output().unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("known: graph-leaky"));
    // The device is a vocabulary type from the flag on: refused before any service starts.
    let output = leaklab().env("LEAKLAB_SERVICE", "/nonexistent/leaklab-service").args(["run-lab", "--device", "gpu"]).output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("unknown device `gpu`: use cpu, cuda or auto"), "{}", String::from_utf8_lossy(&output.stderr));
}
