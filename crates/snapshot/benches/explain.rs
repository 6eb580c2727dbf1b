//! Reading and explaining large snapshots of every shape a real writer produces. Goals (issue
//! 29), on this 2-core machine: a 1 GB pickle of each shape explained in under 3 s with peak
//! anonymous memory under half the file (the file itself is mapped), and a 5 GB pickle in
//! under 20 s.
//!
//! Each shape is written to a file by a streaming writer (tests/common/writer.rs, shared with
//! the fuzzing; a 5 GB Python structure would not fit in memory to pickle): the opcodes, memo
//! and framing that writer emits, byte for byte in kind.
//! - `memo`: Python's pickle, protocol 4, as recent PyTorch's `_dump_snapshot` writes: frame
//!   dicts, keys, states and actions are shared objects (written once, then memo references);
//!   every block's and event's dict and frames list are new objects; a third segments, the rest
//!   one long trace.
//! - `fresh`: Python's pickle, protocol 2 (BINPUT, BINUNICODE), frames written afresh for every
//!   block and event with their own strings, as older writers do.
//! - `long-trace`: protocol 5, eight segments and a trace that is nearly all the file.
//! - `many-segments`: protocol 4, segments of two to four blocks that are nearly all the file,
//!   and a short trace.
//! - `devices`: serde-pickle's output (leaklab's own probe, other Rust tools): protocol 3, no
//!   memo at all, every string written out, u64s as nine-byte LONG1; four devices, one trace
//!   each.
//!
//! Stacks are 8 to 24 frames deep (torch internals, the user's code, the web framework) drawn
//! from 600 distinct ones. The 5 GB run is of the `memo` shape. Files that CPython's own pickle
//! wrote (benches/python_snapshot.py) are measured the same way when listed in
//! LEAKLAB_SNAPSHOT_BENCH_FILES.
//!
//! Each figure comes from a child process (this binary run again) that does what `leaklab
//! snapshot explain FILE` does: load, explain, render. The parent samples the child's
//! `RssAnon` in /proc every 2 ms for the peak anonymous memory, times it from spawn to exit,
//! and notes the load average (other work shares the two cores); the child also reports its
//! heap's exact peak from a counting allocator, as a cross-check. `cargo xtask bench` runs this
//! at 1 GB a shape plus the 5 GB run and writes target/criterion/snapshot_explain/peak.json;
//! `cargo test --benches` at a few MB, to prove it runs. The files go under
//! target/snapshot-bench/ and are deleted after use.

use criterion::{BenchmarkId, Criterion, Throughput};
use leaklab_snapshot::{explain, load, View};
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

#[path = "../tests/common/counting.rs"]
mod counting;

#[global_allocator]
static ALLOCATOR: counting::Counting = counting::Counting;

#[path = "../tests/common/writer.rs"]
mod writer;

use counting::PEAK;
use writer::{generate, SHAPES};

/// The figures of one explain run, from a child process.
struct Run {
    /// The one-minute load average when it started: other work shares these two cores.
    load: f64,
    file_bytes: u64,
    seconds: f64,
    peak_anon: u64,
    peak_heap: u64,
    summary: String,
}

/// The child: what `leaklab snapshot explain FILE` does, then its own heap peak and time.
fn child(path: &str) {
    let started = std::time::Instant::now();
    let snapshot = load(Path::new(path)).expect("the generated pickle reads");
    let e = explain(&snapshot, View::default(), None);
    let text = leaklab_snapshot::render::explanation_text(&e, 10, false);
    let seconds = started.elapsed().as_secs_f64();
    assert!(
        e.allocated_bytes > 0 && !e.holders.is_empty() && e.trace_events > 0,
        "{text}"
    );
    let summary = format!(
        "{} segments, {} blocks, {} trace events (longest trace), {} holders",
        e.segments,
        snapshot
            .segments
            .iter()
            .map(|s| s.block_count())
            .sum::<usize>(),
        e.trace_events,
        e.holders.len()
    );
    println!("{seconds} {} {summary}", PEAK.load(Ordering::Relaxed));
}

fn rss_anon(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|kb| kb.parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

fn measure(path: &Path) -> Run {
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().and_then(|f| f.parse().ok()))
        .unwrap_or(0.0);
    let started = std::time::Instant::now();
    let mut child = std::process::Command::new(std::env::current_exe().expect("this bench's path"))
        .env(CHILD, path)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run the explain child");
    let mut peak_anon = 0;
    while child.try_wait().expect("wait for the child").is_none() {
        peak_anon = peak_anon.max(rss_anon(child.id()).unwrap_or(0));
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let wall = started.elapsed().as_secs_f64();
    let out = child.wait_with_output().expect("the child's output");
    assert!(
        out.status.success(),
        "the explain child failed on {}",
        path.display()
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut fields = text.trim().splitn(3, ' ');
    let _inner_seconds: f64 = fields.next().and_then(|s| s.parse().ok()).expect("seconds");
    let peak_heap = fields
        .next()
        .and_then(|s| s.parse().ok())
        .expect("heap peak");
    Run {
        load,
        file_bytes: std::fs::metadata(path).expect("the file").len(),
        seconds: wall,
        peak_anon,
        peak_heap,
        summary: fields.next().unwrap_or_default().to_string(),
    }
}

const CHILD: &str = "LEAKLAB_SNAPSHOT_BENCH_CHILD";

/// Writes a snapshot of `shape` of about `target` bytes to `path`; returns its size.
fn write_file(path: &Path, shape: &writer::Shape, target: u64) -> u64 {
    let out = BufWriter::with_capacity(
        1 << 20,
        std::fs::File::create(path).expect("create the bench file"),
    );
    generate(out, shape, target, 1000).1
}

fn main() {
    if let Ok(path) = std::env::var(CHILD) {
        return child(&path);
    }
    let full = std::env::args().any(|a| a == "--bench");
    // For looking into one size: LEAKLAB_SNAPSHOT_BENCH_MB=256 runs the shapes at 256 MB and
    // skips the large run; LEAKLAB_SNAPSHOT_BENCH_KEEP=1 keeps the files and reuses them.
    let chosen = std::env::var("LEAKLAB_SNAPSHOT_BENCH_MB")
        .ok()
        .and_then(|mb| mb.parse::<u64>().ok());
    let keep = std::env::var_os("LEAKLAB_SNAPSHOT_BENCH_KEEP").is_some();
    let (size, large) = match chosen {
        Some(mb) => (mb << 20, None),
        None if full => (1u64 << 30, Some(5u64 << 30)),
        None => (4 << 20, Some(16 << 20)),
    };
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = workspace.join("target/snapshot-bench");
    std::fs::create_dir_all(&dir).expect("target/snapshot-bench");
    let mut criterion = Criterion::default()
        .configure_from_args()
        .sample_size(10)
        .measurement_time(std::time::Duration::from_secs(if full { 20 } else { 1 }));
    let mut rows = Vec::new();
    let mut record = |shape: &str, run: &Run| {
        let line = format!(
            "{{\"shape\": \"{shape}\", \"file_bytes\": {}, \"seconds\": {:.2}, \"peak_anon_bytes\": {}, \"peak_anon_over_file\": {:.3}, \"peak_heap_bytes\": {}, \"load\": {:.2}, \"contents\": \"{}\"}}",
            run.file_bytes,
            run.seconds,
            run.peak_anon,
            run.peak_anon as f64 / run.file_bytes as f64,
            run.peak_heap,
            run.load,
            run.summary
        );
        eprintln!("snapshot explain, {shape}: {line}");
        rows.push(line);
    };
    // LEAKLAB_SNAPSHOT_BENCH_SHAPES=memo,fresh runs only those.
    let only = std::env::var("LEAKLAB_SNAPSHOT_BENCH_SHAPES").ok();
    for shape in SHAPES.iter().filter(|s| {
        only.as_ref()
            .is_none_or(|o| o.split(',').any(|n| n == s.name))
    }) {
        let path: PathBuf = dir.join(format!("{}-{}MB.pickle", shape.name, size >> 20));
        let bytes = match std::fs::metadata(&path) {
            Ok(m) if keep => m.len(),
            _ => write_file(&path, shape, size),
        };
        record(shape.name, &measure(&path));
        let mut group = criterion.benchmark_group("cpu_snapshot_explain");
        group.throughput(Throughput::Bytes(bytes));
        group.bench_with_input(
            BenchmarkId::new(shape.name, format!("{}MB", bytes >> 20)),
            &path,
            |b, path| {
                b.iter(|| {
                    explain(&load(path).expect("reads"), View::default(), None).allocated_bytes
                })
            },
        );
        group.finish();
        if !keep {
            std::fs::remove_file(&path).expect("remove the bench file");
        }
    }
    // Files written elsewhere (benches/python_snapshot.py's, by CPython's own pickle), measured
    // the same way: LEAKLAB_SNAPSHOT_BENCH_FILES=a.pickle,b.pickle.
    // Relative paths are from the workspace (cargo runs benches in the crate's folder).
    for path in std::env::var("LEAKLAB_SNAPSHOT_BENCH_FILES")
        .unwrap_or_default()
        .split(',')
        .filter(|p| !p.is_empty())
    {
        let path = workspace.join(path);
        let name = path
            .file_stem()
            .map_or(String::new(), |s| s.to_string_lossy().into_owned());
        // Read once first, so that it is in the page cache like the shapes just written (and
        // a snapshot just dumped): the figure is the reader's, not the disk's.
        std::io::copy(
            &mut std::fs::File::open(&path).expect("the file"),
            &mut std::io::sink(),
        )
        .expect("read the file");
        record(&format!("file {name}"), &measure(&path));
    }
    if let Some(large) = large {
        let path = dir.join(format!("memo-{}MB.pickle", large >> 20));
        write_file(&path, &SHAPES[0], large);
        record("memo, large", &measure(&path));
        std::fs::remove_file(&path).expect("remove the bench file");
    }
    let out = workspace.join("target/criterion/snapshot_explain");
    let json = format!("{{\"runs\": [\n  {}\n]}}\n", rows.join(",\n  "));
    let name = match chosen {
        Some(mb) => format!("peak-{mb}MB.json"),
        None if full => "peak.json".into(),
        None => "peak-smoke.json".into(),
    };
    std::fs::create_dir_all(&out)
        .and_then(|()| std::fs::write(out.join(name), json))
        .expect("write peak.json");
    criterion.final_summary();
}
