//! `leaklab scan --prometheus`: the fleet's memory, from the Prometheus server it already runs.
//!
//! One range query ([`prometheus`]) grouped by a label (`sum by (pod)`), each series split into
//! lives at its resets and judged on the stretch that says what the memory does now
//! ([`history`]: the current life, or a sawtooth's troughs) with the noisy-signal detector of
//! `scan`, then projected onto its capacity (a constant, or a query such as DCGM's used + free)
//! and sorted by urgency ([`report`]). Slopes are per second of wall time (a fleet has time,
//! not request counts), and per request where a request-rate query is given.
//!
//! No libtorch, and nothing of the scanned services: it reads numbers from Prometheus.

pub mod command;
pub mod history;
pub mod prometheus;
pub mod report;
pub mod synthetic;

use anyhow::{bail, Result};
use history::{HistoryConfig, Judged, Reset};
use leaklab_detect::budget::{ops_at, Budget, Ops};
use leaklab_detect::Verdict;
pub use leaklab_report::Outcome;
use prometheus::{Client, Range, Series};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

pub use command::{run, FleetCommand, Unit};

/// Where each series' capacity comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum Capacity {
    None,
    /// The same for every series, in bytes.
    Bytes(u64),
    /// A query, grouped like the main one; its value per group at the range's end (for DCGM:
    /// `DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE`).
    Query(String),
}

pub struct FleetOptions {
    /// The server, e.g. http://prometheus:9090.
    pub prometheus: String,
    /// The memory series, e.g. `DCGM_FI_DEV_FB_USED`.
    pub query: String,
    /// Labels to group by (`sum by (...)`); empty: the series as the query returns them.
    pub by: Vec<String>,
    pub range: Range,
    /// Bytes per unit of the series (1 for bytes, 1,048,576 for DCGM's MiB).
    pub unit_bytes: f64,
    pub capacity: Capacity,
    /// Requests per second per group, for bytes per request, e.g. `rate(http_requests_total[5m])`.
    pub rate_query: Option<String>,
    /// Seconds of each life that began in the range left unjudged.
    pub warmup_s: f64,
    /// Fail when a series runs out sooner than this.
    pub fail_within_s: f64,
    /// Trust, credentials, headers and the query timeout for the server.
    pub http: leaklab_client::ClientOptions,
}

/// One group's series, judged.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PodResult {
    /// The group's labels as `pod=a,namespace=b`.
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// Finite samples, and the NaN/Inf ones the server returned that were dropped.
    pub points: usize,
    pub dropped: usize,
    pub first_seen: f64,
    pub last_seen: f64,
    /// No sample in the range's last `max(5 steps, 5 min)`: replaced or deleted. Never alarmed.
    pub gone: bool,
    pub resets: Vec<Reset>,
    pub judged: Option<Judged>,
    pub why_not_judged: Option<String>,
    pub capacity_bytes: Option<u64>,
    pub bytes_per_hour: Option<f64>,
    pub bytes_per_request: Option<f64>,
    pub seconds_to_oom: Option<f64>,
    pub ops: Option<Ops>,
}

impl PodResult {
    pub fn verdict(&self) -> Option<Verdict> {
        self.judged.as_ref().map(|j| j.judgement.verdict)
    }

    pub fn oom_kills(&self) -> usize {
        self.resets
            .iter()
            .filter(|r| r.kind == history::ResetKind::OutOfMemory)
            .count()
    }

    /// Most urgent first: runs out within the budget (soonest first), then other leaks (soonest
    /// first), plateaus, flat, not judged, and gone pods last.
    fn urgency(&self) -> (u8, f64) {
        let rank = match (self.gone, self.ops, self.verdict()) {
            (true, ..) => 6,
            (_, Some(o), _) if o.fails() => 0,
            (_, _, Some(Verdict::Leak)) => 1,
            (_, _, Some(Verdict::Plateau)) => 2,
            (_, _, Some(Verdict::Flat)) => 3,
            _ => 4,
        };
        (rank, self.seconds_to_oom.unwrap_or(f64::INFINITY))
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FleetReport {
    pub prometheus: String,
    /// The query as sent (with its grouping).
    pub query: String,
    pub start: f64,
    pub end: f64,
    pub step: f64,
    pub outcome: Outcome,
    pub budget: Budget,
    /// Every group, most urgent first.
    pub pods: Vec<PodResult>,
    /// Seconds spent querying, and judging.
    pub query_seconds: f64,
    pub judge_seconds: f64,
    pub notes: Vec<String>,
    /// Groups the terminal's table shows (`--top`); the files and `--json` have them all.
    #[serde(skip, default = "FleetReport::default_top")]
    pub top: usize,
}

impl FleetReport {
    fn default_top() -> usize {
        20
    }
}

/// `sum by (labels) (query)`, or the query itself with no labels.
pub fn grouped(query: &str, by: &[String]) -> String {
    if by.is_empty() {
        query.to_string()
    } else {
        format!("sum by ({}) ({query})", by.join(", "))
    }
}

fn name(labels: &BTreeMap<String, String>) -> String {
    if labels.is_empty() {
        return "{}".into();
    }
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The inputs of [`judge_series`] that are the same for every series.
#[derive(Debug, Clone, Copy)]
pub struct JudgeConfig {
    pub range: Range,
    pub unit_bytes: f64,
    pub warmup_s: f64,
    pub budget: Budget,
}

/// One series judged (pure: the bench and the tests call it without a server). `capacity` in
/// bytes; `rate` the group's request-rate samples, when a rate query was given.
pub fn judge_series(
    series: &Series,
    capacity: Option<u64>,
    rate: Option<&Series>,
    config: &JudgeConfig,
) -> PodResult {
    let points: Vec<(f64, f64)> = series
        .points
        .iter()
        .map(|&(t, v)| (t, v * config.unit_bytes))
        .collect();
    let (first_seen, last_seen) = (
        points.first().map_or(f64::NAN, |p| p.0),
        points.last().map_or(f64::NAN, |p| p.0),
    );
    let gone = last_seen < config.range.end - (5.0 * config.range.step).max(300.0);
    let quantum = if config.unit_bytes >= 1024.0 * 1024.0 {
        config.unit_bytes
    } else {
        4096.0
    };
    let resets = history::resets(&points, capacity.map(|c| c as f64), quantum);
    let history_config = HistoryConfig {
        quantum_bytes: quantum,
        warmup_s: config.warmup_s,
        range_start: config.range.start,
        min_samples: 30,
    };
    let mut result = PodResult {
        name: name(&series.labels),
        labels: series.labels.clone(),
        points: points.len(),
        dropped: series.dropped,
        first_seen,
        last_seen,
        gone,
        resets: resets.iter().map(|r| r.1).collect(),
        judged: None,
        why_not_judged: None,
        capacity_bytes: capacity,
        bytes_per_hour: None,
        bytes_per_request: None,
        seconds_to_oom: None,
        ops: None,
    };
    match history::judge(&points, &resets, &history_config) {
        Ok(judged) => {
            let per_second = judged.judgement.slope.bytes_per_request;
            result.bytes_per_hour = Some(per_second * 3600.0);
            let since = match judged.basis {
                history::Basis::CurrentLife { since } => since,
                history::Basis::PreviousLife { from, .. } => from,
                history::Basis::Troughs { .. } => f64::NEG_INFINITY,
            };
            result.bytes_per_request = rate.and_then(|r| {
                let rates: Vec<f64> = r
                    .points
                    .iter()
                    .filter(|p| p.0 >= since)
                    .map(|p| p.1)
                    .collect();
                let mean = rates.iter().sum::<f64>() / rates.len().max(1) as f64;
                (mean > 0.0).then(|| per_second / mean)
            });
            if !gone {
                let (ops, seconds) =
                    ops_at(&judged.judgement, judged.level_now, capacity, config.budget);
                result.ops = Some(ops);
                result.seconds_to_oom = seconds;
            }
            result.judged = Some(judged);
        }
        Err(why) => result.why_not_judged = Some(why),
    }
    result
}

/// Every series judged, most urgent first.
pub fn judge_fleet(
    series: &[Series],
    capacities: &BTreeMap<BTreeMap<String, String>, u64>,
    fixed: Option<u64>,
    rates: &BTreeMap<BTreeMap<String, String>, Series>,
    config: &JudgeConfig,
) -> Vec<PodResult> {
    let mut pods: Vec<PodResult> = series
        .iter()
        .map(|s| {
            judge_series(
                s,
                fixed.or_else(|| capacities.get(&s.labels).copied()),
                rates.get(&s.labels),
                config,
            )
        })
        .collect();
    pods.sort_by(|a, b| {
        let (ra, ta) = a.urgency();
        let (rb, tb) = b.urgency();
        ra.cmp(&rb)
            .then(ta.total_cmp(&tb))
            .then(a.name.cmp(&b.name))
    });
    pods
}

/// Queries the server and judges the fleet. A partial answer (a capacity or rate query that
/// fails) is kept with a note; only the memory query failing is an error.
pub async fn scan_fleet(options: &FleetOptions) -> Result<FleetReport> {
    let client = Client::new(&options.prometheus, &options.http)?;
    let query = grouped(&options.query, &options.by);
    let started = Instant::now();
    // The three queries at once: the server evaluates them in parallel. A capacity is each
    // group's value at the range's end, an instant query (a range of it costs as much as the
    // memory query); a group gone by then is not projected anyway.
    let capacity_query = match &options.capacity {
        Capacity::Query(q) => Some(grouped(q, &options.by)),
        _ => None,
    };
    let rate_query = options.rate_query.as_ref().map(|q| grouped(q, &options.by));
    let (series, capacity_answer, rate_answer) = tokio::join!(
        client.query_range(&query, options.range),
        async {
            match &capacity_query {
                Some(q) => Some(client.query_instant(q, options.range.end).await),
                None => None,
            }
        },
        async {
            match &rate_query {
                Some(q) => Some(client.query_range(q, options.range).await),
                None => None,
            }
        },
    );
    let series = series?;
    let mut notes = Vec::new();
    if series.is_empty() {
        notes.push(format!(
            "`{query}` matched no series between {} and {}: check the metric name and the range",
            options.range.start, options.range.end
        ));
    }
    let fixed = match options.capacity {
        Capacity::Bytes(b) => Some(b),
        _ => None,
    };
    let mut capacities = BTreeMap::new();
    match capacity_answer {
        Some(Ok(found)) => {
            capacities.extend(
                found
                    .into_iter()
                    .map(|(labels, v)| (labels, (v * options.unit_bytes).max(0.0) as u64)),
            );
        }
        Some(Err(e)) => notes.push(format!(
            "the capacity query failed, so no time to OOM: {e:#}"
        )),
        None => {}
    }
    let mut rates = BTreeMap::new();
    match rate_answer {
        Some(Ok(found)) => rates.extend(found.into_iter().map(|s| (s.labels.clone(), s))),
        Some(Err(e)) => notes.push(format!(
            "the request-rate query failed, so no bytes per request: {e:#}"
        )),
        None => {}
    }
    let query_seconds = started.elapsed().as_secs_f64();
    let budget = Budget {
        steps_per_second: 1.0,
        seconds: options.fail_within_s,
    };
    let config = JudgeConfig {
        range: options.range,
        unit_bytes: options.unit_bytes,
        warmup_s: options.warmup_s,
        budget,
    };
    let started = Instant::now();
    let pods = judge_fleet(&series, &capacities, fixed, &rates, &config);
    let judge_seconds = started.elapsed().as_secs_f64();
    let missing = pods
        .iter()
        .filter(|p| !p.gone && p.capacity_bytes.is_none())
        .count();
    if let (Some(q), true) = (&capacity_query, missing > 0) {
        notes.push(format!("the capacity query `{q}` has no value at the range's end for {missing} of the groups still running: no time to OOM for those"));
    }
    let dropped: usize = pods.iter().map(|p| p.dropped).sum();
    if dropped > 0 {
        notes.push(format!(
            "{dropped} samples were NaN or infinite and were left out"
        ));
    }
    let outcome = if pods.iter().any(|p| p.ops.is_some_and(Ops::fails)) {
        Outcome::Fail
    } else if pods.iter().any(|p| p.judged.is_some()) {
        Outcome::Pass
    } else {
        Outcome::CannotJudge
    };
    Ok(FleetReport {
        prometheus: options.prometheus.clone(),
        query,
        start: options.range.start,
        end: options.range.end,
        step: options.range.step,
        outcome,
        budget,
        pods,
        query_seconds,
        judge_seconds,
        notes,
        top: FleetReport::default_top(),
    })
}

/// The range ending at `end` (unix seconds; now when `None`), `range` long, at `step` (default:
/// 2,880 points over the range, and never under 15 s, Prometheus's common scrape interval).
pub fn range(end: Option<f64>, range: Duration, step: Option<Duration>) -> Result<Range> {
    let end = match end {
        Some(e) => e,
        None => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs_f64()
            .floor(),
    };
    let span = range.as_secs_f64();
    let step = step.map_or((span / 2880.0).ceil().max(15.0), |s| s.as_secs_f64());
    if span <= 0.0 || step <= 0.0 {
        bail!("--range and --step must be longer than zero");
    }
    if span / step < 30.0 {
        bail!("{span} s at a step of {step} s is {} points: a verdict needs at least 30; widen --range or shorten --step", (span / step).floor());
    }
    Ok(Range {
        start: end - span,
        end,
        step,
    })
}
