//! The bench's code paths with tiny counts: the Rust service and its Python twin both serve,
//! and the twin's graph leak keeps what Rust's keeps on the heap. Timings are never asserted.

mod common;

use common::lab;

#[test]
fn the_bench_runs_both_services_and_cross_checks_the_leaks() {
    let python = std::env::var("LEAKLAB_PYTHON").expect("run through `cargo xtask test`, which sets LEAKLAB_PYTHON and installs the twin's packages");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("bench.md");
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let output = lab()
        .current_dir(root)
        .args([
            "bench",
            "--requests",
            "40",
            "--leak-requests",
            "60",
            "--concurrency",
            "2",
            "--python",
            &python,
            "--criterion-dir",
        ])
        .arg(dir.path().join("no-criterion-here"))
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
            .lines()
            .rev()
            .take(20)
            .collect::<Vec<_>>()
            .join("\n")
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.with_extension("json")).unwrap())
            .unwrap();
    for side in ["rust_service", "python_service"] {
        assert_eq!(report[side]["errors"], 0, "{side}");
        assert_eq!(report[side]["requests"], 60, "{side}: 20 warm-up + 40");
        assert!(report[side]["requests_per_second"].as_f64().unwrap() > 0.0);
    }
    let leaks = report["leaks"].as_array().unwrap();
    assert_eq!(leaks.len(), 3);
    let graph = &leaks[0];
    assert_eq!(graph["rust_allocator_bytes_per_request"], 81_920.0);
    // The twin keeps the same activations as the Rust service: on the heap, the 81,920 bytes
    // the exact allocator counts in Rust and the allocator's own overhead, in both. Python's
    // reading is steady: 89,001 to 89,034 B over 4 runs (the bench's 150 requests: 89,010 and
    // 89,120), 89,026 to 89,327 B with three busy loops beside the test or in a CI pool; from
    // the exact figure to 1 % over the highest, so that a twin keeping a tenth more is caught.
    // The Rust service's is not, under load: 88,247 to 88,559 B idle, but 95,514 B in a CI run
    // and 128,763 B beside two busy loops with glibc's arenas; with one arena (as the bench now
    // runs it) 87,888 to 88,178 B beside three busy loops, yet 147,758 B once in a CI pool (the
    // cause not established: mallinfo2's in-use bytes grew more per request, not free space).
    // What kept tensors cost is asserted exactly above; on the heap, the Rust reading must hold
    // at least what is kept and less than twice it: a reading doubled or in another unit fails.
    let p = graph["python_heap_bytes_per_request"].as_f64().unwrap();
    let r = graph["rust_heap_bytes_per_request"].as_f64().unwrap();
    eprintln!("graph-leaky on the heap: Rust {r:.0} B/request, Python {p:.0} B/request");
    assert!(
        (81_920.0..90_000.0).contains(&p),
        "python heap {p} B/request"
    );
    assert!(
        (81_920.0..163_840.0).contains(&r),
        "rust heap {r} B/request"
    );
    let md = std::fs::read_to_string(&out).unwrap();
    assert!(md.contains("Rust / Python") && md.contains("Cross-check"));
}
