//! `leaklab scan --prometheus`'s flags as plain data, and the one call the binary makes: the
//! flags checked and turned into [`FleetOptions`] (the grouping, the range and its step, the
//! unit, the capacity), then the fleet scanned on its own runtime.

use crate::{range, scan_fleet, Capacity, FleetOptions, FleetReport};
use anyhow::{bail, Context, Result};
use std::time::Duration;

/// The unit of the memory query's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Bytes,
    /// Mebibytes, as DCGM's framebuffer gauges count.
    Mib,
}

impl Unit {
    /// Bytes per unit.
    pub fn bytes(self) -> f64 {
        match self {
            Unit::Bytes => 1.0,
            Unit::Mib => 1024.0 * 1024.0,
        }
    }
}

/// Every flag of `leaklab scan --prometheus`, as given (`leaklab scan --help` says what each means).
pub struct FleetCommand {
    pub prometheus: String,
    pub query: Option<String>,
    /// Labels to group by, comma-separated; empty for the series as they come.
    pub by: String,
    pub range: Duration,
    pub step: Option<Duration>,
    /// The range's end, unix seconds (now when absent).
    pub end: Option<f64>,
    pub unit: Unit,
    pub capacity_query: Option<String>,
    /// The same capacity for every group, in bytes.
    pub capacity: Option<u64>,
    pub rate_query: Option<String>,
    pub life_warmup: Duration,
    pub fail_if_oom_within: Duration,
    pub http: leaklab_client::ClientOptions,
    /// Groups in the terminal's table.
    pub top: usize,
}

/// `leaklab scan --prometheus`: checks the flags, queries the server and judges every group.
pub fn run(cmd: FleetCommand) -> Result<FleetReport> {
    let Some(query) = cmd.query else {
        bail!("--prometheus needs the memory series to judge: --query DCGM_FI_DEV_FB_USED, for example")
    };
    let capacity = match (cmd.capacity_query, cmd.capacity) {
        (Some(q), _) => Capacity::Query(q),
        (None, Some(c)) => Capacity::Bytes(c),
        (None, None) => Capacity::None,
    };
    let options = FleetOptions {
        prometheus: cmd.prometheus,
        query,
        by: cmd
            .by
            .split(',')
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect(),
        range: range(cmd.end, cmd.range, cmd.step)?,
        unit_bytes: cmd.unit.bytes(),
        capacity,
        rate_query: cmd.rate_query,
        warmup_s: cmd.life_warmup.as_secs_f64(),
        fail_within_s: cmd.fail_if_oom_within.as_secs_f64(),
        http: cmd.http,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let mut report = runtime.block_on(scan_fleet(&options))?;
    report.top = cmd.top;
    Ok(report)
}
