//! `leaklab-lab run-lab` end to end: real service processes, real HTTP, real libtorch. The
//! stable parts of the verdict table are a snapshot, so a change that reintroduces a leak, or
//! breaks a leaky variant's leak, fails `cargo xtask test`.

mod common;

use common::lab;
use leaklab_vocab::{Device, Stage};
use std::process::Command;

#[test]
fn every_leaky_variant_leaks_and_every_fixed_one_does_not() {
    let out = tempfile::tempdir().unwrap();
    let output = lab()
        .args([
            "run-lab",
            "--json",
            "--device",
            "cpu",
            "--warmup",
            "10",
            "--requests",
            "60",
            "--memory-history",
            "5000",
            "--out",
        ])
        .arg(out.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "run-lab failed\nstdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: leaklab_runner::LabReport = serde_json::from_str(&stdout).unwrap();
    assert!(report.passed);
    insta::assert_snapshot!(report.stable_table());

    // Exact slopes of the leaky variants at the default scale and batch (8 rows).
    let variant = |name: &str| {
        report
            .variants
            .iter()
            .find(|v| v.variant.name() == name)
            .unwrap()
    };
    let slope = |name: &str| {
        variant(name)
            .primary()
            .unwrap()
            .judgement
            .slope
            .bytes_per_request
    };
    assert_eq!(slope("graph-leaky"), 81_920.0);
    assert_eq!(slope("refs-leaky"), 16_384.0);
    assert_eq!(slope("cache-leaky"), 16_384.0);
    assert_eq!(slope("seed"), 98_304.0);
    let stages = |name: &str| variant(name).stages.clone();
    assert_eq!(stages("graph-leaky")[0].stage, Stage::Forward);
    assert_eq!(stages("cache-leaky")[0].stage, Stage::Preprocess);
    // The baseline's bounded cache fills inside this short window: a plateau, born in preprocess.
    let baseline = stages("baseline");
    assert!(
        baseline
            .iter()
            .all(|s| s.verdict == leaklab_detect::Verdict::Plateau && s.stage == Stage::Preprocess),
        "{baseline:?}"
    );

    // Who holds what the run kept, from each variant's snapshot and its native stacks: the top
    // holder of each leaky variant names the file and line of its cause (the graph's forward
    // and the refs' outputs are born in `causes/graph.rs`'s forward, the cache's entries in
    // the pipeline's preprocessing), with at least one block per judged request; the fixed
    // variants keep nothing but their bounded cache.
    for (name, file) in [
        ("graph-leaky", "causes/graph.rs:"),
        ("refs-leaky", "causes/graph.rs:"),
        ("cache-leaky", "pipeline.rs:"),
    ] {
        let top = &variant(name).holders[0];
        let names_it = std::iter::once(&top.site)
            .chain(&top.stack)
            .any(|f| f.contains(&format!("crates/service/src/{file}")));
        assert!(names_it && top.blocks >= 60, "{name}: {top:?}");
    }
    assert!(
        variant("refs-leaky").holders[0]
            .stack
            .iter()
            .any(|f| f.ends_with("forward")),
        "{:?}",
        variant("refs-leaky").holders[0]
    );
    assert!(
        variant("cache-leaky").holders[0]
            .site
            .ends_with("preprocess"),
        "{:?}",
        variant("cache-leaky").holders[0]
    );
    for name in ["graph-fixed", "refs-fixed"] {
        assert!(
            variant(name).holders.is_empty(),
            "{name} keeps {:?}",
            variant(name).holders
        );
    }
    for name in ["cache-fixed", "baseline"] {
        let kept: u64 = variant(name).holders.iter().map(|h| h.blocks).sum();
        assert!(kept <= 32, "{name}: the bounded cache holds 32 entries at most, the snapshot shows {kept} blocks kept");
    }
    // The conv cause lives below c10's allocator: oneDNN's per-shape primitives are malloc and
    // JIT pages, not tensor storage. The exact probe reads 0 B a request, no stage grows and
    // the snapshot holds nothing in either variant, while RSS climbs with the leaky variant's
    // new input shapes (60 judged, each a spectrogram length not seen before) and not with the
    // fixed one's four buckets.
    let rss_rise = |name: &str| {
        variant(name)
            .probes()
            .into_iter()
            .find(|p| p.probe == leaklab_vocab::Probe::Rss)
            .unwrap()
            .judgement
            .rise_bytes
    };
    for name in ["conv-leaky", "conv-fixed"] {
        assert_eq!(slope(name), 0.0, "{name}: the exact probe sees no growth");
        assert!(
            variant(name).stages.is_empty() && variant(name).holders.is_empty(),
            "{name}: {:?} {:?}",
            variant(name).stages,
            variant(name).holders
        );
    }
    // Measured in nine runs of these two variants alone (`leaklab-lab run-lab --device cpu
    // --variant conv-leaky --variant conv-fixed --warmup 10 --requests 60 --memory-history
    // 5000`, torch 2.11 CPU, 2 cores shared with builds): leaky +81.1 to +107.7 MB, about
    // 1.5 MB a new length (six convs, a primitive each); fixed -1.9 to +15.4 MB, the heap's
    // noise under requests of 1 to 128 rows (a three-conv front-end with the same fix read up
    // to +21.8 MB in six runs). Inside this test, after the eight other variants, it spreads
    // wider: in seven runs the leaky rise fell below 50 MB once (its figure was not kept, hence
    // the figures printed now), and the last three read +100.0, +121.6 and +58.0 MB, the fixed
    // one +6.3, +0.3 and +4.6 MB. The bound between them is 30 MB. Since a fixed rise may read a
    // plateau (crates/runner/src/expect.rs: 1.0 to 15.7 MB in 12 runs of the two alone on
    // 2026-12-07, 20.3 MB in a fresh-clone CI, against leaky 62 to 122 MB), the fixed one's
    // rise is also held under half the leaky's of the same run.
    let (leaky, fixed) = (rss_rise("conv-leaky"), rss_rise("conv-fixed"));
    let figures = format!("conv RSS rise: leaky {leaky} B, fixed {fixed} B");
    assert!(leaky > 30e6 && fixed < 30e6, "{figures}");
    assert!(fixed < leaky / 2.0, "{figures}");
    eprintln!("{figures}");

    assert!(std::fs::read_to_string(out.path().join("report.md"))
        .unwrap()
        .contains("Who holds the memory the run kept"));

    // Every file of the report is there, and the snapshots are memory_viz pickles.
    for name in [
        "report.md",
        "report.json",
        "overlay.svg",
        "overlay.png",
        "graph-leaky.svg",
        "seed.png",
        "seed.pickle",
    ] {
        let meta =
            std::fs::metadata(out.path().join(name)).unwrap_or_else(|_| panic!("{name} missing"));
        assert!(meta.len() > 100, "{name} is nearly empty");
    }
    let png = std::fs::read(out.path().join("overlay.png")).unwrap();
    assert_eq!(&png[1..4], b"PNG");
    let pickle = std::fs::read(out.path().join("graph-leaky.pickle")).unwrap();
    assert_eq!(pickle[0], 0x80, "pickle protocol header");
    let leftovers: Vec<_> = std::fs::read_dir(out.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left behind");
}

/// Whether this machine has a CUDA device, as PyTorch says (the libtorch the service links,
/// asked by another program): the test's own answer, not the one under test.
fn cuda_present() -> bool {
    let out = Command::new(common::python())
        .args(["-c", "import torch; print(torch.cuda.is_available())"])
        .output()
        .unwrap();
    match String::from_utf8_lossy(&out.stdout).trim() {
        "True" => true,
        "False" => false,
        other => panic!(
            "torch.cuda.is_available() said {other:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// `--device cuda` runs on CUDA where there is one, and is refused elsewhere: a run that falls
/// back to the CPU fails this test on either kind of machine.
#[test]
fn run_lab_runs_on_cuda_only_where_there_is_one_and_refuses_it_elsewhere_with_exit_2() {
    let out = tempfile::tempdir().unwrap();
    let output = lab()
        .args([
            "run-lab",
            "--json",
            "--device",
            "cuda",
            "--variant",
            "baseline",
            "--warmup",
            "2",
            "--requests",
            "10",
            "--out",
        ])
        .arg(out.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    if cuda_present() {
        assert!(output.status.success(), "a CUDA host: {stderr}");
        let report: leaklab_runner::LabReport = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(report.device, Device::Cuda, "asked for CUDA on a CUDA host");
        return;
    }
    assert_eq!(
        output.status.code(),
        Some(2),
        "no CUDA here, yet: {stderr}\n{}",
        String::from_utf8_lossy(&output.stdout)
    );
    assert!(stderr.contains("CUDA not available"), "{stderr}");
}

/// The wheel's `leaklab` is the instrument: the lab's commands are `leaklab-lab`'s alone.
#[test]
fn the_instruments_binary_has_none_of_the_labs_commands() {
    for sub in ["run-lab", "soak", "bench"] {
        let output = Command::new(env!("CARGO_BIN_EXE_leaklab"))
            .arg(sub)
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "leaklab {sub}");
        assert!(
            String::from_utf8_lossy(&output.stderr)
                .contains(&format!("unrecognized subcommand '{sub}'")),
            "leaklab {sub}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
