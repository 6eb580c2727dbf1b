//! Soak: the fixed variants under sustained concurrent load. What users copy into production
//! must hold: zero bytes per request on the exact allocator after warm-up, no errors, and no
//! latency drift between the start and the end of the run.

use crate::driver::{run_variant, RunOptions, VariantRun};
use crate::judge::{config_for, series};
use leaklab_detect::{judge, Judgement, Verdict};
use leaklab_report::progress::Bars;
use leaklab_report::{human_bytes, Outcome, Report};
use leaklab_vocab::{Probe, Variant};
use serde::{Deserialize, Serialize};

/// The variants a soak runs: every fixed one and the baseline.
pub const VARIANTS: [Variant; 4] = [
    Variant::GraphFixed,
    Variant::RefsFixed,
    Variant::CacheFixed,
    Variant::Baseline,
];

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Latency {
    pub p50_ms: f64,
    pub p99_ms: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SoakResult {
    pub variant: Variant,
    pub requests: usize,
    pub errors: u64,
    pub seconds: f64,
    pub requests_per_second: f64,
    pub allocator: Option<Judgement>,
    pub rss: Option<Judgement>,
    /// The first and the last tenth of the measured requests, as the client saw them.
    pub latency_start: Option<Latency>,
    pub latency_end: Option<Latency>,
    pub failure: Option<String>,
    pub passed: bool,
}

fn latency(us: &[u64]) -> Option<Latency> {
    if us.is_empty() {
        return None;
    }
    let mut v = us.to_vec();
    v.sort_unstable();
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize] as f64 / 1000.0;
    Some(Latency {
        p50_ms: at(0.5),
        p99_ms: at(0.99),
    })
}

pub fn judge_soak(run: &VariantRun, options: &RunOptions) -> SoakResult {
    // The fixed cache fills during the first requests; judge from past the warm-up.
    let judged = |probe: Probe| {
        series(&run.samples, probe).and_then(|s| judge(&s, &config_for(probe, options.warmup)).ok())
    };
    let (allocator, rss) = (judged(Probe::CpuAllocator), judged(Probe::Rss));
    let measured = run
        .latencies_us
        .get(options.warmup.min(run.latencies_us.len())..)
        .unwrap_or(&[]);
    let tenth = (measured.len() / 10).max(1).min(measured.len());
    let (latency_start, latency_end) = (
        latency(&measured[..tenth]),
        latency(&measured[measured.len() - tenth..]),
    );
    let passed = run.failure.is_none()
        && run.errors == 0
        && allocator
            .as_ref()
            .is_some_and(|j| j.verdict != Verdict::Leak && j.slope.bytes_per_request == 0.0);
    SoakResult {
        variant: run.variant,
        requests: run.samples.len(),
        errors: run.errors,
        seconds: run.seconds,
        requests_per_second: run.samples.len() as f64 / run.seconds.max(1e-9),
        allocator,
        rss,
        latency_start,
        latency_end,
        failure: run.failure.clone(),
        passed,
    }
}

pub async fn soak(options: &RunOptions, variants: &[Variant], quiet: bool) -> SoakReport {
    let bars = Bars::new(quiet);
    let mut results = Vec::new();
    for &variant in variants {
        let bar = bars.requests(options.total_requests(), variant.name());
        let run = run_variant(options, variant, &bar).await;
        bar.finish();
        results.push(judge_soak(&run, options));
    }
    SoakReport(results)
}

/// Every variant's soak: soak.md (the table), soak.json (the array of results).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SoakReport(pub Vec<SoakResult>);

impl Report for SoakReport {
    /// Pass when every variant held.
    fn outcome(&self) -> Outcome {
        Outcome::pass_if(self.0.iter().all(|r| r.passed))
    }

    fn text(&self) -> String {
        table(&self.0)
    }

    fn markdown(&self) -> String {
        table(&self.0)
    }
}

pub fn table(results: &[SoakResult]) -> String {
    let mut out = String::from("| variant | requests | errors | req/s | allocator bytes/request | RSS bytes/request | latency p50/p99 start (ms) | end (ms) | result |\n|---|---|---|---|---|---|---|---|---|\n");
    for r in results {
        let slope = |j: &Option<Judgement>| {
            j.as_ref().map_or("-".into(), |j| {
                format!("{} ({})", human_bytes(j.slope.bytes_per_request), j.verdict)
            })
        };
        let lat = |l: Option<Latency>| {
            l.map_or("-".into(), |l| format!("{:.2} / {:.2}", l.p50_ms, l.p99_ms))
        };
        out.push_str(&format!(
            "| {} | {} | {} | {:.0} | {} | {} | {} | {} | {} |\n",
            r.variant,
            r.requests,
            r.errors,
            r.requests_per_second,
            slope(&r.allocator),
            slope(&r.rss),
            lat(r.latency_start),
            lat(r.latency_end),
            match (&r.failure, r.passed) {
                (Some(f), _) => format!("FAILED: {f}"),
                (None, true) => "pass".into(),
                (None, false) => "FAIL".into(),
            }
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use leaklab_vocab::{MemorySample, RequestSample, Scale};

    #[test]
    fn percentiles_are_the_nearest_rank_of_the_sorted_latencies() {
        assert_eq!(latency(&[]), None);
        assert_eq!(
            latency(&[7_000]),
            Some(Latency {
                p50_ms: 7.0,
                p99_ms: 7.0
            })
        );
        // 1..=100 ms, shuffled: the median rounds to the 51st value, p99 to the 99th.
        let mut us: Vec<u64> = (1..=100).map(|ms| ms * 1000).collect();
        us.reverse();
        us.swap(3, 70);
        assert_eq!(
            latency(&us),
            Some(Latency {
                p50_ms: 51.0,
                p99_ms: 99.0
            })
        );
        // One slow request in a hundred shows in p99, not in the median.
        let mut spiky = vec![2_000u64; 99];
        spiky.push(900_000);
        assert_eq!(
            latency(&spiky),
            Some(Latency {
                p50_ms: 2.0,
                p99_ms: 2.0
            }),
            "index round(99 × 0.99) = 98 is still fast"
        );
        spiky.extend([900_000; 2]);
        assert_eq!(latency(&spiky).unwrap().p99_ms, 900.0);
    }

    fn options(warmup: usize) -> RunOptions {
        RunOptions {
            service: "leaklab-service".into(),
            scale: Scale::Default,
            device: leaklab_vocab::Device::Cpu,
            warmup,
            requests: 100,
            concurrency: 1,
            memory_history_entries: 0,
            start_timeout: std::time::Duration::from_secs(1),
            twin: None,
            threads: None,
            malloc_arenas: None,
        }
    }

    fn run(latencies_us: Vec<u64>, live: impl Fn(u64) -> i64) -> VariantRun {
        let samples = (0..latencies_us.len() as u64)
            .map(|request| {
                let mut memory = MemorySample::default();
                memory.cpu.live_bytes = live(request);
                memory.rss_bytes = 300_000_000;
                RequestSample {
                    request,
                    latency_us: latencies_us[request as usize],
                    stage_live_bytes: Default::default(),
                    memory,
                }
            })
            .collect();
        VariantRun {
            variant: Variant::Baseline,
            samples,
            snapshot: None,
            errors: 0,
            load_seconds: 1.0,
            latencies_us,
            seconds: 1.0,
            failure: None,
        }
    }

    #[test]
    fn latency_drift_compares_the_first_and_last_tenth_after_the_warmup() {
        // 20 warm-up requests at 50 ms (not counted), then 100 measured: 1 ms for the first
        // tenth, 3 ms for the last tenth, 2 ms between.
        let lat: Vec<u64> = (0..120)
            .map(|i| {
                if i < 20 {
                    50_000
                } else if i < 30 {
                    1_000
                } else if i >= 110 {
                    3_000
                } else {
                    2_000
                }
            })
            .collect();
        let result = judge_soak(&run(lat, |_| 1_000_000), &options(20));
        assert_eq!(
            result.latency_start,
            Some(Latency {
                p50_ms: 1.0,
                p99_ms: 1.0
            })
        );
        assert_eq!(
            result.latency_end,
            Some(Latency {
                p50_ms: 3.0,
                p99_ms: 3.0
            })
        );
        assert!(result.passed, "flat allocator, no errors: {result:?}");
    }

    #[test]
    fn a_soak_fails_on_any_allocator_growth_an_error_or_a_failed_run() {
        let flat = || run(vec![1_000; 120], |_| 1_000_000);
        // 512 bytes a request after the warm-up: a leak the exact allocator cannot hide.
        let growing = judge_soak(
            &run(vec![1_000; 120], |r| 1_000_000 + 512 * r as i64),
            &options(20),
        );
        assert!(!growing.passed);
        assert_eq!(
            growing.allocator.as_ref().unwrap().slope.bytes_per_request,
            512.0
        );
        let mut errors = flat();
        errors.errors = 1;
        assert!(!judge_soak(&errors, &options(20)).passed);
        let mut failed = flat();
        failed.failure = Some("service exited".into());
        assert!(!judge_soak(&failed, &options(20)).passed);
        assert!(judge_soak(&flat(), &options(20)).passed);
        let report = SoakReport(vec![judge_soak(&flat(), &options(20)), growing]);
        assert_eq!(report.outcome(), Outcome::Fail);
        assert!(
            report.text().lines().nth(3).unwrap().ends_with("| FAIL |"),
            "{}",
            report.text()
        );
    }
}
