//! The run-lab driver: every variant run as its own service process on a loopback port,
//! driven by a load client, sampled on every request by the service's own probes, judged by
//! the detector, and written up as a table, a report and plots. The soak and the HTTP side of
//! the benchmarks drive the same processes.
//!
//! It knows the service only through HTTP, the `leaklab-service` command line and the
//! vocabulary's sample format; it never links libtorch (tidy checks its dependency tree).

pub mod bench;
pub mod commands;
pub mod driver;
pub mod expect;
pub mod files;
pub mod judge;
pub mod plot;
pub mod report;
pub mod soak;

pub use driver::{PythonTwin, RunOptions, VariantRun};
pub use judge::{judge_run, Outcome, ProbeVerdict, VariantResult};
pub use report::LabReport;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use leaklab_vocab::Variant;
use std::time::Instant;

/// Runs `variants` one after another (each its own service process) and judges them all.
/// With `quiet`, nothing is drawn (for `--json`).
pub async fn run_lab(options: &RunOptions, variants: &[Variant], quiet: bool) -> (Vec<VariantRun>, LabReport) {
    let started = Instant::now();
    let bars = MultiProgress::with_draw_target(if quiet { ProgressDrawTarget::hidden() } else { ProgressDrawTarget::stderr() });
    let style = ProgressStyle::with_template("{prefix:>12} [{bar:30}] {pos}/{len} requests {elapsed} {msg}").expect("valid template").progress_chars("=> ");
    let mut runs = Vec::new();
    let mut results = Vec::new();
    for &variant in variants {
        let bar = bars.add(ProgressBar::new(options.total_requests() as u64).with_style(style.clone()).with_prefix(variant.name().to_string()));
        let run = driver::run_variant(options, variant, &bar).await;
        let result = judge_run(&run, options);
        let msg = match (result.failure(), result.primary()) {
            (Some(f), _) => format!("FAILED: {}", f.chars().take(80).collect::<String>()),
            (None, Some(p)) => format!("{} ({})", p.judgement.verdict, if result.passed { "as expected" } else { "UNEXPECTED" }),
            (None, None) => "no verdict".into(),
        };
        bar.finish_with_message(msg);
        runs.push(run);
        results.push(result);
    }
    let report = LabReport::new(options, results, started.elapsed().as_secs_f64());
    (runs, report)
}
