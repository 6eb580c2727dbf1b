//! The CPU history as a memory_viz pickle: bounded, readable by Python, and shaped like
//! `torch.cuda.memory._snapshot()` (checked with PyTorch's own `_memory_viz` tools).

use leaklab_probe::{cpu, snapshot, MemoryContext};
use std::sync::Mutex;
use tch::{Device, Kind, Tensor};

/// The history is process-wide; tests that switch it on and off take turns.
static HISTORY: Mutex<()> = Mutex::new(());

#[test]
fn history_is_bounded_by_max_entries() {
    let _turn = HISTORY.lock().unwrap();
    cpu::install().unwrap();
    cpu::record_history(10);
    let kept: Vec<Tensor> = (0..50)
        .map(|_| Tensor::zeros([4], (Kind::Float, Device::Cpu)))
        .collect();
    assert_eq!(cpu::history().len(), 10);
    drop(kept);
    cpu::record_history(0);
    assert!(cpu::history().is_empty());
}

/// The structure of a snapshot, without addresses or times: what the viewer relies on.
fn structure(snap: &snapshot::Snapshot, ctx: MemoryContext) -> serde_json::Value {
    let value = serde_json::to_value(snap).unwrap();
    let keys = |v: &serde_json::Value| {
        v.as_object()
            .map(|o| o.keys().cloned().collect::<Vec<_>>())
            .unwrap_or_default()
    };
    // The memory context is each stack's outermost (last) frame.
    let context_of = |frames: &serde_json::Value| {
        frames
            .as_array()
            .and_then(|f| f.last())
            .map(|f| f["name"].clone())
    };
    let mine: Vec<_> = value["segments"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| context_of(&s["blocks"][0]["frames"]) == Some(ctx.name().into()))
        .collect();
    let events: Vec<_> = value["device_traces"][0]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| context_of(&e["frames"]) == Some(ctx.name().into()))
        .map(|e| serde_json::json!({"action": e["action"], "size": e["size"]}))
        .collect();
    serde_json::json!({
        "top_level": keys(&value),
        "device_traces": value["device_traces"].as_array().unwrap().len(),
        "segment_keys": keys(mine[0]),
        "block_keys": keys(&mine[0]["blocks"][0]),
        "block_state": mine[0]["blocks"][0]["state"],
        "context_frame": mine[0]["blocks"][0]["frames"].as_array().unwrap().last(),
        "trace_keys": keys(&value["device_traces"][0][0]),
        "live_blocks_in_context": mine.len(),
        "events_in_context": events,
    })
}

#[test]
fn snapshot_opens_with_pytorchs_own_memory_viz_tools() {
    let _turn = HISTORY.lock().unwrap();
    cpu::install().unwrap();
    cpu::record_history(100_000);
    let ctx = MemoryContext::named("snapshot-test");
    // The kept tensor's line, read beside it (a formatter may move it, never apart from this).
    let (kept, kept_line, freed) = {
        let _in_ctx = ctx.enter();
        let kept = Tensor::zeros([16, 16], (Kind::Float, Device::Cpu));
        let kept_line = line!() - 1;
        (
            kept,
            kept_line,
            Tensor::zeros([8], (Kind::Float, Device::Cpu)),
        )
    };
    drop(freed);
    let snap = snapshot::cpu_snapshot();
    cpu::record_history(0);
    insta::assert_json_snapshot!(structure(&snap, ctx));
    // The native stack of the kept block names this file and the line that allocated it,
    // under torch's and tch's own frames.
    let block = snap
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .find(|b| b.size == 1024 && b.frames.last().is_some_and(|f| f.name == ctx.name()))
        .expect("the kept block");
    let here = block
        .frames
        .iter()
        .find(|f| f.filename.ends_with("tests/memory_viz.rs"))
        .unwrap_or_else(|| panic!("no frame in this file: {:#?}", block.frames));
    assert_eq!(here.line, kept_line as i64, "{:#?}", block.frames);
    assert!(
        block
            .frames
            .iter()
            .position(|f| f.filename.contains("libtorch") || f.filename.contains("libc10"))
            .is_some_and(|torch| torch < block.frames.iter().position(|f| f == here).unwrap()),
        "torch frames come first (innermost): {:#?}",
        block.frames
    );

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cpu.pickle");
    std::fs::write(&path, snap.to_pickle()).unwrap();
    drop(kept);

    // `cargo xtask test` sets LEAKLAB_PYTHON to the provisioned venv, whose torch carries the
    // viewer's Python half. Its `segsum` checks the segment accounting and `trace` replays
    // every event; both raise on a malformed snapshot.
    let python = std::env::var("LEAKLAB_PYTHON")
        .expect("run through `cargo xtask test`, which sets LEAKLAB_PYTHON");
    let script = r#"
import pickle, sys
from torch.cuda import _memory_viz as mv
data = pickle.load(open(sys.argv[1], 'rb'))
assert set(data) >= {'segments', 'device_traces'}, sorted(data)
summary = mv.segsum(data)
assert 'total_allocated' in summary, summary
trace = mv.trace(data)
print(len(data['segments']), len(data['device_traces'][0]), trace.count('\n'))
"#;
    let out = std::process::Command::new(python)
        .args(["-c", script])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python rejected the pickle: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let fields: Vec<usize> = stdout
        .split_whitespace()
        .map(|f| f.parse().unwrap())
        .collect();
    assert_eq!(fields[0], snap.segments.len());
    assert_eq!(fields[1], snap.device_traces[0].len());
    assert!(
        fields[2] >= snap.device_traces[0].len(),
        "trace printed a line per event"
    );
}
