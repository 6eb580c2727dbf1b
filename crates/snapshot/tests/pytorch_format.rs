//! `explain` and `diff` on files written by PyTorch's own Python: a snapshot PyTorch builds from
//! a real profile of a leaking loop, the `_snapshot()` format at four pickle protocols with
//! every state and action plus keys from a newer PyTorch, and bad files of every kind.

use leaklab_snapshot::{diff, explain, load, Since, View};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The fixtures, made once per test run by tests/make_snapshots.py with the provisioned torch.
fn fixtures() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let python = std::env::var("LEAKLAB_PYTHON").expect("run through `cargo xtask test`, which sets LEAKLAB_PYTHON to a python with torch");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/make_snapshots.py");
        let out = std::process::Command::new(python).arg(script).arg(dir.path()).output().unwrap();
        assert!(out.status.success(), "make_snapshots.py failed: {}", String::from_utf8_lossy(&out.stderr));
        dir
    })
    .path()
}

fn file(name: &str) -> PathBuf {
    fixtures().join(name)
}

#[test]
fn a_real_pytorch_snapshot_names_the_line_that_allocated_the_kept_outputs() {
    let oracle: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(file("profiled.oracle.json")).unwrap()).unwrap();
    let snap = load(&file("profiled.pickle")).unwrap();
    let e = explain(&snap, View::default(), None);
    assert_eq!(e.allocated_bytes, oracle["live_bytes"].as_u64().unwrap(), "the same total as PyTorch's own data");
    let blocks: u64 = e.holders.iter().map(|h| h.blocks).sum();
    assert_eq!(blocks, oracle["live_blocks"].as_u64().unwrap());
    // The 20 kept outputs (16 × 64 f32 each) were allocated by the forward called in handle().
    let kept = e.holders.iter().find(|h| h.site.contains("make_snapshots.py:") && h.site.ends_with("in handle")).unwrap_or_else(|| panic!("{:#?}", e.holders));
    assert_eq!(kept.bytes, oracle["kept_output_bytes"].as_u64().unwrap());
    assert_eq!(kept.blocks, 20);
}

#[test]
fn every_protocol_reads_the_same_and_states_and_actions_are_told_apart() {
    let reference = explain(&load(&file("handmade_p4.pickle")).unwrap(), View::default(), Some(Since::Event(0)));
    for proto in [0, 2, 5] {
        let e = explain(&load(&file(&format!("handmade_p{proto}.pickle"))).unwrap(), View::default(), Some(Since::Event(0)));
        assert_eq!(serde_json::to_value(&e).unwrap(), serde_json::to_value(&reference).unwrap(), "protocol {proto}");
    }
    let e = reference;
    // 8 × 2 MiB kept by the cache, then 100 requests × 32 kB by record_metrics: largest first.
    assert_eq!(e.holders[0].site, "/srv/app/service.py:30 in features", "torch's frame is skipped by default");
    assert_eq!((e.holders[0].bytes, e.holders[0].blocks), (8 * (2 << 20), 8));
    assert_eq!(e.holders[1].site, "/srv/app/service.py:57 in record_metrics");
    assert_eq!((e.holders[1].bytes, e.holders[1].blocks), (100 * 32768, 100));
    assert_eq!(e.allocated_bytes, 100 * 32768 + 8 * (2 << 20));
    assert_eq!(e.pending_free_bytes, 2 * (512 << 10), "one pending block per segment");
    assert_eq!(e.reserved_bytes, e.allocated_bytes + e.pending_free_bytes + e.unallocated_bytes);
    assert!(e.fragmented_segments[0].unallocated > 0);
    // Since the start, what was allocated and never freed is what is live (the transient
    // activations were freed); an unknown action from a newer PyTorch is passed over.
    let since = e.since.unwrap();
    assert_eq!(since.bytes, e.allocated_bytes);
    assert_eq!(since.holders[1].site, "/srv/app/service.py:57 in record_metrics");
    let all = explain(&load(&file("handmade_p4.pickle")).unwrap(), View { all_frames: true }, None);
    assert!(all.holders.iter().any(|h| h.site.contains("torch/nn/modules/linear.py:200")), "--all-frames keeps torch's frames");
}

#[test]
fn since_a_late_point_sees_only_what_crossed_it() {
    let snap = load(&file("handmade_p4.pickle")).unwrap();
    let total = snap.traces[0].len();
    let late = explain(&snap, View::default(), Some(Since::Event(total - 10)));
    assert_eq!(late.since.unwrap().bytes, 0, "the last events allocate and free within a request");
    let by_time = explain(&snap, View::default(), Some(Since::Seconds(0.0))).since.unwrap();
    assert_eq!(by_time.from_event, 0);
}

#[test]
fn diff_finds_what_accumulated_per_request_and_names_its_line() {
    let (before, after) = (load(&file("before.pickle")).unwrap(), load(&file("after.pickle")).unwrap());
    let d = diff(&before, &after, View::default(), Some((100, 600)));
    assert_eq!(d.holders.len(), 1, "{:#?}", d.holders);
    assert_eq!(d.holders[0].site, "/srv/app/service.py:57 in record_metrics");
    assert_eq!(d.bytes_per_request, Some(32768.0));
    assert!(d.holders[0].stack[0].contains("service.py:90 in handle"));
}

#[test]
fn bad_files_get_clear_errors() {
    let message = |name: &str| load(&file(name)).unwrap_err().to_string();
    assert!(message("truncated.pickle").contains("truncated"), "{}", message("truncated.pickle"));
    assert!(message("not_a_pickle.pickle").contains("not a pickle"), "{}", message("not_a_pickle.pickle"));
    assert!(message("a_list.pickle").contains("not a memory snapshot: the pickle holds a list"), "{}", message("a_list.pickle"));
    assert!(message("a_tensor.pickle").contains("not a memory snapshot"), "{}", message("a_tensor.pickle"));
    let missing = load(Path::new("/nonexistent/snap.pickle")).unwrap_err().to_string();
    assert!(missing.contains("cannot read /nonexistent/snap.pickle"), "{missing}");
    let empty = tempfile::NamedTempFile::new().unwrap();
    assert!(load(empty.path()).unwrap_err().to_string().contains("truncated"));
}
