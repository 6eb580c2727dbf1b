//! What a memory sample costs next to a request's forward pass (goal: under 2 %), and what the
//! history's native stacks cost per allocation (goal: at most 2 µs for 32 frames).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use leaklab_probe::{cpu, Nvml, Probes};
use tch::{nn, nn::Module, Device, Kind, Tensor};

fn probe_overhead(c: &mut Criterion) {
    cpu::install().expect("counting allocator");
    tch::set_num_threads(1); // as in the service's benches: stable ratios on a shared machine
    let probes = Probes::cpu();
    let vs = nn::VarStore::new(Device::Cpu);
    let model = nn::seq()
        .add(nn::linear(vs.root(), 512, 2048, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(vs.root(), 2048, 512, Default::default()));
    let x = Tensor::randn([8, 512], (Kind::Float, Device::Cpu));

    let mut group = c.benchmark_group("cpu_probe_overhead");
    group.throughput(Throughput::Elements(1));
    group.bench_function("sample_without_nvml", |b| {
        b.iter(|| probes.sample(Nvml::Skip))
    });
    group.bench_function("cpu_stats_only", |b| b.iter(cpu::stats));
    let full = probes.sample(Nvml::Skip);
    group.bench_function("sample_allocators", |b| {
        b.iter(|| probes.sample_allocators(&full))
    });
    group.bench_function("rss_only", |b| b.iter(leaklab_probe::process::rss_bytes));
    group.bench_function("malloc_heap_only", |b| {
        b.iter(leaklab_probe::process::heap_bytes)
    });
    group.bench_function("forward_batch8", |b| {
        b.iter(|| leaklab_probe::inference_mode(|| model.forward(&x)))
    });
    group.bench_function("forward_batch8_plus_sample", |b| {
        b.iter(|| {
            let y = leaklab_probe::inference_mode(|| model.forward(&x));
            (y, probes.sample(Nvml::Skip))
        })
    });
    group.finish();
}

/// Calls `f` under `depth` extra Rust frames, so the allocator has at least that many to unwind.
#[inline(never)]
fn nested<T>(depth: usize, f: &mut dyn FnMut() -> T) -> T {
    if depth == 0 {
        f()
    } else {
        let out = nested(depth - 1, f);
        std::hint::black_box(depth);
        out
    }
}

/// One tensor allocated and freed per iteration, with the history off, on without stacks, and
/// on with 32 and 64 native frames per allocation: the differences are the capture's cost.
fn history_stacks(c: &mut Criterion) {
    cpu::install().expect("counting allocator");
    let mut group = c.benchmark_group("cpu_history_stacks");
    group.throughput(Throughput::Elements(1));
    for (case, entries, depth) in [
        ("history_off", 0, 0),
        ("history_no_stacks", 100_000, 0),
        ("stacks", 100_000, 32),
        ("stacks", 100_000, 64),
    ] {
        cpu::record_history_with_stacks(entries, depth);
        group.bench_function(criterion::BenchmarkId::new(case, depth), |b| {
            b.iter(|| nested(64, &mut || Tensor::empty([16], (Kind::Float, Device::Cpu))))
        });
    }
    cpu::record_history(0);
    group.finish();
}

criterion_group!(benches, probe_overhead, history_stacks);
criterion_main!(benches);
