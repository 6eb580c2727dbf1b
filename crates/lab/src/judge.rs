//! From a variant's samples to its verdicts: the primary probe decides pass or fail, the others
//! (RSS, malloc heap, CUDA reserved) are reported beside it.

use crate::driver::{RunOptions, VariantRun};
use crate::expect::expected;
use leaklab_detect::{attribute, judge, DetectorConfig, Judgement, Projection, Sample, Scenario, Verdict};
use leaklab_service::{RequestSample, Stage};
use serde::{Deserialize, Serialize};

/// Noise amplitudes of the process probes: page-granular and arena-shaped, a few MB either way.
pub const RSS_NOISE_BYTES: f64 = 8e6;
pub const HEAP_NOISE_BYTES: f64 = 4e6;
/// The CUDA caching allocator reserves in segments of 2 MB and 20 MB and rounds large blocks.
pub const CUDA_RESERVED_NOISE_BYTES: f64 = 64e6;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProbeVerdict {
    pub probe: String,
    pub judgement: Judgement,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StageGrowth {
    pub stage: String,
    pub verdict: Verdict,
    pub bytes_per_request: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VariantResult {
    pub variant: String,
    pub cause: String,
    pub expected: Vec<Verdict>,
    /// The probe that decides: the exact CPU allocator, or CUDA allocated bytes on CUDA.
    pub primary: Option<ProbeVerdict>,
    pub others: Vec<ProbeVerdict>,
    /// Stages whose memory does not come back, steepest first.
    pub stages: Vec<StageGrowth>,
    /// At the primary slope, in the reference scenario (80 GB, 12 GB at start, a request every 32 s).
    pub projection: Option<Projection>,
    pub passed: bool,
    pub requests: usize,
    pub errors: u64,
    pub seconds: f64,
    pub failure: Option<String>,
}

fn series(samples: &[RequestSample], value: impl Fn(&RequestSample) -> Option<i64>) -> Option<Vec<Sample>> {
    samples.iter().map(|s| value(s).map(|v| (s.request, v))).collect()
}

/// The series a plot draws for the primary probe.
pub fn primary_series(samples: &[RequestSample]) -> (&'static str, Vec<Sample>) {
    match series(samples, |s| s.memory.cuda.map(|c| c.allocated_bytes)) {
        Some(cuda) if !samples.is_empty() => ("cuda_allocated", cuda),
        _ => ("cpu_allocator_live", series(samples, |s| Some(s.memory.cpu.live_bytes)).unwrap_or_default()),
    }
}

pub fn judge_run(run: &VariantRun, options: &RunOptions) -> VariantResult {
    let variant = run.variant;
    let expected = expected(variant).to_vec();
    let mut result = VariantResult {
        variant: variant.name().into(),
        cause: variant.cause().map_or("all three".into(), |c| c.name().into()),
        expected: expected.clone(),
        primary: None,
        others: Vec::new(),
        stages: Vec::new(),
        projection: None,
        passed: false,
        requests: run.samples.len(),
        errors: run.errors,
        seconds: run.seconds,
        failure: run.failure.clone(),
    };
    if run.failure.is_some() {
        return result;
    }
    let samples = &run.samples;
    let exact = DetectorConfig::exact(options.warmup);
    let (primary_name, primary) = primary_series(samples);
    match judge(&primary, &exact) {
        Ok(j) => {
            result.projection = Scenario::REFERENCE.project(j.slope.bytes_per_request).filter(|_| j.verdict == Verdict::Leak);
            result.passed = expected.contains(&j.verdict) && run.errors == 0;
            result.primary = Some(ProbeVerdict { probe: primary_name.into(), judgement: j });
        }
        Err(e) => result.failure = Some(format!("no verdict: {e}")),
    }
    let mut others: Vec<(&str, Option<Vec<Sample>>, DetectorConfig)> = vec![
        ("rss", series(samples, |s| Some(s.memory.rss_bytes as i64)), DetectorConfig::noisy(options.warmup, RSS_NOISE_BYTES)),
        ("malloc_heap", series(samples, |s| Some(s.memory.heap_bytes as i64)), DetectorConfig::noisy(options.warmup, HEAP_NOISE_BYTES)),
    ];
    if primary_name == "cuda_allocated" {
        others.push(("cpu_allocator_live", series(samples, |s| Some(s.memory.cpu.live_bytes)), exact));
        others.push(("cuda_reserved", series(samples, |s| s.memory.cuda.map(|c| c.reserved_bytes)), DetectorConfig::noisy(options.warmup, CUDA_RESERVED_NOISE_BYTES)));
    }
    for (probe, series, config) in others {
        if let Some(Ok(judgement)) = series.map(|s| judge(&s, &config)) {
            result.others.push(ProbeVerdict { probe: probe.into(), judgement });
        }
    }
    let stage_series: Vec<(String, Vec<Sample>)> =
        Stage::ALL.iter().enumerate().map(|(i, stage)| (stage.name().to_string(), samples.iter().map(|s| (s.request, s.stage_live_bytes[i])).collect())).collect();
    if let Ok(findings) = attribute(&stage_series, &exact) {
        result.stages = findings
            .into_iter()
            .map(|f| StageGrowth { stage: f.stage, verdict: f.judgement.verdict, bytes_per_request: f.judgement.slope.bytes_per_request })
            .collect();
    }
    result
}
