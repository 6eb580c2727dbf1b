//! Reading and explaining a large snapshot: the goal is a 1 GB pickle explained in under 10 s
//! on a 2-core machine, with peak memory under twice the file's size.
//!
//! The pickle is generated here in the layout Python's pickle (protocol 4) gives
//! `torch.cuda.memory._snapshot()`: 64-block segments whose blocks each carry an 8-frame stack
//! drawn from 400 distinct ones, and a trace of alloc / free_requested / free_completed
//! entries with stacks, every string written out (no sharing through the memo: the most bytes
//! per block a real file can have). `cargo xtask bench` runs it at 1 GB; `cargo test --benches`
//! at 8 MB, to prove it runs.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use leaklab_snapshot::{explain, from_bytes, View};

struct Pickle(Vec<u8>);

impl Pickle {
    fn str(&mut self, s: &str) {
        self.0.push(0x8c);
        self.0.push(s.len() as u8);
        self.0.extend_from_slice(s.as_bytes());
        self.0.push(0x94);
    }
    fn int(&mut self, v: u64) {
        if v < 1 << 31 {
            self.0.push(b'J');
            self.0.extend_from_slice(&(v as i32).to_le_bytes());
        } else {
            self.0.extend_from_slice(&[0x8a, 8]);
            self.0.extend_from_slice(&v.to_le_bytes());
        }
    }
    fn open_dict(&mut self) {
        self.0.extend_from_slice(b"}\x94(");
    }
    fn open_list(&mut self) {
        self.0.extend_from_slice(b"]\x94(");
    }
    fn frames(&mut self, stack: usize) {
        self.open_list();
        for f in 0..8 {
            self.open_dict();
            self.str("filename");
            self.str(&format!("/srv/app/module_{}/file_{}.py", (stack * 7 + f) % 40, (stack + f) % 25));
            self.str("line");
            self.int(((stack * 31 + f * 17) % 900) as u64);
            self.str("name");
            self.str(&format!("function_{}", (stack * 13 + f) % 300));
            self.0.push(b'u');
        }
        self.0.push(b'e');
    }
}

/// A snapshot pickle of about `target` bytes.
fn generate(target: usize) -> Vec<u8> {
    let mut p = Pickle(Vec::with_capacity(target + (1 << 20)));
    p.0.extend_from_slice(&[0x80, 4]);
    p.open_dict();
    p.str("segments");
    p.open_list();
    let (mut address, mut n) = (0x7f00_0000_0000u64, 0usize);
    while p.0.len() < target * 2 / 3 {
        p.open_dict();
        for (k, v) in [("address", address), ("total_size", 64 << 20), ("stream", 0)] {
            p.str(k);
            p.int(v);
        }
        p.str("segment_type");
        p.str("large");
        p.str("blocks");
        p.open_list();
        for b in 0..64u64 {
            p.open_dict();
            p.str("address");
            p.int(address + b * (1 << 20));
            p.str("size");
            p.int(1 << 20);
            p.str("requested_size");
            p.int((1 << 20) - 64);
            p.str("state");
            p.str(if b % 5 == 4 { "inactive" } else { "active_allocated" });
            p.str("frames");
            p.frames(n % 400);
            p.0.push(b'u');
            n += 1;
        }
        p.0.extend_from_slice(b"eu");
        address += 64 << 20;
    }
    p.0.push(b'e');
    p.str("device_traces");
    p.open_list();
    p.open_list();
    let mut t = 0u64;
    while p.0.len() < target {
        for action in ["alloc", "free_requested", "free_completed"] {
            p.open_dict();
            p.str("action");
            p.str(action);
            for (k, v) in [("addr", 0x7e00_0000_0000 + (t % 4096) * 4096), ("size", 4096), ("stream", 0), ("time_us", 1_700_000_000_000_000 + t)] {
                p.str(k);
                p.int(v);
            }
            p.str("frames");
            p.frames((t as usize) % 400);
            p.0.push(b'u');
            t += 1;
        }
    }
    p.0.extend_from_slice(b"eeu.");
    p.0
}

fn peak_rss_bytes() -> u64 {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    text.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|r| r.split_whitespace().next()).and_then(|kb| kb.parse::<u64>().ok()).unwrap_or(0) * 1024
}

fn current_rss_bytes() -> u64 {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    text.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|r| r.split_whitespace().next()).and_then(|kb| kb.parse::<u64>().ok()).unwrap_or(0) * 1024
}

fn snapshot_explain(c: &mut Criterion) {
    let full = std::env::args().any(|a| a == "--bench");
    let size = if full { 1 << 30 } else { 8 << 20 };
    let data = generate(size);
    // Peak memory of one read + explain beyond the file's own bytes (which a real run maps
    // from disk): reset the high-water mark, then read VmHWM after.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let before = current_rss_bytes();
    let started = std::time::Instant::now();
    let e = explain(&from_bytes(&data).expect("the generated pickle reads"), View::default(), None);
    let seconds = started.elapsed().as_secs_f64();
    let extra = peak_rss_bytes().saturating_sub(before);
    assert!(e.allocated_bytes > 0 && !e.holders.is_empty());
    let line = format!(
        "{{\"file_bytes\": {}, \"seconds\": {seconds:.2}, \"peak_extra_bytes\": {extra}, \"peak_extra_over_file\": {:.2}, \"holders\": {}}}",
        data.len(),
        extra as f64 / data.len() as f64,
        e.holders.len()
    );
    eprintln!("snapshot_explain single run: {line}");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/criterion/snapshot_explain");
    let _ = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(dir.join(if full { "peak.json" } else { "peak-smoke.json" }), line));

    let mut group = c.benchmark_group("cpu_snapshot_explain");
    group.sample_size(10);
    group.throughput(Throughput::Bytes(data.len() as u64));
    group.bench_with_input(BenchmarkId::new("read_and_explain", format!("{}MB", data.len() >> 20)), &data, |b, data| {
        b.iter(|| explain(&from_bytes(data).expect("reads"), View::default(), None).allocated_bytes)
    });
    group.finish();
}

criterion_group!(benches, snapshot_explain);
criterion_main!(benches);
