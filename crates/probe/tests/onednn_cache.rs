//! What the exact allocator probe sees of oneDNN's primitive cache (issue 37), measured in Rust
//! through tch's conv, the way the lab's service would run one.
//!
//! A conv on CPU runs through oneDNN, which compiles a primitive for every new input shape and
//! keeps it in its own LRU cache (ideep keeps another beside it). That memory is oneDNN's: its
//! descriptors come from malloc and its kernels from JIT code pages, never from c10's CPU
//! allocator, which is what leaklab's counting probe replaces. So the prediction: the process's
//! anonymous memory grows with every new shape while the probe's live bytes do not move, and
//! repeats of seen shapes add nothing to either.
//!
//! What was found: the probe sees the conv's traffic (its activations, and ideep's buffers:
//! PyTorch's aten/src/ATen/native/mkldnn/IDeepRegistration.cpp gives ideep's engine c10's CPU
//! `raw_allocate`/`raw_deallocate`) but keeps no byte of the cache; until the probe's blocks
//! had a raw deleter, the first `raw_deallocate` aborted the process (c10's
//! `INTERNAL ASSERT FAILED ... raw_deallocate`), so no service with a conv could run under the
//! probe at all. And repeats are free only while the shapes fit the cache: cycling more shapes
//! than it holds misses every time, and the heap grew on for two more passes before it settled.
//!
//! One test in its own binary: anonymous memory is the whole process's.

use leaklab_probe::cpu;
use tch::{Device, Kind, Tensor};

/// A small conv net, as the zoo's Python entry serves: 3→32→64→64→32 channels, 3×3, padding 1.
struct Net {
    weights: Vec<(Tensor, Tensor)>,
}

impl Net {
    fn new() -> Net {
        tch::manual_seed(7);
        let channels = [3, 32, 64, 64, 32];
        let weights = channels
            .windows(2)
            .map(|c| {
                (
                    Tensor::randn([c[1], c[0], 3, 3], (Kind::Float, Device::Cpu)) * 0.1,
                    Tensor::zeros([c[1]], (Kind::Float, Device::Cpu)),
                )
            })
            .collect();
        Net { weights }
    }

    /// One request: a 1×3×H×W image, every index below 3,136 a shape of its own.
    fn forward(&self, i: i64) -> f64 {
        let (h, w) = (16 + i / 56, 16 + i % 56);
        let _guard = tch::no_grad_guard();
        let mut x = Tensor::ones([1, 3, h, w], (Kind::Float, Device::Cpu));
        for (weight, bias) in &self.weights {
            x = x
                .conv2d(weight, Some(bias), [1, 1], [1, 1], [1, 1], 1)
                .relu();
        }
        x.mean(Kind::Float).double_value(&[])
    }
}

fn anonymous() -> i64 {
    leaklab_proc::smaps_rollup(std::process::id())
        .expect("smaps_rollup of this process")
        .anonymous as i64
}

/// What one pass over `shapes` did: the process's anonymous memory, and the probe's live bytes
/// and allocations.
struct Pass {
    anonymous: i64,
    live: i64,
    allocs: u64,
    bytes: u64,
}

fn pass(net: &Net, shapes: std::ops::Range<i64>) -> Pass {
    let (anon, before) = (anonymous(), cpu::stats());
    for i in shapes {
        net.forward(i);
    }
    let after = cpu::stats();
    Pass {
        anonymous: anonymous() - anon,
        live: after.live_bytes - before.live_bytes,
        allocs: after.alloc_count - before.alloc_count,
        bytes: after.alloc_bytes_total - before.alloc_bytes_total,
    }
}

#[test]
fn new_shapes_grow_anonymous_memory_that_the_exact_probe_never_sees() {
    // Before the probe's blocks were given `raw_deleter`, this first conv aborted the process:
    // ideep frees through `raw_deallocate`, which asserts the allocator has a raw deleter.
    cpu::install().expect("counting allocator installs");
    tch::set_num_threads(1);
    let net = Net::new();
    // The first shapes build oneDNN's engine and the heap's first arenas: not the cache.
    pass(&net, 0..20);
    let shapes = 20..320;
    let new = pass(&net, shapes.clone());
    let repeats: Vec<Pass> = (0..3).map(|_| pass(&net, shapes.clone())).collect();
    let more = pass(&net, 320..620);
    for (what, p) in [("300 new shapes", &new)]
        .into_iter()
        .chain(repeats.iter().map(|p| ("the same 300 again", p)))
        .chain([("300 more new shapes", &more)])
    {
        println!(
            "{what}: anonymous {:+} B, probe live {:+} B, {} allocations of {} B through c10",
            p.anonymous, p.live, p.allocs, p.bytes
        );
    }
    // The probe is exact: every pass leaves no tensor storage behind, though it saw each pass's
    // traffic (activations, and ideep's buffers through `raw_allocate`), the same every pass.
    for p in repeats.iter().chain([&new, &more]) {
        assert_eq!(p.live, 0, "no c10 storage is kept");
        assert!(
            p.allocs > 0 && p.bytes > 0,
            "the probe sees the conv's allocations"
        );
    }
    assert!(
        repeats
            .iter()
            .all(|p| (p.allocs, p.bytes) == (new.allocs, new.bytes)),
        "the same requests, the same allocations"
    );
    // Meanwhile the process grows outside it. Measured (five runs, torch 2.11 CPU, one thread):
    // the first 300 shapes +52.1, +84.3 and three times +75.3 MB. oneDNN's cache holds 1,024
    // primitives, four convs × 256 shapes, so 300 shapes in a cycle miss it every time: the
    // first repeat still added +26.3 and +32.5 MB, the second +1.5 MB, the third 0 and -5.4 MB
    // (the heap settles), and 300 more new shapes -0.3 and -5.6 MB: it is bounded.
    assert!(
        new.anonymous > 40_000_000,
        "300 new shapes grew anonymous memory {} B",
        new.anonymous
    );
    let settled = repeats.last().expect("three repeats").anonymous;
    assert!(
        settled < 4_000_000,
        "the third repeat still grew {settled} B"
    );
    assert!(
        more.anonymous < 4_000_000,
        "past its capacity the cache grew {} B",
        more.anonymous
    );
}
