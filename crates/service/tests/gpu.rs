//! The leak expectations on CUDA, in CUDA allocator bytes (feature `gpu-tests`).
//!
//! Built on every machine with `--features gpu-tests`; meant to run where a GPU is (the device
//! bundle carries the binary as `bin/gpu-tests`). Run with `--test-threads=1`: the allocator's
//! figures are per device, and tests in parallel would see each other.
#![cfg(feature = "gpu-tests")]

use leaklab_model::Scale;
use leaklab_probe::{cuda, nvml::NvmlProbe};
use leaklab_service::api::{synthetic_request, validate};
use leaklab_service::{Batch, Device, Pipeline, PipelineConfig, Variant};

const ROWS: usize = 8;

fn batch(index: u64, rows: usize) -> Batch {
    validate(synthetic_request(index, rows, 512), 512, 1024).unwrap()
}

fn pipeline(variant: Variant) -> Pipeline {
    assert!(cuda::is_available(), "gpu-tests need a CUDA device");
    let mut config = PipelineConfig::new(Scale::Default.config(), Device::Cuda);
    config.cache_capacity_bytes = 5 * 4 * ROWS * 512;
    Pipeline::new(variant, config).expect("CUDA pipeline")
}

fn allocated() -> i64 {
    cuda::synchronize(0).unwrap();
    cuda::stats(0).unwrap().allocated_bytes
}

#[test]
fn cuda_allocated_grows_by_exactly_what_each_cause_keeps() {
    let m = Scale::Default.config();
    let b = ROWS as i64;
    let expected = [
        (Variant::GraphLeaky, m.graph_bytes_per_request(b)),
        (Variant::GraphFixed, 0),
        (Variant::RefsLeaky, m.output_bytes(b)),
        (Variant::RefsFixed, 0),
        (Variant::CacheLeaky, m.input_bytes(b)),
        (Variant::CacheFixed, 0),
        (Variant::Baseline, 0),
        (
            Variant::Seed,
            m.graph_bytes_per_request(b) + m.output_bytes(b),
        ),
    ];
    for (variant, bytes) in expected {
        let mut p = pipeline(variant);
        for i in 0..8 {
            p.infer(&batch(i, ROWS)).unwrap();
        }
        let mut steps = Vec::new();
        let mut last = allocated();
        for i in 8..20 {
            p.infer(&batch(i, ROWS)).unwrap();
            let now = allocated();
            steps.push(now - last);
            last = now;
        }
        assert!(
            steps.iter().all(|s| *s == bytes),
            "{variant}: CUDA allocated grew by {steps:?}, expected {bytes} each"
        );
        println!("{variant}: {bytes} B/request on CUDA");
        drop(p);
        cuda::empty_cache().unwrap();
    }
}

#[test]
fn varied_shapes_grow_reserved_memory_and_the_fixed_cache_path_hands_it_back() {
    let slack = |variant: Variant| {
        let mut config = PipelineConfig::new(Scale::Default.config(), Device::Cuda);
        config.cuda_slack_watermark_bytes = 8 << 20;
        let mut p = Pipeline::new(variant, config).unwrap();
        cuda::empty_cache().unwrap();
        let mut worst = 0i64;
        for i in 0..200u64 {
            // Batch sizes vary from 1 to 256 rows: a new block size nearly every request.
            let rows = 1 + (i as usize * 37) % 256;
            p.infer(&batch(i, rows)).unwrap();
            let s = cuda::stats(0).unwrap();
            worst = worst.max(s.reserved_bytes - s.allocated_bytes);
        }
        drop(p);
        cuda::empty_cache().unwrap();
        worst
    };
    let leaky = slack(Variant::CacheLeaky);
    let fixed = slack(Variant::CacheFixed);
    println!("largest reserved − allocated: cache-leaky {leaky} B, cache-fixed {fixed} B");
    // Bucketing plus empty_cache at an 8 MiB watermark keeps the slack near the watermark (one
    // request's temporaries can sit above it until the next check). The leaky figure is
    // printed for the record: how much idle reserve builds up depends on the card's allocator
    // history, so it is reported, not asserted.
    assert!(fixed <= 64 << 20, "fixed slack {fixed} B");
}

#[test]
fn nvml_sees_the_reserved_memory_plus_the_cuda_context() {
    let p = pipeline(Variant::Baseline);
    let reserved = cuda::stats(0).unwrap().reserved_bytes as u64;
    let nvml = NvmlProbe::new().expect("NVML on a CUDA host");
    let reading = nvml.read(0).unwrap();
    println!(
        "reserved {reserved} B, NVML process {:?} B, device {} / {} B",
        reading.process_used_bytes, reading.device_used_bytes, reading.device_total_bytes
    );
    assert!(reading.device_used_bytes >= reserved);
    if let Some(used) = reading.process_used_bytes {
        // The margin is the CUDA context and cuBLAS/cuDNN workspaces: under 2 GiB on any current card.
        assert!(
            used >= reserved && used <= reserved + (2 << 30),
            "NVML {used} vs reserved {reserved}"
        );
    }
    drop(p);
}

#[test]
fn the_cuda_snapshot_is_a_memory_viz_pickle() {
    cuda::record_history(true, 10_000).unwrap();
    let mut p = pipeline(Variant::RefsLeaky);
    p.infer(&batch(1, ROWS)).unwrap();
    let pickle = cuda::snapshot_pickle().unwrap();
    cuda::record_history(false, 0).unwrap();
    assert_eq!(pickle[0], 0x80);
    let text = String::from_utf8_lossy(&pickle);
    assert!(text.contains("segments") && text.contains("device_traces"));
}
