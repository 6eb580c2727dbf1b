//! The run-lab driver: every variant run as its own service process on a loopback port,
//! driven by a load client, sampled on every request by the service's own probes, judged by
//! the detector, and written up as a table, a report and plots. The soak and the HTTP side of
//! the benchmarks drive the same processes.
//!
//! It knows the service only through HTTP, the `leaklab-service` command line and the
//! vocabulary's sample format; it never links libtorch (tidy checks its dependency tree).

pub mod bench;
pub mod commands;
#[cfg(feature = "instrument")]
pub mod corpus;
pub mod driver;
pub mod expect;
pub mod judge;
pub mod report;
pub mod soak;
#[cfg(feature = "instrument")]
pub mod zoo;

pub use driver::{PythonTwin, RunOptions, VariantRun};
pub use judge::{judge_run, Outcome, ProbeVerdict, VariantResult};
pub use report::{LabReport, LabRun};

use leaklab_report::progress::Bars;
use leaklab_vocab::Variant;
use std::time::Instant;

/// Runs `variants` one after another (each its own service process) and judges them all.
/// With `quiet`, nothing is drawn (for `--json`).
pub async fn run_lab(options: &RunOptions, variants: &[Variant], quiet: bool) -> LabRun {
    let started = Instant::now();
    let bars = Bars::new(quiet);
    let mut runs = Vec::new();
    let mut results = Vec::new();
    for (i, &variant) in variants.iter().enumerate() {
        let bar = bars.requests(options.total_requests(), variant.name());
        let began = Instant::now();
        let run = driver::run_variant(options, variant, &bar).await;
        let result = judge_run(&run, options);
        let msg = match (result.failure(), result.primary()) {
            (Some(f), _) => format!("FAILED: {}", f.chars().take(80).collect::<String>()),
            (None, Some(p)) => format!(
                "{} ({})",
                p.judgement.verdict,
                if result.passed {
                    "as expected"
                } else {
                    "UNEXPECTED"
                }
            ),
            (None, None) => "no verdict".into(),
        };
        if !quiet && !bars.drawn() {
            // No bar where stderr is a pipe: a line per variant, so a log never goes quiet.
            eprintln!(
                "leaklab: [{}/{}] {}: {msg}, {:.1} s ({:.1} s so far)",
                i + 1,
                variants.len(),
                variant.name(),
                began.elapsed().as_secs_f64(),
                started.elapsed().as_secs_f64()
            );
        }
        bar.finish_with_message(msg);
        runs.push(run);
        results.push(result);
    }
    LabRun {
        report: LabReport::new(options, results, started.elapsed().as_secs_f64()),
        runs,
    }
}
