//! `leaklab watch`: a watch of a service in production that sends it no request.
//!
//! Every interval it looks at the service's own request count (the agent's `stats`, summed over
//! its workers, or the service's Prometheus counter) and its memory (the process tree, the
//! cgroup, the GPU, or the agent's figures), for a duration from minutes to days. The looks are
//! cut into runs at each restart; each run's memory is judged per request by the scan's detector
//! on the looks where the count moved, and apart from that per hour while no request arrives. A
//! live line says the verdict so far; the end, Ctrl-C or SIGTERM keeps the report (report.html,
//! JSON, plots, and `evidence.json`, what the judgement read). With the agent it takes the tensor
//! census at the start and, on a leak, again at the end (and on CUDA the snapshot): the holders
//! that grew between them name the owner (verdict, axis, owner first). The watch measures; the
//! judgement is [`leaklab_judge::watch::judge_watch`] over its [`WatchEvidence`]. Exit codes as
//! the scan's: 0 pass, 1 fail, 2 no verdict yet.

pub mod cadence;
pub mod recording;
pub mod report;
pub mod sample;

use anyhow::{bail, Context, Result};
use leaklab_detect::budget::{Budget, Named};
use leaklab_judge::watch::looks::{self, Point, RunResult};
pub use leaklab_judge::watch::{diagnosis, WatchEvidence};
use leaklab_report::{human_bytes, human_duration, Outcome};
use leaklab_scan::agent::{Census, CensusDiff};
use leaklab_scan::diagnosis::OwnerReading;
use leaklab_scan::signals::{Kind, Signal};
use recording::WatchRecording;
use sample::{Counter, Sampler};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Every flag of `leaklab watch`, as given (`leaklab watch --help` says what each means).
pub struct WatchCommand {
    pub agent: Option<String>,
    pub metrics: Option<String>,
    pub requests_series: Option<String>,
    /// Memory gauges read from `metrics`.
    pub series: Vec<String>,
    pub pid: Option<u32>,
    pub cgroup: Option<PathBuf>,
    pub gpu: bool,
    /// `None`: chosen from the duration and the traffic ([`cadence`]).
    pub interval: Option<Duration>,
    pub duration: Duration,
    pub warmup: u64,
    pub until_confident: bool,
    pub min_requests: u64,
    pub capacity: Option<u64>,
    pub rate: Option<f64>,
    pub budget: Option<Named>,
    pub fail_if_oom_within: Option<Duration>,
    pub http: leaklab_client::ClientOptions,
    /// Draw no live line (for `--json`).
    pub quiet: bool,
}

/// Why the watch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stop {
    /// `--duration` ran out.
    Duration,
    /// `--until-confident`: every verdict is one more looks cannot change.
    Confident,
    /// Ctrl-C or SIGTERM: the verdict so far.
    Interrupted,
    /// Nothing could be read for a long while (the service is gone).
    Gone,
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stop::Duration => "the duration ran out",
            Stop::Confident => "the verdict became confident (--until-confident)",
            Stop::Interrupted => "interrupted (Ctrl-C or SIGTERM): the verdict so far",
            Stop::Gone => "nothing could be read for 60 looks in a row: the service is gone",
        })
    }
}

/// What `leaklab watch` answers.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WatchReport {
    /// The agent's base, or the metrics endpoint.
    pub target: String,
    pub outcome: Outcome,
    /// Which memory grows, per request or while idle, and what to do.
    pub diagnosis: String,
    pub stop: Stop,
    pub seconds: f64,
    pub interval_seconds: f64,
    /// Looks that failed (the service restarting, a timeout), not in `points`.
    pub missed_looks: usize,
    pub warmup: u64,
    /// `None`: no budget, so any leak proven fails; times to OOM at each run's own rate.
    pub budget: Option<Budget>,
    pub runs: Vec<RunResult>,
    /// The run that decides: the first that fails, else the last judged.
    pub deciding: Option<usize>,
    /// The axis memory grows along in the deciding run (where a run is judged).
    pub axis: Option<diagnosis::AxisReading>,
    /// Who owns the growth, on a leak.
    pub owner: Option<OwnerReading>,
    /// With the agent, on a leak: the holders that grew between its censuses at the watch's
    /// start and its end (the scan's `census`).
    pub census: Option<CensusDiff>,
    /// With the agent, on a leak where the two censuses cannot be compared (no census at the
    /// start, or the end's reached another process): the end's, largest holders first.
    pub census_at_end: Option<Census>,
    /// With the agent on CUDA, on a leak: the snapshot pickle written beside the report.
    pub snapshot_file: Option<String>,
    #[serde(skip)]
    pub snapshot: Option<Vec<u8>>,
    pub notes: Vec<String>,
    /// Every look, for another analysis.
    pub points: Vec<Point>,
    /// What the judgement read and what the report says beside it: `evidence.json`.
    #[serde(skip)]
    pub recording: Option<WatchRecording>,
}

/// Seconds of looks that may fail in a row before the watch says the service is gone.
const GONE_AFTER_LOOKS: usize = 60;

impl WatchCommand {
    fn counter(&self) -> Result<Counter> {
        Ok(
            match (&self.agent, &self.metrics, &self.requests_series) {
                (Some(_), Some(_), _) => bail!("give --agent or --metrics as the request count, not both"),
                (Some(base), None, None) => Counter::Agent(base.trim_end_matches('/').to_string()),
                (Some(_), None, Some(_)) => bail!("--requests-series names a counter in --metrics: give --metrics URL (or the agent alone)"),
                (None, Some(url), Some(series)) => Counter::Metrics {
                    url: url.clone(),
                    series: series.clone(),
                },
                (None, Some(_), None) => bail!("--metrics needs the counter of requests to read: --requests-series http_requests_total"),
                (None, None, _) => bail!("the watch judges bytes per request, so it needs the service's own request count: give --agent BASE (leaklab's agent in the service) or --metrics URL --requests-series NAME"),
            },
        )
    }

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
        if !self.series.is_empty() && self.metrics.is_none() {
            bail!("--series reads memory gauges from a metrics endpoint: give --metrics URL too");
        }
        if signals.is_empty() && self.agent.is_none() && self.series.is_empty() {
            bail!("no memory to watch: give --pid, --cgroup, --series (with --metrics), or --agent (its figures)");
        }
        Ok(signals)
    }
}

/// `leaklab watch`: checks the flags, opens the sources, and watches on its own runtime.
pub fn run(cmd: WatchCommand) -> Result<WatchReport> {
    let budget = leaklab_scan::command::budget(cmd.rate, cmd.budget, cmd.fail_if_oom_within)?;
    if let Some(interval) = cmd.interval {
        if interval < Duration::from_millis(10) {
            bail!("--interval must be 10ms or more");
        }
        if cmd.duration < interval {
            bail!("--duration must be at least one --interval");
        }
    }
    let counter = cmd.counter()?;
    let signals = cmd.signals()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let client = cmd.http.build()?;
    let sampler = Sampler {
        client,
        counter,
        signals,
        gauges: cmd.series.clone(),
        kinds: BTreeMap::new(),
        collector: None,
        agents: BTreeMap::new(),
    };
    runtime.block_on(watch(&cmd, sampler, budget))
}

/// The capacity of each kind of memory: the user's, else what a signal knows, else the
/// machine's memory for host series.
fn capacities(cmd: &WatchCommand, signals: &[Signal]) -> BTreeMap<&'static str, Option<u64>> {
    let known = |k: Kind| {
        signals
            .iter()
            .filter_map(Signal::capacity)
            .find(|(kk, _)| *kk == k)
            .map(|(_, c)| c)
    };
    BTreeMap::from([
        (
            "host",
            cmd.capacity
                .or_else(|| known(Kind::Host).or_else(leaklab_proc::mem_total)),
        ),
        ("gpu", cmd.capacity.or_else(|| known(Kind::Gpu))),
        ("other", cmd.capacity),
    ])
}

fn class(kind: Kind) -> &'static str {
    match kind {
        Kind::Host | Kind::CpuTensors => "host",
        Kind::Gpu | Kind::TorchAllocated | Kind::TorchReserved => "gpu",
        Kind::Other => "other",
    }
}

/// Each series' capacity, by its kind's.
fn capacity_of(
    kinds: &BTreeMap<String, Kind>,
    capacity: &BTreeMap<&'static str, Option<u64>>,
) -> BTreeMap<String, u64> {
    kinds
        .iter()
        .filter_map(|(name, k)| Some((name.clone(), capacity.get(class(*k)).copied().flatten()?)))
        .collect()
}

/// What the looks say of the current run, for the next interval ([`cadence`]).
fn seen(points: &[Point], warmup: u64) -> cadence::Seen {
    let runs = looks::runs(points);
    let Some(run) = runs.last() else {
        return cadence::Seen {
            requests: 0,
            seconds: 0.0,
            judged_looks: 0,
        };
    };
    let (first, last) = (&run.points[0], &run.points[run.points.len() - 1]);
    let mut counts: Vec<u64> = run
        .points
        .iter()
        .map(|p| p.answered - first.answered)
        .filter(|&x| x >= warmup)
        .collect();
    counts.dedup();
    cadence::Seen {
        requests: last.answered - first.answered,
        seconds: last.t - first.t,
        judged_looks: counts.len(),
    }
}

/// The live line: requests seen, the deciding series' slope and bound, time to OOM, the verdict.
fn live_line(runs: &[RunResult], missed: usize) -> String {
    let Some(run) = runs.last() else {
        return "no look yet".into();
    };
    let mut parts = vec![format!(
        "run {}: {} requests ({:.1}/s)",
        run.index, run.requests, run.requests_per_second
    )];
    let deciding = run
        .series
        .iter()
        .find(|s| s.ops.is_some_and(|o| o.fails()))
        .or_else(|| run.series.iter().find(|s| s.judgement.is_some()));
    match deciding.and_then(|s| s.judgement.as_ref().map(|j| (s, j))) {
        Some((s, j)) => {
            parts.push(format!(
                "{} {} {}/request [{} .. {}]",
                s.series,
                j.verdict,
                human_bytes(j.slope.bytes_per_request),
                human_bytes(j.slope.low),
                human_bytes(j.slope.high)
            ));
            if let Some(t) = s.seconds_to_oom {
                parts.push(format!("OOM in {}", human_duration(t)));
            }
        }
        None => parts.push("too few requests to judge yet".into()),
    }
    if let Some(f) = run.idle.iter().find(|f| f.fails()) {
        if let Some((rate, _, _)) = f.bytes_per_hour {
            parts.push(format!("idle growth {}/h", human_bytes(rate)));
        }
    }
    if runs.len() > 1 {
        parts.push(format!("{} restarts", runs.len() - 1));
    }
    if missed > 0 {
        parts.push(format!("{missed} looks missed"));
    }
    let so_far = leaklab_judge::watch::outcome(runs);
    parts.push(format!("so far: {}", so_far.answer()));
    parts.join(" | ")
}

/// Resolves on Ctrl-C or SIGTERM (a pod being stopped).
async fn interrupted() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = match signal(SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}

async fn watch(
    cmd: &WatchCommand,
    mut sampler: Sampler,
    budget: Option<Budget>,
) -> Result<WatchReport> {
    let target = match &sampler.counter {
        Counter::Agent(base) => base.clone(),
        Counter::Metrics { url, .. } => url.clone(),
    };
    let mut notes = Vec::new();
    let mut cadence = cadence::Cadence::plan(cmd.interval, cmd.duration);
    if let Some(never) = cadence.cannot_judge(cmd.duration) {
        eprintln!("leaklab watch: {never}.");
        notes.push(never);
    }
    // With the agent, the census at the start, before the first look: what it costs the service
    // (its walk's memory, the allocator keeps) is then in every look, not a step among them.
    let start_census = match &sampler.counter {
        Counter::Agent(base) => match leaklab_scan::agent::fetch(&sampler.client, base).await {
            Ok(c) => Some(c),
            Err(e) => {
                notes.push(format!("no census at the start, so a leak's holders are the largest at the end, not those that grew: {e:#}"));
                None
            }
        },
        Counter::Metrics { .. } => None,
    };
    // Each worker that serves an agent of its own (registered in the workers folder the agent
    // shares): its census at the start too, through its own agent, to compare with its own at
    // the end (the server's port reaches whichever worker takes the connection).
    let mut start_workers = BTreeMap::new();
    if let Counter::Agent(base) = &sampler.counter {
        if let Ok(stats) = leaklab_scan::agent::stats(&sampler.client, base).await {
            for (pid, url) in leaklab_judge::agent::registered(stats.workers.as_ref()) {
                match leaklab_scan::agent::fetch(&sampler.client, &url).await {
                    Ok(c) => {
                        start_workers.insert(pid, (url, c));
                    }
                    Err(e) => notes.push(format!(
                        "no census at the start from process {pid}'s own agent at {url}: {e:#}"
                    )),
                }
            }
        }
    }
    // The first look must succeed: a wrong address, a refused token or a bad PID is said now.
    let started = Instant::now();
    let (first, tree) = sampler
        .look(0.0, &mut notes)
        .await
        .context("the first look failed, so nothing can be watched")?;
    if first.memory.is_empty() {
        bail!("the first look read no memory series");
    }
    // Said on stderr whatever the output: the watch has begun looking.
    eprintln!(
        "leaklab watch: the first look is taken; a look every {}{} for {} at the most{}",
        report::interval(cadence.interval().as_secs_f64()),
        match cadence {
            cadence::Cadence::Chosen(_) => " (chosen from the duration, and then the traffic)",
            cadence::Cadence::Given(_) => "",
        },
        human_duration(cmd.duration.as_secs_f64()),
        start_census.as_ref().map_or(String::new(), |c| format!(
            " (the census at the start: {} holders, {:.2} s)",
            c.holders.len(),
            c.seconds
        ))
    );
    let capacity = capacities(cmd, &sampler.signals);
    let mut evidence = WatchEvidence::new(cmd.warmup);
    let mut trees = vec![tree];
    evidence.points.push(first);
    let bar = progress(cmd.quiet, cmd.duration);
    // The next look's time: a look that ran late pushes the next one back (no burst of looks).
    let mut next = tokio::time::Instant::now() + cadence.interval();
    let (mut missed, mut failing) = (0usize, 0usize);
    let mut runs = Vec::new();
    let stop_signal = interrupted();
    tokio::pin!(stop_signal);
    let stop = loop {
        tokio::select! {
            _ = &mut stop_signal => break Stop::Interrupted,
            _ = tokio::time::sleep_until(next) => {}
        }
        let t = started.elapsed().as_secs_f64();
        match sampler.look(t, &mut notes).await {
            Ok((p, tree)) => {
                failing = 0;
                evidence.points.push(p);
                trees.push(tree);
            }
            Err(e) => {
                missed += 1;
                failing += 1;
                let note = format!("a look failed ({e:#}); the watch goes on");
                if notes.len() < 20
                    && !notes
                        .iter()
                        .any(|n| n.starts_with(&note[..note.len().min(40)]))
                {
                    notes.push(format!("at {t:.0} s: {note}"));
                }
                if failing >= GONE_AFTER_LOOKS {
                    break Stop::Gone;
                }
            }
        }
        evidence.kinds.clone_from(&sampler.kinds);
        evidence.capacity = capacity_of(&evidence.kinds, &capacity);
        runs = evidence.runs(budget);
        let left = cmd.duration.saturating_sub(started.elapsed());
        cadence = cadence.next(left, cmd.warmup, seen(&evidence.points, cmd.warmup));
        next = (next + cadence.interval()).max(tokio::time::Instant::now());
        bar.set_position(started.elapsed().as_secs().min(cmd.duration.as_secs()));
        bar.set_message(live_line(&runs, missed));
        if cmd.until_confident {
            if let Some(run) = runs.last() {
                if run.confident() && run.requests >= cmd.warmup + cmd.min_requests {
                    break Stop::Confident;
                }
            }
        }
        if started.elapsed() >= cmd.duration {
            break Stop::Duration;
        }
    };
    bar.finish_and_clear();
    let seconds = started.elapsed().as_secs_f64();
    evidence.kinds.clone_from(&sampler.kinds);
    evidence.capacity = capacity_of(&evidence.kinds, &capacity);
    if runs.is_empty() {
        runs = evidence.runs(budget);
    }
    // What the judgement reads of the tree: each look's processes and threads, and their
    // command lines now.
    let readings: Vec<(u64, leaklab_scan::tree::TreeReading)> = trees
        .iter()
        .flatten()
        .map(|(_, r)| (0, r.clone()))
        .collect();
    evidence.commands = leaklab_scan::tree::commands(&readings);
    evidence.trees = trees
        .into_iter()
        .map(|t| t.map(|(root, r)| (root, r.look())))
        .collect();
    evidence.collector = sampler.collector.clone();
    evidence.agents = sampler.agents.clone();
    // On a leak, with the agent: who holds it now against the start, and on CUDA the snapshot.
    let mut snapshot = None;
    if let (Outcome::Fail, Counter::Agent(base)) =
        (leaklab_judge::watch::outcome(&runs), &sampler.counter)
    {
        match leaklab_scan::agent::fetch(&sampler.client, base).await {
            Ok(end) => {
                // Seconds between the two censuses, by the service's clock.
                evidence.census_seconds = start_census
                    .as_ref()
                    .map_or(0.0, |s| end.taken_at - s.taken_at);
                match compare(start_census.as_ref(), &end, &evidence.points) {
                    Ok(d) => evidence.census = Some(d),
                    Err(why) => {
                        notes.push(why);
                        evidence.census_at_end = Some(end);
                    }
                }
            }
            Err(e) => notes.push(format!(
                "no census from the agent at the end, so no holder named: {e:#}"
            )),
        }
        for (pid, (url, start)) in &start_workers {
            let end = leaklab_scan::agent::fetch(&sampler.client, url).await;
            match end
                .map_err(|e| format!("{e:#}"))
                .and_then(|end| compare(Some(start), &end, &evidence.points))
            {
                Ok(d) => {
                    evidence.worker_censuses.insert(*pid, d);
                }
                Err(why) => notes.push(format!(
                    "no census difference from process {pid}'s own agent at {url}: {why}"
                )),
            }
        }
        snapshot = cuda_snapshot(&sampler.client, base, &mut notes).await;
    }
    let mut report = WatchRecording {
        evidence,
        target,
        stop,
        seconds,
        interval_seconds: cadence.interval().as_secs_f64(),
        missed_looks: missed,
        budget,
        notes,
        snapshot_file: snapshot.as_ref().map(|_| "snapshot.pickle".to_string()),
    }
    .judged();
    report.snapshot = snapshot;
    Ok(report)
}

/// The holders that grew between the census at the start and the one at the end, over the
/// requests answered between the first look and the last; or why they cannot be compared.
fn compare(
    start: Option<&Census>,
    end: &Census,
    points: &[Point],
) -> std::result::Result<CensusDiff, String> {
    let Some(start) = start else {
        return Err("no census at the start to compare with: the holders named are the largest at the end, not those that grew".into());
    };
    if start.pid != end.pid {
        return Err(format!("the census at the end reached process {}, the one at the start process {} (a restart, or another worker): the holders named are the largest at the end, not those that grew", end.pid, start.pid));
    }
    let answered = |p: Option<&Point>| p.map_or(0, |p| p.answered);
    let steps = answered(points.last()).saturating_sub(answered(points.first()));
    Ok(leaklab_scan::agent::diff(start, end, steps))
}

/// The agent's CUDA snapshot, where the service uses CUDA (409 otherwise, said as a note).
async fn cuda_snapshot(
    client: &reqwest::Client,
    base: &str,
    notes: &mut Vec<String>,
) -> Option<Vec<u8>> {
    let url = format!("{base}/snapshot");
    let response = match client
        .get(&url)
        .timeout(Duration::from_secs(120))
        .send()
        .await
    {
        Ok(r) => r,
        Err(e) => {
            notes.push(format!(
                "no CUDA snapshot: {}",
                leaklab_client::describe(&e)
            ));
            return None;
        }
    };
    let status = response.status();
    let body = response.bytes().await.ok()?.to_vec();
    if status == reqwest::StatusCode::CONFLICT {
        return None; // no CUDA in the service: the census alone names the holders
    }
    if !status.is_success() {
        notes.push(format!("no CUDA snapshot: {url} answered {status}"));
        return None;
    }
    Some(body)
}

fn progress(quiet: bool, duration: Duration) -> indicatif::ProgressBar {
    if quiet {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::with_draw_target(
        Some(duration.as_secs().max(1)),
        indicatif::ProgressDrawTarget::stderr(),
    );
    bar.set_style(
        indicatif::ProgressStyle::with_template("watch [{bar:20}] {pos}/{len} s {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix("watch");
    bar
}
