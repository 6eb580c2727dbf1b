//! `leaklab scan URL`'s flags as plain data, and the one call the binary makes: the flags
//! checked against each other, the signals opened (a bad PID, cgroup or series is said before
//! any load), the bodies read, and the scan run on its own runtime.

use crate::signals::Signal;
use crate::verdict::{Budget, Named};
use crate::{load, scan, ScanOptions, ScanReport, Target};
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Every flag of `leaklab scan URL`, as given (`leaklab scan --help` says what each means).
pub struct ScanCommand {
    pub url: String,
    /// Files, folders of files, or `-` for stdin, cycled.
    pub bodies: Vec<String>,
    pub method: reqwest::Method,
    pub vary: Option<u64>,
    pub requests: usize,
    pub warmup: usize,
    pub until_confident: bool,
    pub max_requests: usize,
    pub concurrency: usize,
    /// Requests a second at the most, sent on a steady clock.
    pub pace: Option<f64>,
    pub time_limit: Duration,
    pub max_error_ratio: f64,
    /// Trust, credentials, headers and the request timeout.
    pub http: leaklab_client::ClientOptions,
    pub pid: Option<u32>,
    pub cgroup: Option<PathBuf>,
    pub gpu: bool,
    pub metrics: Option<String>,
    pub series: Vec<String>,
    pub snapshot: Option<String>,
    pub agent: Option<String>,
    pub capacity: Option<u64>,
    /// Requests per second in production: with it, the budget decides; without, any leak proven
    /// fails (`leaklab_detect::budget`).
    pub rate: Option<f64>,
    /// A budget by name instead of `rate` (`seed`).
    pub budget: Option<Named>,
    /// The budget's time (7 days when a rate is given without it).
    pub fail_if_oom_within: Option<Duration>,
    /// Draw nothing on stderr (for `--json`).
    pub quiet: bool,
    /// With the agent: its trim probe after the looks inside (`POST trim`, opt-in).
    pub trim: bool,
    /// With the agent: full collections before the warm-up and after the judged requests.
    pub collect: bool,
    /// With the agent: its native allocation trace over a window of requests (`POST native`).
    pub native: bool,
    /// With the agent: its Python trace over a window of requests (`POST pytrace`).
    pub python_trace: bool,
}

impl ScanCommand {
    /// The signals the flags name, each opened once: what cannot be watched is said now.
    fn signals(&self) -> Result<Vec<Signal>> {
        let mut signals = Vec::new();
        if let Some(pid) = self.pid {
            signals.push(Signal::Process { pid });
            if self.gpu {
                signals.push(Signal::gpu(pid)?);
            }
        } else if self.gpu {
            bail!("--gpu watches a process: give its --pid too");
        }
        if let Some(dir) = &self.cgroup {
            signals.push(Signal::cgroup(dir)?);
        }
        match (&self.metrics, self.series.is_empty()) {
            (Some(url), false) => signals.push(Signal::Metrics { url: url.clone(), series: self.series.clone(), client: self.http.build()? }),
            (Some(_), true) => bail!("--metrics needs the series to read: --series process_resident_memory_bytes (repeat for more)"),
            (None, false) => bail!("--series reads from a metrics endpoint: give --metrics URL too"),
            (None, true) => {}
        }
        Ok(signals)
    }
}

/// The time a budget gives when only its rate is named.
pub const DEFAULT_WITHIN: Duration = Duration::from_secs(7 * 86400);

/// The budget the flags give: a rate (or a named budget) and a time; none without a rate.
pub fn budget(
    rate: Option<f64>,
    named: Option<Named>,
    within: Option<Duration>,
) -> Result<Option<Budget>> {
    let seconds = within.map(|w| w.as_secs_f64());
    Ok(match (rate, named) {
        (Some(_), Some(_)) => bail!("give --rate or --budget, not both"),
        (Some(rate), None) => Some(Budget { steps_per_second: rate, seconds: seconds.unwrap_or(DEFAULT_WITHIN.as_secs_f64()) }),
        (None, Some(named)) => Some(Budget { seconds: seconds.unwrap_or(named.budget().seconds), ..named.budget() }),
        (None, None) if within.is_some() => bail!("--fail-if-oom-within is a time at a request rate: give the production rate with --rate too (without one, any leak the scan proves fails)"),
        (None, None) => None,
    })
}

/// `leaklab scan URL`: checks the flags, opens the signals and scans.
pub fn run(cmd: ScanCommand) -> Result<ScanReport> {
    let budget = budget(cmd.rate, cmd.budget, cmd.fail_if_oom_within)?;
    let bodies = load::read_bodies(&cmd.bodies)?;
    let content_type = load::content_type(&bodies, &cmd.http.headers);
    let options = ScanOptions {
        signals: cmd.signals()?,
        target: Arc::new(Target {
            url: cmd.url,
            method: cmd.method,
            bodies,
            vary: cmd.vary,
            content_type,
        }),
        warmup: cmd.warmup,
        requests: cmd.requests,
        max_requests: cmd.max_requests.max(cmd.warmup + cmd.requests),
        until_confident: cmd.until_confident,
        concurrency: cmd.concurrency,
        pace: cmd.pace,
        http: cmd.http,
        time_limit: cmd.time_limit,
        max_error_ratio: cmd.max_error_ratio,
        capacity: cmd.capacity,
        budget,
        quiet: cmd.quiet,
        snapshot_url: cmd.snapshot,
        agent_url: cmd.agent,
        trim: cmd.trim,
        collect: cmd.collect,
        native: cmd.native,
        python_trace: cmd.python_trace,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(scan(&options))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_needs_a_rate_and_without_one_there_is_none() {
        assert_eq!(budget(None, None, None).unwrap(), None);
        assert_eq!(
            budget(Some(10.0), None, None).unwrap(),
            Some(Budget {
                steps_per_second: 10.0,
                seconds: 7.0 * 86400.0
            })
        );
        assert_eq!(
            budget(Some(10.0), None, Some(Duration::from_secs(3600))).unwrap(),
            Some(Budget {
                steps_per_second: 10.0,
                seconds: 3600.0
            })
        );
        assert_eq!(
            budget(None, Some(Named::Seed), None).unwrap(),
            Some(Budget::SEED)
        );
        assert!(budget(None, None, Some(DEFAULT_WITHIN))
            .unwrap_err()
            .to_string()
            .contains("give the production rate with --rate"));
        assert!(budget(Some(1.0), Some(Named::Seed), None).is_err());
    }
}
