//! From a variant's samples to its verdicts: the primary probe of the device decides pass or
//! fail, the others (RSS, malloc heap, and on CUDA the CPU allocator and CUDA reserved) are
//! reported beside it.

use crate::driver::{RunOptions, VariantRun};
use crate::expect::{describe, expected, expected_rss};
use leaklab_detect::{
    attribute, judge, DetectorConfig, Judgement, Projection, Sample, Scenario, Verdict,
};
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
    Judged {
        primary: ProbeVerdict,
        others: Vec<ProbeVerdict>,
    },
    Failed {
        reason: String,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VariantResult {
    pub variant: Variant,
    /// The cause the variant is about; none for baseline and seed (all three).
    pub cause: Option<Cause>,
    pub device: Device,
    pub expected: Vec<Verdict>,
    /// What RSS must say beside it, for a cause below c10's allocator (the conv cause on CPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_rss: Option<Vec<Verdict>>,
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
        self.primary()
            .map_or("FAILED".into(), |p| p.judgement.verdict.to_string())
    }

    /// What was expected, in words: the deciding probe's verdicts, and RSS's where it must show.
    pub fn expectation(&self) -> String {
        match &self.expected_rss {
            Some(rss) => format!("{}; rss {}", describe(&self.expected), describe(rss)),
            None => describe(&self.expected),
        }
    }

    /// RSS's verdict, when RSS was judged.
    pub fn rss(&self) -> Option<Verdict> {
        self.probes()
            .into_iter()
            .find(|o| o.probe == Probe::Rss)
            .map(|o| o.judgement.verdict)
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
    let explained = leaklab_snapshot::explain(
        &snapshot,
        leaklab_snapshot::View::default(),
        Some(leaklab_snapshot::Since::Event(0)),
    );
    let mut holders = explained.since?.holders;
    holders.truncate(5);
    Some(holders)
}

/// The series of `probe` over `samples`, when every sample carries it.
pub fn series(samples: &[RequestSample], probe: Probe) -> Option<Vec<Sample>> {
    samples
        .iter()
        .map(|s| probe.read(&s.memory).map(|v| (s.request, v)))
        .collect()
}

/// The probes reported beside the primary one on `device`.
fn others(device: Device) -> &'static [Probe] {
    match device {
        Device::Cpu => &[Probe::Rss, Probe::MallocHeap],
        Device::Cuda => &[
            Probe::Rss,
            Probe::MallocHeap,
            Probe::CpuAllocator,
            Probe::CudaReserved,
            Probe::NvmlProcess,
        ],
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
        expected_rss: expected_rss(variant, options.device).map(<[Verdict]>::to_vec),
        outcome: Outcome::Failed {
            reason: String::new(),
        },
        stages: Vec::new(),
        projection: None,
        passed: false,
        requests: run.samples.len(),
        errors: run.errors,
        seconds: run.seconds,
        holders: run
            .snapshot
            .as_deref()
            .and_then(holders)
            .unwrap_or_default(),
    };
    if let Some(reason) = &run.failure {
        result.outcome = Outcome::Failed {
            reason: reason.clone(),
        };
        return result;
    }
    let samples = &run.samples;
    let primary_probe = options.device.primary_probe();
    let Some(primary_series) = series(samples, primary_probe) else {
        result.outcome = Outcome::Failed {
            reason: format!("the service's samples carry no {primary_probe} figure"),
        };
        return result;
    };
    let primary = match judge(&primary_series, &config_for(primary_probe, options.warmup)) {
        Ok(j) => j,
        Err(e) => {
            result.outcome = Outcome::Failed {
                reason: format!("no verdict: {e}"),
            };
            return result;
        }
    };
    result.projection = Scenario::REFERENCE
        .project(primary.slope.bytes_per_request)
        .filter(|_| primary.verdict == Verdict::Leak);
    let others: Vec<ProbeVerdict> = others(options.device)
        .iter()
        .filter_map(|&probe| {
            let judgement = series(samples, probe)
                .and_then(|s| judge(&s, &config_for(probe, options.warmup)).ok())?;
            Some(ProbeVerdict { probe, judgement })
        })
        .collect();
    // A cause below the allocator must show on RSS too; an RSS without a verdict fails it.
    let rss_as_expected = result.expected_rss.as_ref().is_none_or(|want| {
        others
            .iter()
            .any(|o| o.probe == Probe::Rss && want.contains(&o.judgement.verdict))
    });
    result.passed = expected.contains(&primary.verdict) && rss_as_expected && run.errors == 0;
    result.outcome = Outcome::Judged {
        primary: ProbeVerdict {
            probe: primary_probe,
            judgement: primary,
        },
        others,
    };
    let stage_series: Vec<(Stage, Vec<Sample>)> = Stage::ALL
        .iter()
        .map(|&stage| {
            (
                stage,
                samples
                    .iter()
                    .map(|s| (s.request, s.stage_live_bytes.get(stage)))
                    .collect(),
            )
        })
        .collect();
    if let Ok(findings) = attribute(&stage_series, &DetectorConfig::exact(options.warmup)) {
        result.stages = findings
            .into_iter()
            .map(|f| StageGrowth {
                stage: f.stage,
                verdict: f.judgement.verdict,
                bytes_per_request: f.judgement.slope.bytes_per_request,
            })
            .collect();
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use leaklab_vocab::{MemorySample, Scale, StageBytes};

    const WARMUP: usize = 20;

    fn options(device: Device) -> RunOptions {
        RunOptions {
            service: "leaklab-service".into(),
            scale: Scale::Default,
            device,
            warmup: WARMUP,
            requests: 100,
            concurrency: 1,
            memory_history_entries: 0,
            start_timeout: std::time::Duration::from_secs(1),
            twin: None,
            threads: None,
            malloc_arenas: None,
        }
    }

    /// A run whose allocator holds `live(request)` bytes, all born in the forward stage, with
    /// RSS a steady 300 MB.
    fn run(variant: Variant, requests: u64, live: impl Fn(u64) -> i64) -> VariantRun {
        let samples = (0..requests)
            .map(|request| {
                let mut memory = MemorySample::default();
                memory.cpu.live_bytes = live(request);
                memory.rss_bytes = 300_000_000;
                memory.heap_bytes = 50_000_000;
                RequestSample {
                    request,
                    latency_us: 1000,
                    stage_live_bytes: StageBytes {
                        forward: live(request),
                        ..StageBytes::default()
                    },
                    memory,
                }
            })
            .collect();
        VariantRun {
            variant,
            samples,
            snapshot: None,
            errors: 0,
            load_seconds: 1.0,
            latencies_us: vec![1000; requests as usize],
            seconds: 1.0,
            failure: None,
        }
    }

    /// A cache warming up during the warm-up, then `per_request` bytes a request.
    fn growing(per_request: i64) -> impl Fn(u64) -> i64 {
        move |r| {
            if (r as usize) < WARMUP {
                r as i64 * 100_000
            } else {
                2_000_000 + (r as i64 - WARMUP as i64) * per_request
            }
        }
    }

    #[test]
    fn a_leaky_variant_that_leaks_passes_with_its_slope_stage_and_time_to_oom() {
        let result = judge_run(
            &run(Variant::RefsLeaky, 120, growing(16_384)),
            &options(Device::Cpu),
        );
        let primary = result.primary().expect("judged");
        assert_eq!(
            (primary.probe, primary.judgement.verdict),
            (Probe::CpuAllocator, Verdict::Leak)
        );
        assert_eq!(
            primary.judgement.slope.bytes_per_request, 16_384.0,
            "the warm-up's fill is not judged"
        );
        assert!(result.passed);
        assert_eq!(result.stages[0].stage, Stage::Forward);
        // 68 GB of headroom at 16,384 B a request, one every 32 s.
        let oom = result.projection.expect("a leak has a time to OOM");
        assert_eq!(oom.requests, (68e9 / 16_384.0) as u64);
        assert_eq!(
            result.probes().iter().map(|p| p.probe).collect::<Vec<_>>(),
            [Probe::CpuAllocator, Probe::Rss, Probe::MallocHeap]
        );
        assert_eq!(result.verdict_label(), "leak");
    }

    #[test]
    fn a_fixed_variant_passes_flat_and_fails_when_it_leaks() {
        let flat = judge_run(
            &run(Variant::RefsFixed, 120, growing(0)),
            &options(Device::Cpu),
        );
        assert_eq!(flat.primary().unwrap().judgement.verdict, Verdict::Flat);
        assert!(flat.passed && flat.projection.is_none());
        let leaking = judge_run(
            &run(Variant::RefsFixed, 120, growing(512)),
            &options(Device::Cpu),
        );
        assert_eq!(leaking.primary().unwrap().judgement.verdict, Verdict::Leak);
        assert!(
            !leaking.passed,
            "a fix that leaks 512 B a request is not a fix"
        );
        // A leaky variant that stopped leaking fails too: the lab must show the leak.
        assert!(
            !judge_run(
                &run(Variant::GraphLeaky, 120, growing(0)),
                &options(Device::Cpu)
            )
            .passed
        );
    }

    #[test]
    fn the_conv_cause_is_judged_on_rss_beside_an_exact_probe_that_must_stay_flat() {
        // Exact live bytes flat after the warm-up; RSS growing by `rss` bytes a request.
        let run_of = |variant, exact: i64, rss: u64| {
            let mut r = run(variant, 120, growing(exact));
            for s in &mut r.samples {
                s.memory.rss_bytes = 300_000_000 + s.request * rss;
            }
            judge_run(&r, &options(Device::Cpu))
        };
        let leaky = run_of(Variant::ConvLeaky, 0, 1_000_000);
        assert_eq!(leaky.verdict_label(), "flat");
        assert!(matches!(
            leaky.rss(),
            Some(Verdict::Leak | Verdict::Plateau)
        ));
        assert!(leaky.passed);
        assert_eq!(leaky.expectation(), "flat; rss leak or plateau");
        assert!(
            !run_of(Variant::ConvLeaky, 0, 0).passed,
            "a leaky conv whose RSS stays flat did not show its cause"
        );
        assert!(
            !run_of(Variant::ConvLeaky, 16_384, 1_000_000).passed,
            "the exact probe must see nothing of oneDNN's cache"
        );
        assert!(run_of(Variant::ConvFixed, 0, 0).passed);
        // RSS proven to climb still fails it: 3 MB a request clears the declared RSS noise's
        // bound on the window's last half (1 MB a request does not, and reads a plateau).
        assert!(!run_of(Variant::ConvFixed, 0, 3_000_000).passed);
        // A fixed conv whose RSS rose to a bound and stopped (glibc's heap under two requests
        // at once) is not a leak; the size of its rise is the run-lab test's to compare with
        // the leaky variant's, which reads a plateau as often as a leak.
        let mut bounded = run(Variant::ConvFixed, 120, growing(0));
        for s in &mut bounded.samples {
            s.memory.rss_bytes = 300_000_000 + s.request.min(60) * 500_000;
        }
        let bounded = judge_run(&bounded, &options(Device::Cpu));
        assert_eq!(bounded.rss(), Some(Verdict::Plateau));
        assert!(bounded.passed);
        // On CUDA there is no RSS expectation: the convs run through cuDNN, not measured here.
        assert_eq!(expected_rss(Variant::ConvLeaky, Device::Cuda), None);
    }

    #[test]
    fn errors_fail_a_run_whose_verdict_was_as_expected() {
        let mut with_errors = run(Variant::RefsFixed, 120, growing(0));
        with_errors.errors = 3;
        let result = judge_run(&with_errors, &options(Device::Cpu));
        assert_eq!(result.primary().unwrap().judgement.verdict, Verdict::Flat);
        assert!(!result.passed);
    }

    #[test]
    fn a_run_without_a_verdict_is_failed_with_the_reason() {
        let mut died = run(Variant::RefsLeaky, 30, growing(16_384));
        died.failure = Some("service exited (signal 9)".into());
        let result = judge_run(&died, &options(Device::Cpu));
        assert_eq!(result.failure(), Some("service exited (signal 9)"));
        assert_eq!(result.verdict_label(), "FAILED");
        assert!(!result.passed && result.primary().is_none() && result.probes().is_empty());

        let short = judge_run(
            &run(Variant::RefsLeaky, WARMUP as u64 + 2, growing(16_384)),
            &options(Device::Cpu),
        );
        assert!(
            short.failure().unwrap().starts_with("no verdict: "),
            "{:?}",
            short.failure()
        );

        // On CUDA the primary probe is CUDA's allocator: samples without it cannot be judged.
        let cpu_only = judge_run(
            &run(Variant::RefsLeaky, 120, growing(16_384)),
            &options(Device::Cuda),
        );
        assert_eq!(
            cpu_only.failure(),
            Some("the service's samples carry no cuda_allocated figure")
        );
    }
}
