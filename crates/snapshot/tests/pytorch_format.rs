//! `explain` and `diff` on files written by PyTorch's own Python: a snapshot PyTorch builds from
//! a real profile of a leaking loop, the `_snapshot()` format at four pickle protocols with
//! every state and action plus keys from a newer PyTorch, snapshot-shaped dicts that Python's
//! pickle writes at every protocol with shared or fresh frames (checked against what Python
//! says they hold), and bad files of every kind. Every file reads the same in one pass and
//! plainly.

mod common;

use common::canonical;
use leaklab_snapshot::trim::{trim, TrimOptions};
use leaklab_snapshot::{diff, explain, load, load_with, ReadOptions, Since, View};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

fn python() -> String {
    std::env::var("LEAKLAB_PYTHON")
        .expect("run through `cargo xtask test`, which sets LEAKLAB_PYTHON to a python with torch")
}

/// The fixtures, made by tests/make_snapshots.py with the provisioned torch once per version of
/// the script and path of the python (a torch upgraded in place needs target/tmp cleared):
/// nextest runs every test in a process of its own, and making them costs 4-6 s of CPU. Made in
/// a folder of their own, then renamed into place, so a test reads a whole set or makes one; the
/// tests only read them. Made under a file lock: two tests started side by side on a fresh
/// clone each made a set (4.7 s of CPU each in a CI run).
fn fixtures() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/make_snapshots.py");
        let mut key = std::hash::DefaultHasher::new();
        std::fs::read(&script).unwrap().hash(&mut key);
        python().hash(&mut key);
        let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let made = tmp.join(format!("pytorch-snapshots-{:016x}", key.finish()));
        std::fs::create_dir_all(tmp).unwrap();
        let lock = std::fs::File::create(tmp.join("pytorch-snapshots.lock")).unwrap();
        lock.lock().unwrap(); // released when `lock` is dropped
        if made.is_dir() {
            return made;
        }
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let out = std::process::Command::new(python())
            .arg(script)
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "make_snapshots.py failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Another test may have renamed its set first: it is the same, and ours is removed.
        let _ = std::fs::rename(dir.path(), &made);
        made
    })
}

fn file(name: &str) -> PathBuf {
    fixtures().join(name)
}

#[test]
fn a_real_pytorch_snapshot_names_the_line_that_allocated_the_kept_outputs() {
    let oracle: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(file("profiled.oracle.json")).unwrap())
            .unwrap();
    let snap = load(&file("profiled.pickle")).unwrap();
    let e = explain(&snap, View::default(), None);
    assert_eq!(
        e.allocated_bytes,
        oracle["live_bytes"].as_u64().unwrap(),
        "the same total as PyTorch's own data"
    );
    let blocks: u64 = e.holders.iter().map(|h| h.blocks).sum();
    assert_eq!(blocks, oracle["live_blocks"].as_u64().unwrap());
    // The 20 kept outputs (16 × 64 f32 each) were allocated by the forward called in handle().
    let kept = e
        .holders
        .iter()
        .find(|h| h.site.contains("make_snapshots.py:") && h.site.ends_with("in handle"))
        .unwrap_or_else(|| panic!("{:#?}", e.holders));
    assert_eq!(kept.bytes, oracle["kept_output_bytes"].as_u64().unwrap());
    assert_eq!(kept.blocks, 20);
}

#[test]
fn every_protocol_reads_the_same_and_states_and_actions_are_told_apart() {
    let reference = explain(
        &load(&file("handmade_p4.pickle")).unwrap(),
        View::default(),
        Some(Since::Event(0)),
    );
    for proto in [0, 2, 5] {
        let e = explain(
            &load(&file(&format!("handmade_p{proto}.pickle"))).unwrap(),
            View::default(),
            Some(Since::Event(0)),
        );
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            serde_json::to_value(&reference).unwrap(),
            "protocol {proto}"
        );
    }
    let e = reference;
    // 8 × 2 MiB kept by the cache, then 100 requests × 32 kB by record_metrics: largest first.
    assert_eq!(
        e.holders[0].site, "/srv/app/service.py:30 in features",
        "torch's frame is skipped by default"
    );
    assert_eq!(
        (e.holders[0].bytes, e.holders[0].blocks),
        (8 * (2 << 20), 8)
    );
    assert_eq!(
        e.holders[1].site,
        "/srv/app/service.py:57 in record_metrics"
    );
    assert_eq!(
        (e.holders[1].bytes, e.holders[1].blocks),
        (100 * 32768, 100)
    );
    assert_eq!(e.allocated_bytes, 100 * 32768 + 8 * (2 << 20));
    assert_eq!(
        e.pending_free_bytes,
        2 * (512 << 10),
        "one pending block per segment"
    );
    assert_eq!(
        e.reserved_bytes,
        e.allocated_bytes + e.pending_free_bytes + e.unallocated_bytes
    );
    assert!(e.fragmented_segments[0].unallocated > 0);
    // Since the start, what was allocated and never freed is what is live (the transient
    // activations were freed); an unknown action from a newer PyTorch is passed over.
    let since = e.since.unwrap();
    assert_eq!(since.bytes, e.allocated_bytes);
    assert_eq!(
        since.holders[1].site,
        "/srv/app/service.py:57 in record_metrics"
    );
    let all = explain(
        &load(&file("handmade_p4.pickle")).unwrap(),
        View { all_frames: true },
        None,
    );
    assert!(
        all.holders
            .iter()
            .any(|h| h.site.contains("torch/nn/modules/linear.py:200")),
        "--all-frames keeps torch's frames"
    );
}

#[test]
fn since_a_late_point_sees_only_what_crossed_it() {
    let snap = load(&file("handmade_p4.pickle")).unwrap();
    let total = snap.traces[0].len();
    let late = explain(&snap, View::default(), Some(Since::Event(total - 10)));
    assert_eq!(
        late.since.unwrap().bytes,
        0,
        "the last events allocate and free within a request"
    );
    let by_time = explain(&snap, View::default(), Some(Since::Seconds(0.0)))
        .since
        .unwrap();
    assert_eq!(by_time.from_event, 0);
}

#[test]
fn diff_finds_what_accumulated_per_request_and_names_its_line() {
    let (before, after) = (
        load(&file("before.pickle")).unwrap(),
        load(&file("after.pickle")).unwrap(),
    );
    let d = diff(&before, &after, View::default(), Some((100, 600)));
    assert_eq!(d.holders.len(), 1, "{:#?}", d.holders);
    assert_eq!(
        d.holders[0].site,
        "/srv/app/service.py:57 in record_metrics"
    );
    assert_eq!(d.bytes_per_request, Some(32768.0));
    assert!(d.holders[0].stack[0].contains("service.py:90 in handle"));
}

/// Every fixture that reads, read in one pass and plainly: the same snapshot.
#[test]
fn every_file_reads_the_same_in_one_pass_and_plainly() {
    let plain = ReadOptions {
        plain: true,
        ..ReadOptions::default()
    };
    let mut read = 0;
    for entry in std::fs::read_dir(fixtures()).unwrap() {
        let path = entry.unwrap().path();
        if let (Ok(fast), Ok(slow)) = (load(&path), load_with(&path, &plain)) {
            assert_eq!(canonical(&fast), canonical(&slow), "{}", path.display());
            read += 1;
        }
    }
    // Twelve shaped files, four handmade ones, the profile, before and after.
    assert_eq!(read, 19, "fixtures read");
}

#[test]
fn pythons_pickle_at_every_protocol_with_shared_or_fresh_frames_reads_as_python_says() {
    let oracle: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(file("shaped.oracle.json")).unwrap())
            .unwrap();
    let number = |key: &str| oracle[key].as_u64().unwrap();
    let since = Since::Event(number("since") as usize);
    let mut reference: Option<serde_json::Value> = None;
    for sharing in ["shared", "fresh"] {
        for proto in 0..=5 {
            let name = format!("shaped_{sharing}_p{proto}.pickle");
            let snap = load(&file(&name)).unwrap_or_else(|e| panic!("{name}: {e}"));
            let e = explain(&snap, View { all_frames: true }, Some(since));
            assert_eq!(
                (e.reserved_bytes, e.allocated_bytes, e.pending_free_bytes),
                (number("reserved"), number("allocated"), number("pending")),
                "{name}"
            );
            assert_eq!(
                snap.segments
                    .iter()
                    .map(|s| s.block_count() as u64)
                    .sum::<u64>(),
                number("blocks"),
                "{name}"
            );
            let lengths: Vec<u64> = snap.traces.iter().map(|t| t.len() as u64).collect();
            assert_eq!(
                serde_json::to_value(&lengths).unwrap(),
                oracle["trace_lengths"],
                "{name}: one trace per device, device 1's empty"
            );
            assert_eq!(
                e.since.as_ref().unwrap().bytes,
                number("since_bytes"),
                "{name}"
            );
            // Every stack's live bytes and blocks, full frames, as Python counts them.
            let holders: Vec<serde_json::Value> = e
                .holders
                .iter()
                .map(|h| serde_json::json!([h.bytes, h.blocks, h.site, h.stack]))
                .collect();
            assert_eq!(
                serde_json::Value::from(holders),
                oracle["holders"],
                "{name}"
            );
            // The nine-byte address and the largest u64 (an oom's `device_free`) are read whole.
            assert!(
                snap.segments
                    .iter()
                    .any(|s| s.address == (1 << 63) + 0x1000),
                "{name}"
            );
            let as_json = serde_json::to_value(&e).unwrap();
            match &reference {
                None => reference = Some(as_json),
                Some(r) => assert_eq!(
                    &as_json, r,
                    "{name} explains differently from shaped_shared_p0"
                ),
            }
        }
    }
}

#[test]
fn a_trimmed_snapshot_opens_in_pytorchs_memory_viz_and_keeps_the_top_holders_and_the_window() {
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (
        file("shaped_fresh_p5.pickle"),
        dir.path().join("small.pickle"),
    );
    let t = trim(
        &input,
        &output,
        &TrimOptions {
            since: Some(Since::Event(3000)),
            top: 2,
            view: View::default(),
        },
    )
    .unwrap();
    let (original, small) = (load(&input).unwrap(), load(&output).unwrap());
    let (before, after) = (
        explain(&original, View::default(), None),
        explain(&small, View::default(), None),
    );
    // The totals stay; the top two holders are there as they were; everything else is one
    // holder of merged blocks.
    assert_eq!(
        (
            after.reserved_bytes,
            after.allocated_bytes,
            after.pending_free_bytes
        ),
        (
            before.reserved_bytes,
            before.allocated_bytes,
            before.pending_free_bytes
        )
    );
    for h in &before.holders[..2] {
        assert!(
            after.holders.contains(h),
            "{h:?} is not in {:#?}",
            after.holders
        );
    }
    assert_eq!(after.holders.len(), 3, "{:#?}", after.holders);
    let others = after
        .holders
        .iter()
        .find(|h| {
            h.site
                .starts_with("<leaklab trim>:0 in holders outside the top 2")
        })
        .unwrap();
    assert_eq!(
        others.bytes,
        before.allocated_bytes - before.holders[0].bytes - before.holders[1].bytes
    );
    assert_eq!(
        (t.kept_bytes, t.other_bytes),
        (
            before.holders[0].bytes + before.holders[1].bytes,
            others.bytes
        )
    );
    // The window: from event 3000 on, on each device that has that many.
    let windows: Vec<usize> = small.traces.iter().map(|t| t.len()).collect();
    let expected: Vec<usize> = original
        .traces
        .iter()
        .map(|t| t.len().saturating_sub(3000))
        .collect();
    assert_eq!(
        (windows.clone(), t.window_events.clone()),
        (expected.clone(), expected)
    );
    // PyTorch's tools read it, and it holds only what the browser viewer's unpickler knows.
    let out = std::process::Command::new(python())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/check_trimmed.py"))
        .arg(&output)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "check_trimmed.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(seen["protocol"], 4);
    assert_eq!(seen["unknown_to_viewer"], serde_json::json!([]));
    assert_eq!(
        (
            seen["segments"].as_u64(),
            seen["reserved"].as_u64(),
            seen["allocated"].as_u64()
        ),
        (
            Some(t.segments as u64),
            Some(before.reserved_bytes),
            Some(before.allocated_bytes)
        )
    );
    assert_eq!(
        seen["blocks"].as_u64(),
        Some((t.blocks_kept + t.blocks_merged) as u64)
    );
    assert_eq!(
        seen["trace_lengths"],
        serde_json::to_value(&windows).unwrap()
    );
    assert!(
        seen["trace_lines"].as_u64().unwrap() > windows.iter().sum::<usize>() as u64,
        "trace() printed every event: {seen}"
    );
    assert!(
        t.output_bytes * 4 < t.input_bytes,
        "trimmed {} of {} bytes",
        t.output_bytes,
        t.input_bytes
    );
}

#[test]
fn a_bad_input_leaves_the_output_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("small.pickle");
    std::fs::write(&output, b"an earlier trim").unwrap();
    let options = TrimOptions {
        since: None,
        top: 5,
        view: View::default(),
    };
    let e = trim(&file("truncated.pickle"), &output, &options).unwrap_err();
    assert!(e.to_string().contains("truncated"), "{e}");
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        left,
        vec![std::ffi::OsString::from("small.pickle")],
        "no temporary file is left"
    );
    assert_eq!(std::fs::read(&output).unwrap(), b"an earlier trim");
    // Without --since, no trace: a small file of the segments and holders.
    let t = trim(&file("handmade_p4.pickle"), &output, &options).unwrap();
    assert_eq!(t.window_events, vec![0]);
    assert_eq!(load(&output).unwrap().traces[0].len(), 0);
}

#[test]
fn bad_files_get_clear_errors() {
    let message = |name: &str| load(&file(name)).unwrap_err().to_string();
    assert!(
        message("truncated.pickle").contains("truncated"),
        "{}",
        message("truncated.pickle")
    );
    assert!(
        message("not_a_pickle.pickle").contains("not a pickle"),
        "{}",
        message("not_a_pickle.pickle")
    );
    assert!(
        message("a_list.pickle").contains("not a memory snapshot: the pickle holds a list"),
        "{}",
        message("a_list.pickle")
    );
    assert!(
        message("a_tensor.pickle").contains("not a memory snapshot"),
        "{}",
        message("a_tensor.pickle")
    );
    let missing = load(Path::new("/nonexistent/snap.pickle"))
        .unwrap_err()
        .to_string();
    assert!(
        missing.contains("cannot read /nonexistent/snap.pickle"),
        "{missing}"
    );
    let empty = tempfile::NamedTempFile::new().unwrap();
    assert!(load(empty.path())
        .unwrap_err()
        .to_string()
        .contains("truncated"));
}
