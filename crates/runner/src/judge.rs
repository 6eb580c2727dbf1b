//! From a variant's samples to its verdicts: the primary probe of the device decides pass or
//! fail, the others (RSS, malloc heap, and on CUDA the CPU allocator and CUDA reserved) are
//! reported beside it.

use crate::driver::{RunOptions, VariantRun};
use crate::expect::expected;
use leaklab_detect::{attribute, judge, DetectorConfig, Judgement, Projection, Sample, Scenario, Verdict};
use leaklab_vocab::{Cause, Device, Probe, RequestSample, Stage, Variant};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProbeVerdict {
    pub probe: Probe,
    pub judgement: Judgement,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StageGrowth {
    pub stage: Stage,
    pub verdict: Verdict,
    pub bytes_per_request: f64,
}

/// How a variant's run ended: judged, or failed before a verdict could be given.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum Outcome {
    Judged { primary: ProbeVerdict, others: Vec<ProbeVerdict> },
    Failed { reason: String },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VariantResult {
    pub variant: Variant,
    /// The cause the variant is about; none for baseline and seed (all three).
    pub cause: Option<Cause>,
    pub device: Device,
    pub expected: Vec<Verdict>,
    #[serde(flatten)]
    pub outcome: Outcome,
    /// Stages whose memory does not come back, steepest first.
    pub stages: Vec<StageGrowth>,
    /// At the primary slope, in the reference scenario (80 GB, 12 GB at start, a request every 32 s).
    pub projection: Option<Projection>,
    pub passed: bool,
    pub requests: usize,
    pub errors: u64,
    pub seconds: f64,
    /// Who holds the memory the run kept (allocated during the run and never freed), from the
    /// service's snapshot: the largest allocating stacks first (empty without a snapshot).
    #[serde(default)]
    pub holders: Vec<leaklab_snapshot::Holder>,
}

impl VariantResult {
    /// The deciding probe's verdict, when the run was judged.
    pub fn primary(&self) -> Option<&ProbeVerdict> {
        match &self.outcome {
            Outcome::Judged { primary, .. } => Some(primary),
            Outcome::Failed { .. } => None,
        }
    }

    /// Every probe's verdict, the deciding one first.
    pub fn probes(&self) -> Vec<&ProbeVerdict> {
        match &self.outcome {
            Outcome::Judged { primary, others } => std::iter::once(primary).chain(others).collect(),
            Outcome::Failed { .. } => Vec::new(),
        }
    }

    pub fn failure(&self) -> Option<&str> {
        match &self.outcome {
            Outcome::Failed { reason } => Some(reason),
            Outcome::Judged { .. } => None,
        }
    }

    /// "FAILED" for a run that failed, else the deciding verdict.
    pub fn verdict_label(&self) -> String {
        self.primary().map_or("FAILED".into(), |p| p.judgement.verdict.to_string())
    }

    /// "all three" for baseline and seed, else the cause's name.
    pub fn cause_label(&self) -> &'static str {
        self.cause.map_or("all three", Cause::name)
    }
}

/// The five largest holders of the memory the run kept: what the service's allocation trace
/// (recorded from start-up, after the model was built) allocated and never freed. None when
/// the snapshot cannot be read: the report leaves the section out, the pickle is still written.
fn holders(pickle: &[u8]) -> Option<Vec<leaklab_snapshot::Holder>> {
    let snapshot = leaklab_snapshot::from_bytes(pickle).ok()?;
    let explained = leaklab_snapshot::explain(&snapshot, leaklab_snapshot::View::default(), Some(leaklab_snapshot::Since::Event(0)));
    let mut holders = explained.since?.holders;
    holders.truncate(5);
    Some(holders)
}

/// The series of `probe` over `samples`, when every sample carries it.
pub fn series(samples: &[RequestSample], probe: Probe) -> Option<Vec<Sample>> {
    samples.iter().map(|s| probe.read(&s.memory).map(|v| (s.request, v))).collect()
}

/// The probes reported beside the primary one on `device`.
fn others(device: Device) -> &'static [Probe] {
    match device {
        Device::Cpu => &[Probe::Rss, Probe::MallocHeap],
        Device::Cuda => &[Probe::Rss, Probe::MallocHeap, Probe::CpuAllocator, Probe::CudaReserved, Probe::NvmlProcess],
    }
}

/// The detector's settings for `probe` after `warmup` requests.
pub fn config_for(probe: Probe, warmup: usize) -> DetectorConfig {
    DetectorConfig::noisy(warmup, probe.noise_bytes())
}

pub fn judge_run(run: &VariantRun, options: &RunOptions) -> VariantResult {
    let variant = run.variant;
    let expected = expected(variant).to_vec();
    let mut result = VariantResult {
        variant,
        cause: variant.cause(),
        device: options.device,
        expected: expected.clone(),
        outcome: Outcome::Failed { reason: String::new() },
        stages: Vec::new(),
        projection: None,
        passed: false,
        requests: run.samples.len(),
        errors: run.errors,
        seconds: run.seconds,
        holders: run.snapshot.as_deref().and_then(holders).unwrap_or_default(),
    };
    if let Some(reason) = &run.failure {
        result.outcome = Outcome::Failed { reason: reason.clone() };
        return result;
    }
    let samples = &run.samples;
    let primary_probe = options.device.primary_probe();
    let Some(primary_series) = series(samples, primary_probe) else {
        result.outcome = Outcome::Failed { reason: format!("the service's samples carry no {primary_probe} figure") };
        return result;
    };
    let primary = match judge(&primary_series, &config_for(primary_probe, options.warmup)) {
        Ok(j) => j,
        Err(e) => {
            result.outcome = Outcome::Failed { reason: format!("no verdict: {e}") };
            return result;
        }
    };
    result.projection = Scenario::REFERENCE.project(primary.slope.bytes_per_request).filter(|_| primary.verdict == Verdict::Leak);
    result.passed = expected.contains(&primary.verdict) && run.errors == 0;
    let others = others(options.device)
        .iter()
        .filter_map(|&probe| {
            let judgement = series(samples, probe).and_then(|s| judge(&s, &config_for(probe, options.warmup)).ok())?;
            Some(ProbeVerdict { probe, judgement })
        })
        .collect();
    result.outcome = Outcome::Judged { primary: ProbeVerdict { probe: primary_probe, judgement: primary }, others };
    let stage_series: Vec<(Stage, Vec<Sample>)> = Stage::ALL.iter().map(|&stage| (stage, samples.iter().map(|s| (s.request, s.stage_live_bytes.get(stage))).collect())).collect();
    if let Ok(findings) = attribute(&stage_series, &DetectorConfig::exact(options.warmup)) {
        result.stages = findings.into_iter().map(|f| StageGrowth { stage: f.stage, verdict: f.judgement.verdict, bytes_per_request: f.judgement.slope.bytes_per_request }).collect();
    }
    result
}
