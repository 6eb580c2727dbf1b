//! The progress bars of the commands that drive load (run-lab, soak, scan): one style, on
//! stderr so that `--json | jq` works while a bar runs, hidden with `--json`.

pub use indicatif::ProgressBar;
use indicatif::{MultiProgress, ProgressDrawTarget, ProgressStyle};

/// Bars stacked on stderr, one per run (or none at all when quiet).
pub struct Bars(MultiProgress);

impl Bars {
    /// With `quiet` (for `--json`), nothing is drawn.
    pub fn new(quiet: bool) -> Bars {
        Bars(MultiProgress::with_draw_target(if quiet {
            ProgressDrawTarget::hidden()
        } else {
            ProgressDrawTarget::stderr()
        }))
    }

    /// Whether the bars are drawn: not under `quiet`, nor where stderr is not a terminal (a pipe,
    /// a CI log), where indicatif draws nothing and a plain line must say the progress.
    pub fn drawn(&self) -> bool {
        !self.0.is_hidden()
    }

    /// A bar counting `total` requests, named `prefix` (a variant, "scan").
    pub fn requests(&self, total: usize, prefix: &str) -> ProgressBar {
        self.0.add(
            ProgressBar::new(total as u64)
                .with_style(style())
                .with_prefix(prefix.to_string()),
        )
    }
}

/// `   graph-leaky [=========>      ] 120/220 requests 41.2/s 3s leak (as expected)`.
fn style() -> ProgressStyle {
    ProgressStyle::with_template(
        "{prefix:>12} [{bar:30}] {pos}/{len} requests {per_sec} {elapsed} {msg}",
    )
    .expect("valid template")
    .progress_chars("=> ")
}
