//! Soak: the fixed variants under sustained concurrent load. What users copy into production
//! must hold: zero bytes per request on the exact allocator after warm-up, no errors, and no
//! latency drift between the start and the end of the run.

use crate::driver::{run_variant, RunOptions, VariantRun};
use crate::files::write_atomic;
use crate::judge::{config_for, series};
use leaklab_detect::{human_bytes, judge, Judgement, Verdict};
use leaklab_vocab::{Probe, Variant};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The variants a soak runs: every fixed one and the baseline.
pub const VARIANTS: [Variant; 4] = [Variant::GraphFixed, Variant::RefsFixed, Variant::CacheFixed, Variant::Baseline];

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
    Some(Latency { p50_ms: at(0.5), p99_ms: at(0.99) })
}

pub fn judge_soak(run: &VariantRun, options: &RunOptions) -> SoakResult {
    // The fixed cache fills during the first requests; judge from past the warm-up.
    let judged = |probe: Probe| series(&run.samples, probe).and_then(|s| judge(&s, &config_for(probe, options.warmup)).ok());
    let (allocator, rss) = (judged(Probe::CpuAllocator), judged(Probe::Rss));
    let measured = run.latencies_us.get(options.warmup.min(run.latencies_us.len())..).unwrap_or(&[]);
    let tenth = (measured.len() / 10).max(1).min(measured.len());
    let (latency_start, latency_end) = (latency(&measured[..tenth]), latency(&measured[measured.len() - tenth..]));
    let passed = run.failure.is_none()
        && run.errors == 0
        && allocator.as_ref().is_some_and(|j| j.verdict != Verdict::Leak && j.slope.bytes_per_request == 0.0);
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

pub async fn soak(options: &RunOptions, variants: &[Variant], quiet: bool) -> Vec<SoakResult> {
    let bars = indicatif::MultiProgress::with_draw_target(if quiet { indicatif::ProgressDrawTarget::hidden() } else { indicatif::ProgressDrawTarget::stderr() });
    let style = indicatif::ProgressStyle::with_template("{prefix:>12} [{bar:30}] {pos}/{len} {per_sec} {elapsed}").expect("valid template").progress_chars("=> ");
    let mut results = Vec::new();
    for &variant in variants {
        let bar = bars.add(indicatif::ProgressBar::new(options.total_requests() as u64).with_style(style.clone()).with_prefix(variant.name().to_string()));
        let run = run_variant(options, variant, &bar).await;
        bar.finish();
        results.push(judge_soak(&run, options));
    }
    results
}

pub fn table(results: &[SoakResult]) -> String {
    let mut out = String::from("| variant | requests | errors | req/s | allocator bytes/request | RSS bytes/request | latency p50/p99 start (ms) | end (ms) | result |\n|---|---|---|---|---|---|---|---|---|\n");
    for r in results {
        let slope = |j: &Option<Judgement>| j.as_ref().map_or("-".into(), |j| format!("{} ({})", human_bytes(j.slope.bytes_per_request), j.verdict));
        let lat = |l: Option<Latency>| l.map_or("-".into(), |l| format!("{:.2} / {:.2}", l.p50_ms, l.p99_ms));
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

pub fn write(dir: &Path, results: &[SoakResult]) -> anyhow::Result<()> {
    write_atomic(&dir.join("soak.json"), &serde_json::to_vec_pretty(results)?)?;
    write_atomic(&dir.join("soak.md"), table(results).as_bytes())
}
