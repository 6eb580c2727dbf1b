//! CUDA, NVML and process probes: real figures where the hardware is, clear errors where not.

use leaklab_probe::{cuda, nvml::NvmlProbe, process, Error, Nvml, Probes};

#[test]
fn cuda_calls_report_not_available_without_a_gpu() {
    assert!(
        cuda::compiled(),
        "the PyPI libtorch ships CUDA headers, so the CUDA half is built"
    );
    if cuda::device_count() == 0 {
        let errors = [
            cuda::stats(0).map(|_| ()),
            cuda::empty_cache(),
            cuda::reset_peak(0),
            cuda::record_history(true, 100),
            cuda::snapshot_pickle().map(|_| ()),
            cuda::synchronize(0),
            Probes::cuda(0).map(|_| ()),
        ];
        for e in errors {
            let err = e.expect_err("no GPU: every CUDA call must fail cleanly");
            assert!(matches!(err, Error::CudaUnavailable(_)), "{err}");
            assert!(err.to_string().starts_with("CUDA not available"), "{err}");
        }
    } else {
        let stats = cuda::stats(0).expect("stats on a CUDA host");
        assert!(stats.reserved_bytes >= stats.allocated_bytes);
    }
}

#[test]
fn nvml_is_a_value_or_a_clear_error() {
    match NvmlProbe::new() {
        Ok(probe) => {
            let r = probe.read(0).expect("device 0 readable");
            assert!(r.device_total_bytes > 0 && r.device_used_bytes <= r.device_total_bytes);
        }
        Err(e) => {
            assert!(matches!(e, Error::NvmlUnavailable(_)));
            assert!(e.to_string().starts_with("NVML unavailable"), "{e}");
        }
    }
}

#[test]
fn rss_and_heap_see_a_large_rust_allocation() {
    let rss_before = process::rss_bytes().unwrap();
    let heap_before = process::heap_bytes();
    let block = vec![1u8; 64 << 20];
    std::hint::black_box(&block);
    // The heap figure is exact for one live 64 MiB block (mmapped by malloc); RSS is paged in.
    assert!(process::heap_bytes() >= heap_before + (64 << 20));
    assert!(process::rss_bytes().unwrap() >= rss_before + (60 << 20));
}

#[test]
fn a_cpu_sample_reads_every_cpu_probe() {
    leaklab_probe::cpu::install().unwrap();
    let s = Probes::cpu().sample(Nvml::Read);
    assert!(s.rss_bytes > 0 && s.heap_bytes > 0);
    assert!(s.cuda.is_none() && s.nvml.is_none());
    let json = serde_json::to_value(&s).unwrap();
    assert!(json["cpu"]["live_bytes"].is_i64());
}
