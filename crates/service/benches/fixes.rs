//! What each fix costs or gains, in samples per second: forward under grad, no_grad and
//! inference mode; the telemetry path with a tensor history or a primitive; the cache variants;
//! the whole pipeline with and without a memory sample per request. On CPU, at batch 8 and 64.
//!
//! `cargo xtask bench` runs these and writes the ratios into docs/benchmarks.md;
//! `cargo xtask test` runs them once each in test mode, so they cannot rot.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use leaklab_model::{Mlp, Scale};
use leaklab_probe::inference_mode;
use leaklab_service::api::{synthetic_request, validate};
use leaklab_service::causes::cache::FeatureCache;
use leaklab_service::causes::refs::History;
use leaklab_service::{Mode, Pipeline, PipelineConfig, SampleDepth, Variant};
use std::time::Duration;
use tch::{Device, Kind, Tensor};

const BATCHES: [i64; 2] = [8, 64];

fn input(rows: i64) -> Tensor {
    Tensor::randn([rows, 512], (Kind::Float, Device::Cpu))
}

fn cpu_forward(c: &mut Criterion) {
    leaklab_probe::cpu::install().unwrap();
    // One intra-op thread: on a small shared machine, OpenMP threads competing for two cores
    // made the same forward vary by ±30 % between runs; one thread keeps ratios comparable.
    tch::set_num_threads(1);
    let model = Mlp::new(Scale::Default.config(), Device::Cpu);
    let mut group = c.benchmark_group("cpu_forward");
    for rows in BATCHES {
        let x = input(rows);
        group.throughput(Throughput::Elements(rows as u64));
        group.bench_with_input(BenchmarkId::new("grad", rows), &x, |b, x| {
            b.iter(|| model.forward(x))
        });
        group.bench_with_input(BenchmarkId::new("no_grad", rows), &x, |b, x| {
            b.iter(|| tch::no_grad(|| model.forward(x)))
        });
        group.bench_with_input(BenchmarkId::new("inference_mode", rows), &x, |b, x| {
            b.iter(|| inference_mode(|| model.forward(x)))
        });
    }
    group.finish();
}

fn cpu_telemetry(c: &mut Criterion) {
    let mut group = c.benchmark_group("cpu_telemetry");
    for rows in BATCHES {
        let y = inference_mode(|| input(rows).relu());
        group.throughput(Throughput::Elements(rows as u64));
        for (name, mode) in [
            ("tensor_history", Mode::Leaky),
            ("primitive_history", Mode::Fixed),
        ] {
            group.bench_with_input(BenchmarkId::new(name, rows), &y, |b, y| {
                let mut history = History::new(mode, 1024);
                b.iter(|| {
                    history.record(y);
                    // Keeps the leaky history's memory bounded during the bench itself.
                    if history.len() >= 4096 {
                        history = History::new(mode, 1024);
                    }
                })
            });
        }
    }
    group.finish();
}

fn cpu_cache(c: &mut Criterion) {
    let mut group = c.benchmark_group("cpu_cache");
    for rows in BATCHES {
        let x = input(rows);
        group.throughput(Throughput::Elements(rows as u64));
        for (name, mode) in [("unbounded", Mode::Leaky), ("lru_bytes", Mode::Fixed)] {
            group.bench_with_input(BenchmarkId::new(name, rows), &x, |b, x| {
                let mut cache = FeatureCache::new(mode, 32 * 4 * rows as usize * 512);
                let mut key = 0u64;
                b.iter(|| {
                    key += 1;
                    cache.insert(key, x);
                    let hit = cache.get(key / 2).is_some();
                    if cache.len() >= 4096 {
                        cache = FeatureCache::new(mode, 32 * 4 * rows as usize * 512);
                    }
                    hit
                })
            });
        }
    }
    group.finish();
}

fn cpu_pipeline(c: &mut Criterion) {
    let mut group = c.benchmark_group("cpu_pipeline");
    for rows in BATCHES {
        group.throughput(Throughput::Elements(rows as u64));
        let batches: Vec<_> = (0..64)
            .map(|i| validate(synthetic_request(i, rows as usize, 512), 512, 1024).unwrap())
            .collect();
        // With a sample as the service takes it: allocators and stages every request, the
        // process probes every tenth.
        for (name, sample) in [("baseline", false), ("baseline_with_sample", true)] {
            let mut p = Pipeline::new(
                Variant::Baseline,
                PipelineConfig::new(Scale::Default.config(), leaklab_service::Device::Cpu),
            )
            .unwrap();
            let mut i = 0;
            group.bench_function(BenchmarkId::new(name, rows), |b| {
                b.iter(|| {
                    i += 1;
                    let out = p.infer(&batches[i % batches.len()]).unwrap();
                    if sample {
                        std::hint::black_box(p.sample(
                            0,
                            if i % 10 == 0 {
                                SampleDepth::Full
                            } else {
                                SampleDepth::Allocators
                            },
                        ));
                    }
                    out
                })
            });
        }
    }
    group.finish();
}

/// The forward on CUDA, timed with `iter_custom` and a device synchronisation before the clock
/// is read (GPU work is asynchronous). Without a GPU it says so and measures nothing.
fn cuda_forward(c: &mut Criterion) {
    if !leaklab_probe::cuda::is_available() {
        eprintln!("cuda_forward: CUDA not available, group skipped");
        return;
    }
    let model = Mlp::new(Scale::Default.config(), Device::Cuda(0));
    let mut group = c.benchmark_group("cuda_forward");
    for rows in [8i64, 64, 512] {
        let x = Tensor::randn([rows, 512], (Kind::Float, Device::Cuda(0)));
        group.throughput(Throughput::Elements(rows as u64));
        for (name, inference) in [("grad", false), ("inference_mode", true)] {
            group.bench_with_input(BenchmarkId::new(name, rows), &x, |b, x| {
                b.iter_custom(|iters| {
                    leaklab_probe::cuda::synchronize(0).unwrap();
                    let start = std::time::Instant::now();
                    for _ in 0..iters {
                        let y = if inference {
                            inference_mode(|| model.forward(x))
                        } else {
                            model.forward(x)
                        };
                        drop(std::hint::black_box(y));
                    }
                    leaklab_probe::cuda::synchronize(0).unwrap();
                    start.elapsed()
                })
            });
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(4)).sample_size(30);
    targets = cpu_forward, cpu_telemetry, cpu_cache, cpu_pipeline, cuda_forward
}
criterion_main!(benches);
