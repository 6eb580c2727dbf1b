//! `leaklab scan`: a leak verdict for any running HTTP service, from outside.
//!
//! It drives load at a URL the user names ([`load`]), samples the service's memory after every
//! response from whatever it can see ([`signals`]: the process tree, the container's cgroup,
//! the GPU through NVML, the service's own Prometheus gauges), judges each series with the
//! noisy-signal detector (`leaklab_detect::noisy`: the floor, the noise estimated from the
//! series, leak versus plateau on the tail), and answers with a time to OOM against a budget
//! ([`verdict`]) and which memory grows. Exit codes: 0 pass, 1 fail, 2 could not judge.
//!
//! No libtorch: it installs on the box that runs the leaking service in a minute.

pub mod agent;
pub mod command;
pub mod judge;
pub mod load;
pub mod recording;
pub mod report;
pub mod signals;
pub mod tree;

use anyhow::{bail, Context, Result};
use leaklab_detect::Sample;
use leaklab_judge::evidence::{self, Evidence};
pub use leaklab_judge::{diagnosis, verdict, SeriesResult};
use serde::{Deserialize, Serialize};
use signals::{Kind, Signal};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use verdict::{Budget, Ops};

pub use command::{run, ScanCommand};

/// What to send, and where (headers and credentials travel with the client: [`ScanOptions::http`]).
pub struct Target {
    pub url: String,
    pub method: reqwest::Method,
    /// The bodies to cycle through (empty: no body).
    pub bodies: Vec<Vec<u8>>,
    /// Nudge every JSON number per request with this seed.
    pub vary: Option<u64>,
    /// The content type the scan sends where no `--header` sets one: `application/json` for
    /// JSON bodies ([`load::content_type`]), as curl's `--json` and every HTTP library's `json=`
    /// do; web frameworks refuse a JSON body without it (FastAPI 422, axum 415).
    pub content_type: Option<&'static str>,
}

/// The most of an error answer's body kept for the report: enough for a framework's message.
const ERROR_BODY_BYTES: usize = 300;

/// One answer: its status, and the start of its body when it is not a success.
struct Answer {
    status: u16,
    error_body: Option<Vec<u8>>,
}

impl Target {
    /// Sends request `index` and reads the whole answer (the service's work for a request is
    /// done only once it is sent).
    async fn send(&self, client: &reqwest::Client, index: u64) -> Result<Answer> {
        let body = load::body(&self.bodies, index, self.vary)?;
        let mut request = client.request(self.method.clone(), &self.url).body(body);
        if let Some(content_type) = self.content_type {
            request = request.header(reqwest::header::CONTENT_TYPE, content_type);
        }
        let response = request.send().await?;
        let status = response.status().as_u16();
        let body = response.bytes().await?;
        let error_body = (!(200..300).contains(&status))
            .then(|| body[..body.len().min(ERROR_BODY_BYTES)].to_vec());
        Ok(Answer { status, error_body })
    }

    /// The note on the first answer that was not a success: what the service said, cut short,
    /// and what usually causes that status.
    fn error_note(&self, status: u16, body: &[u8], headers: &[(String, String)]) -> String {
        let said = String::from_utf8_lossy(body)
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        let cut = if body.len() >= ERROR_BODY_BYTES {
            " …"
        } else {
            ""
        };
        let said = if said.is_empty() {
            "an empty body".to_string()
        } else {
            format!("`{said}{cut}`")
        };
        let sent = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
            .map(|(_, v)| v.as_str())
            .or(self.content_type);
        let sent = sent.map_or("no content type".to_string(), |c| {
            format!("content type {c}")
        });
        let hint = match status {
            422 => format!(": the service could not read the body as the endpoint expects: check its shape (the fields and types the endpoint declares) and its content type ({sent} was sent; --header 'content-type: …' sets another)"),
            415 => format!(": the service refuses the body's content type ({sent} was sent): give the one it expects with --header 'content-type: …'"),
            400 => ": the service refused the request: check the body against what the endpoint expects".to_string(),
            404 => ": no route at this URL: check its path".to_string(),
            405 => format!(": the route does not take {}: check the URL and --method (POST unless given)", self.method),
            _ => String::new(),
        };
        let name = reqwest::StatusCode::from_u16(status)
            .ok()
            .and_then(|s| s.canonical_reason())
            .map_or(String::new(), |r| format!(" {r}"));
        format!("the first error answer was HTTP {status}{name}, with {said}{hint}")
    }
}

/// Everything a scan needs, as plain data (the binary fills it from flags).
pub struct ScanOptions {
    pub target: Arc<Target>,
    pub warmup: usize,
    pub requests: usize,
    /// With `until_confident`: keep sending, in steps of half `requests`, up to this many.
    pub max_requests: usize,
    pub until_confident: bool,
    pub concurrency: usize,
    /// Requests a second at the most: each request starts on the tick of a steady clock, so
    /// memory that grows per request grows at a steady rate over time too.
    pub pace: Option<f64>,
    /// Trust, credentials, headers and the request timeout, for every request the scan sends
    /// to the service (the target, its metrics, its snapshot).
    pub http: leaklab_client::ClientOptions,
    /// Stop the whole scan after this long, keeping what was measured.
    pub time_limit: Duration,
    /// Stop once more than this share of the answers (after 20) are not 2xx.
    pub max_error_ratio: f64,
    pub signals: Vec<Signal>,
    /// Overrides every series' capacity.
    pub capacity: Option<u64>,
    /// `None`: no budget, so any leak the detector proves fails (`leaklab_detect::budget`).
    pub budget: Option<Budget>,
    pub quiet: bool,
    /// A memory snapshot endpoint of the service (PyTorch's pickle, a leaklab service's
    /// `/debug/memory/snapshot`): fetched after the judged requests and again a quarter as many
    /// requests later, and the difference named by line in the report.
    pub snapshot_url: Option<String>,
    /// The base of the agent's routes inside a Python service (`…/debug/leaklab`): its tensor
    /// census, taken as the snapshot is, names the holders that grew, and, where the service
    /// uses CUDA and no `snapshot_url` is given, its `/snapshot` is the snapshot.
    pub agent_url: Option<String>,
    /// With the agent: ask its trim probe (`POST trim`, opt-in by the service's owner) what the
    /// collector frees and what `malloc_trim(0)` then returns, after the looks inside.
    pub trim: bool,
    /// With the agent (its trim probe allowed): a full collection and `malloc_trim(0)` before
    /// the warm-up and after the judged requests, each series read after each (`--collect`).
    /// Opt-in: the first disturbs what follows (memory a trim returns is faulted back in, which
    /// the zoo's dataloader_cow twin read as +7.3 kB a request in 2 full runs of 6).
    pub collect: bool,
    /// With the agent: its native allocation trace (`POST native`, opt-in by the service's
    /// owner, memray) over a window of new requests after the looks inside.
    pub native: bool,
    /// With the agent: its Python trace (`POST pytrace`, opt-in by the service's owner,
    /// tracemalloc) over a window of new requests after the looks inside: Python objects that
    /// hold no tensor.
    pub python_trace: bool,
}

impl ScanOptions {
    /// The process the scan was given (`--pid`), the root of the tree it reads.
    fn pid(&self) -> Option<u32> {
        self.signals.iter().find_map(|s| match s {
            Signal::Process { pid } => Some(*pid),
            _ => None,
        })
    }
}

pub use leaklab_report::Outcome;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScanReport {
    pub url: String,
    pub outcome: Outcome,
    /// The one sentence: which memory grows, and the runbook step.
    pub diagnosis: String,
    pub requests_sent: usize,
    pub warmup: usize,
    /// Requests sent between the two looks inside (census, snapshot), after the judged ones and
    /// not judged.
    #[serde(default)]
    pub looked_requests: usize,
    pub errors: usize,
    /// Status codes other than 2xx, and transport errors, with their counts.
    pub error_kinds: BTreeMap<String, usize>,
    pub seconds: f64,
    pub requests_per_second_measured: f64,
    /// `None`: no budget, so any leak proven fails; times to OOM are at the measured rate.
    pub budget: Option<Budget>,
    pub series: Vec<SeriesResult>,
    /// With a snapshot endpoint: what the judged requests left live, by allocating stack.
    #[serde(default)]
    pub who_holds: Option<leaklab_snapshot::Difference>,
    /// With the agent: the holders whose tensors grew between its two censuses.
    #[serde(default)]
    pub census: Option<agent::CensusDiff>,
    /// Why the scan stopped early, or a signal was dropped: said plainly, kept in the report.
    pub notes: Vec<String>,
    /// The request at which the target began to fail, where the scan stopped for its failures
    /// (errors past `--max-error-ratio`, or the process gone): the series are judged on the
    /// requests answered before it, and only a leak proven there gives a verdict.
    #[serde(default)]
    pub failing_from: Option<u64>,
    /// The diagnosis beyond the slope: the axis, the owner, the mechanism and the fix, and the
    /// process state behind them (their fields sit at the JSON's top level).
    #[serde(default, flatten)]
    pub explained: Explained,
    /// Everything the judgement read, written beside the report as `evidence.json`
    /// (`leaklab judge --evidence` re-judges it).
    #[serde(skip)]
    pub recording: Option<recording::Recording>,
}

/// What the scan measured beyond the slope ([`diagnosis`]): each part absent where the scan
/// could not measure it (no growing series, no process tree, no agent, a probe not asked).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Explained {
    #[serde(default)]
    pub axis: Option<diagnosis::AxisReading>,
    #[serde(default)]
    pub owner: Option<diagnosis::OwnerReading>,
    /// The agent's collector state (its `/stats`).
    #[serde(default)]
    pub collector: Option<agent::Collector>,
    /// The agent's trim probe, where `--trim` asked for it.
    #[serde(default)]
    pub trim: Option<agent::Trim>,
    /// The agent's native trace, where `--native` asked for it.
    #[serde(default)]
    pub native: Option<agent::Native>,
    /// The agent's Python trace, where `--python-trace` asked for it.
    #[serde(default)]
    pub python_trace: Option<agent::PyTrace>,
    /// With `--trim`: each series right after a full collection before the warm-up and after
    /// the judged requests.
    #[serde(default)]
    pub collected: Option<evidence::Collected>,
}

impl ScanReport {
    /// The series that decides: the first that fails, else the steepest judged one.
    pub fn deciding(&self) -> Option<&SeriesResult> {
        self.series
            .iter()
            .find(|s| s.ops.is_some_and(Ops::fails))
            .or_else(|| {
                self.series
                    .iter()
                    .filter(|s| s.judgement.is_some())
                    .max_by(|a, b| {
                        let slope = |s: &SeriesResult| {
                            s.judgement
                                .as_ref()
                                .map_or(0.0, |j| j.slope.bytes_per_request)
                        };
                        slope(a).total_cmp(&slope(b))
                    })
            })
    }
}

struct Progress {
    bar: leaklab_report::progress::ProgressBar,
    _bars: leaklab_report::progress::Bars,
}

impl Progress {
    fn new(total: usize, quiet: bool) -> Progress {
        let bars = leaklab_report::progress::Bars::new(quiet);
        Progress {
            bar: bars.requests(total, "scan"),
            _bars: bars,
        }
    }
}

/// Capacity for a series of `kind`: the user's, else what a signal knows (cgroup limit, GPU
/// total), else the machine's memory for host series.
fn capacity_for(kind: Kind, options: &ScanOptions) -> Option<u64> {
    if options.capacity.is_some() {
        return options.capacity;
    }
    let known = |k: Kind| {
        options
            .signals
            .iter()
            .filter_map(Signal::capacity)
            .find(|(kk, _)| *kk == k)
            .map(|(_, c)| c)
    };
    match kind {
        Kind::Host | Kind::CpuTensors => known(Kind::Host).or_else(leaklab_proc::mem_total),
        Kind::Gpu | Kind::TorchAllocated | Kind::TorchReserved => known(Kind::Gpu),
        Kind::Other => None,
    }
}

/// Runs the scan. Errors only for a target that cannot be scanned at all (a refused
/// connection on the first request); everything after that ends in a report.
pub async fn scan(options: &ScanOptions) -> Result<ScanReport> {
    if options.signals.is_empty() {
        bail!("no memory signal to watch: give --pid, --cgroup, --gpu or --metrics (see `leaklab scan --help`)");
    }
    let client = options.http.build()?;
    let started = Instant::now();
    let mut state = State::default();
    // Every signal must read once before any load: a bad PID, cgroup or series is said now.
    for signal in &options.signals {
        signal
            .read()
            .await
            .with_context(|| format!("cannot read {}", signal.describe()))?;
    }
    // So is the agent: its cheap /stats route answers before any traffic is sent.
    if let Some(base) = &options.agent_url {
        agent::check(&client, base).await?;
    }
    let first = options.target.send(&client, 0).await;
    match &first {
        Err(e) => bail!(
            "the target {} does not answer: {}",
            options.target.url,
            describe(e)
        ),
        Ok(answer) => {
            let body = answer.error_body.as_deref().unwrap_or_default();
            if let Some(refused) = reqwest::StatusCode::from_u16(answer.status)
                .ok()
                .and_then(|s| leaklab_client::refused(&options.target.url, s, body))
            {
                bail!("{refused}");
            }
        }
    }
    state.settle(0, first);
    state.sample(options, 0).await;
    // With the trim probe: a full collection and malloc_trim(0) before the warm-up, each series
    // read right after, so that the one after the judged requests can say what the requests
    // kept through them (the collector's garbage and the allocator's free memory gone at both
    // ends). Before the warm-up, not after it: the memory a trim returns is faulted back in by
    // the requests after it, which the warm-up absorbs and the judged requests would read as
    // growth (after the warm-up, the zoo's dataloader_cow and shape_cache_capped twins read
    // +8.1 and +13.8 kB a request so).
    if let (true, Some(base)) = (options.collect, &options.agent_url) {
        match agent::trim(&client, base).await {
            Ok(_) => state.collected_start = Some((1, state.levels(options).await)),
            Err(e) => state
                .notes
                .push(format!("no trim probe before the warm-up: {e:#}")),
        }
    }
    let mut target = options.warmup + options.requests;
    let progress = Progress::new(target, options.quiet);
    let mut sent = 1;
    let mut stopped = false;
    while !stopped {
        let stop = drive(
            &client, options, &mut state, &mut sent, target, started, &progress,
        )
        .await;
        if let Some(note) = stop {
            state.notes.push(note);
            stopped = true;
            break;
        }
        if !options.until_confident || target >= options.max_requests {
            break;
        }
        let interim = leaklab_judge::judge_series(
            &state.evidence(options, rate(sent, started)),
            options.budget,
            None,
        );
        if interim.iter().all(|s| s.ops.is_none_or(Ops::confident)) {
            break;
        }
        target = (target + options.requests / 2).min(options.max_requests);
        progress.bar.set_length(target as u64);
        progress.bar.set_message("not yet confident: sending more");
    }
    // The rate of the judged requests: a time to OOM without a budget is at it.
    let measured = rate(sent, started);
    // The axis: where the judged requests were new inputs and memory grew, inputs already seen
    // are sent again (not judged), and the two slopes compared.
    let inputs = inputs_of(&options.target, sent);
    let judged_sent = sent;
    let interim =
        leaklab_judge::judge_series(&state.evidence(options, measured), options.budget, None);
    let growing = leaklab_judge::axis_series(&interim)
        .is_some_and(|(_, j)| j.verdict != leaklab_detect::Verdict::Flat);
    state.phase = Phase::Unjudged;
    if growing && inputs == diagnosis::Inputs::New && !stopped {
        let count = (options.requests / 2).max(MIN_REPEATS);
        let seen = REPEAT_SET.min(sent.saturating_sub(options.warmup)).max(1);
        state.replay = ((sent - seen) as u64..sent as u64).collect();
        state.replay_from = sent as u64;
        state.phase = Phase::Repeats;
        progress.bar.set_length((sent + count) as u64);
        progress.bar.set_message(format!(
            "repeating {seen} inputs already seen (the axis, not judged)"
        ));
        let last = sent + count;
        if let Some(note) = drive(
            &client, options, &mut state, &mut sent, last, started, &progress,
        )
        .await
        {
            state.notes.push(note);
        }
        state.phase = Phase::Unjudged;
        state.replay.clear();
    }
    // The second full collection, before the looks inside: a census walk leaves megabytes in
    // pymalloc's arenas that no collection or trim returns (4.3 MB between collections around
    // the looks, where the requests' garbage kept none), so what the requests kept is read
    // before them.
    let mut collected = None;
    if let (Some((from, start)), Some(base)) = (state.collected_start.take(), &options.agent_url) {
        progress
            .bar
            .set_message("a full collection after the judged requests (--trim)");
        match agent::trim(&client, base).await {
            Ok(_) => {
                collected = Some(evidence::Collected {
                    from,
                    to: sent as u64,
                    start,
                    end: state.levels(options).await,
                })
            }
            Err(e) => state
                .notes
                .push(format!("no trim probe after the judged requests: {e:#}")),
        }
    }
    // Who holds it: two looks inside (census, snapshot) around a further quarter of the judged
    // requests, after the judged ones. Not around the judged requests themselves: a look costs
    // the service memory of its own (a census of 200k objects, a pickled snapshot: megabytes),
    // which the allocator keeps once freed, and a leak then refills it unseen from outside (a
    // 7 kB-a-request leak judged flat over 600 requests after a census, measured on the README's
    // example). The looks come after the warm-up all the same, so a cache that filled is not kept.
    let mut looked_requests = 0;
    // The workers that serve an agent of their own, from the agent the scan was given: their
    // censuses are taken at the same looks.
    let mut agents = BTreeMap::new();
    if let Some(base) = &options.agent_url {
        if let Ok(stats) = agent::stats(&client, base).await {
            agents = agent::registered(stats.workers.as_ref());
        }
    }
    // Not the agent the scan was given, where it registered itself too: its census is taken.
    let others: BTreeMap<u32, String> = agents
        .iter()
        .filter(|(_, url)| options.agent_url.as_deref() != Some(url.as_str()))
        .map(|(pid, url)| (*pid, url.clone()))
        .collect();
    let mut worker_censuses = BTreeMap::new();
    let (who_holds, census) = if options.snapshot_url.is_some() || options.agent_url.is_some() {
        let last = sent + (options.requests / 4).max(20);
        let before = look(options, &client, sent as u64, &others, &mut state.notes).await;
        progress.bar.set_length(last as u64);
        progress
            .bar
            .set_message("between the two looks inside (not judged)");
        if let Some(note) = drive(
            &client, options, &mut state, &mut sent, last, started, &progress,
        )
        .await
        {
            state.notes.push(note);
        }
        let after = look(options, &client, sent as u64, &others, &mut state.notes).await;
        looked_requests = (after.at - before.at) as usize;
        for (pid, b) in &before.workers {
            if let Some(a) = after.workers.get(pid) {
                worker_censuses.insert(*pid, agent::diff(b, a, after.at - before.at));
            }
        }
        let snapshots = before.snapshot.zip(after.snapshot).map(|(b, a)| {
            leaklab_snapshot::diff(
                &b,
                &a,
                leaklab_snapshot::View::default(),
                Some((before.at, after.at)),
            )
        });
        // Two censuses of one process only: a server's port hands each connection to one of its
        // workers, and two workers' censuses compared would read one's holders as the other's
        // growth.
        let censuses = match before.census.zip(after.census) {
            Some((b, a)) if b.pid != a.pid => {
                state.notes.push(format!("the two censuses through the agent came from two processes ({} and {}, workers of one server): not compared; each process that registered an agent of its own in the workers folder is looked inside through it", b.pid, a.pid));
                None
            }
            Some((b, a)) => Some(agent::diff(&b, &a, after.at - before.at)),
            None => None,
        };
        (snapshots, censuses)
    } else {
        (None, None)
    };
    progress.bar.finish_and_clear();
    if let Some((status, body)) = &state.first_error {
        state.notes.push(
            options
                .target
                .error_note(*status, body, &options.http.headers),
        );
    }
    let mut explained = Explained {
        collected: collected.clone(),
        ..Explained::default()
    };
    if let Some(base) = &options.agent_url {
        match agent::stats(&client, base).await {
            Ok(stats) => {
                explained.collector = stats.collector;
                agents.extend(agent::registered(stats.workers.as_ref()));
            }
            Err(e) => state
                .notes
                .push(format!("no process state from the agent's /stats: {e:#}")),
        }
        // A trace counts the requests that pass through the process it runs in: where a worker
        // grows and serves an agent of its own, through that one (the server's port hands the
        // scan's connection to whichever worker takes it).
        let base = &growing_worker(&state, options, &agents)
            .map(|(pid, url)| {
                if options.native || options.python_trace || options.trim {
                    state.notes.push(format!("the traces and the trim probe asked of process {pid}, the worker that grows, through its own agent at {url}"));
                }
                url
            })
            .unwrap_or_else(|| base.clone());
        if options.native {
            let (asking, base) = (client.clone(), base.clone());
            let trace = Trace {
                what: "native",
                ask: |requests| async move { agent::native(&asking, &base, requests, 0.0).await },
                note: |t: &agent::Native| t.note.as_ref(),
            };
            explained.native = trace_window(
                options, &client, &mut state, &mut sent, started, &progress, trace,
            )
            .await;
        }
        if options.python_trace {
            let (asking, base) = (client.clone(), base.clone());
            let trace = Trace {
                what: "Python",
                ask: |requests| async move { agent::pytrace(&asking, &base, requests).await },
                note: |t: &agent::PyTrace| t.note.as_ref(),
            };
            explained.python_trace = trace_window(
                options, &client, &mut state, &mut sent, started, &progress, trace,
            )
            .await;
        }
        if options.trim {
            match agent::trim(&client, base).await {
                Ok(t) => explained.trim = Some(t),
                Err(e) => state.notes.push(format!("no trim probe: {e:#}")),
            }
        }
    } else if options.trim || options.native || options.python_trace {
        state.notes.push("--trim, --native and --python-trace ask the agent inside the service: give --agent too (docs/agent.md)".into());
    }
    // Everything measured, handed to the judge as one document, and kept beside the report.
    let pid = options.pid();
    let evidence = Evidence {
        failing_from: state.failing_from(),
        inputs,
        distinct_inputs: match inputs {
            diagnosis::Inputs::New if options.target.vary.is_some() => judged_sent,
            _ => options.target.bodies.len().max(1),
        },
        shapes: load::shapes(&options.target.bodies),
        // The scanned process's libraries: a native mechanism's likely name.
        libraries: pid
            .and_then(|pid| leaklab_proc::libraries(pid).ok())
            .unwrap_or_default(),
        tree: pid.map(|root| evidence::Tree {
            root,
            looks: state.tree.iter().map(|(x, r)| (*x, r.look())).collect(),
            commands: tree::commands(&state.tree),
        }),
        census: census.clone(),
        collector: explained.collector.clone(),
        trim: explained.trim.clone(),
        native: explained.native.clone(),
        python_trace: explained.python_trace.clone(),
        collected,
        agents,
        worker_censuses,
        ..state.evidence(options, measured)
    };
    let recording = recording::Recording {
        evidence,
        url: options.target.url.clone(),
        requests_sent: sent,
        looked_requests,
        errors: state.errors.values().sum(),
        error_kinds: state.errors.clone(),
        seconds: started.elapsed().as_secs_f64(),
        budget: options.budget,
        who_holds,
        notes: state.notes.clone(),
    };
    Ok(recording.judged())
}

/// Requests sent again in the repeat phase, at the least (the detector judges 30 samples).
const MIN_REPEATS: usize = 60;
/// Inputs the repeat phase cycles: the last ones the judged requests sent, so that a cache
/// keyed by input (an LRU, most of all) still holds them.
const REPEAT_SET: usize = 16;

/// What the judged requests sent: each a new input (a body of its own, or `--vary`), one body
/// again and again, or a folder cycled.
fn inputs_of(target: &Target, sent: usize) -> diagnosis::Inputs {
    if target.vary.is_some() || (target.bodies.len() > 1 && target.bodies.len() >= sent) {
        diagnosis::Inputs::New
    } else if target.bodies.len() <= 1 {
        diagnosis::Inputs::Same
    } else {
        diagnosis::Inputs::Cycled
    }
}

/// Requests a trace's window spans: enough for a cache's growth to show, few enough for
/// memray's capture to stay small (200 conv requests: 1.4 s traced, docs/agent.md).
const TRACE_REQUESTS: usize = 100;

/// One of the agent's traces, to ask over a window of requests.
struct Trace<Ask, T> {
    /// "native", "Python": in the progress line and the notes.
    what: &'static str,
    /// Starts it in the service, for a window of this many requests; answers when it closes.
    ask: Ask,
    /// What the trace itself noted (memray missing, tracing already on).
    note: fn(&T) -> Option<&String>,
}

/// The worker that grew most over the judged requests, by the tree's reading, where it grew at
/// all (a leak, or a plateau: two workers sharing the requests may each read as one) and serves
/// an agent of its own (registered in the workers folder): its pid and that agent.
fn growing_worker(
    state: &State,
    options: &ScanOptions,
    agents: &BTreeMap<u32, String>,
) -> Option<(u32, String)> {
    let root = options.pid()?;
    let looks: Vec<_> = state.tree.iter().map(|(x, r)| (*x, r.look())).collect();
    let (processes, _) = leaklab_judge::tree::judge(
        root,
        &looks,
        &tree::commands(&state.tree),
        options.warmup as u64,
        leaklab_judge::thresholds::HOST_NOISE_FLOOR,
    );
    processes
        .iter()
        .filter(|p| {
            !p.root
                && p.verdict
                    .is_some_and(|v| v != leaklab_detect::Verdict::Flat)
        })
        .filter_map(|p| Some((p, agents.get(&p.pid)?)))
        .max_by(|a, b| a.0.bytes_per_request.total_cmp(&b.0.bytes_per_request))
        .map(|(p, url)| (p.pid, url.clone()))
}

/// One of the agent's traces over a window of new requests, driven meanwhile (not judged). A
/// refusal (the owner did not opt in, memray missing) is a note, as is what the trace noted.
async fn trace_window<T, Ask, Asked>(
    options: &ScanOptions,
    client: &reqwest::Client,
    state: &mut State,
    sent: &mut usize,
    started: Instant,
    progress: &Progress,
    trace: Trace<Ask, T>,
) -> Option<T>
where
    Ask: FnOnce(usize) -> Asked,
    Asked: std::future::Future<Output = Result<T>> + Send + 'static,
    T: Send + 'static,
{
    let what = trace.what;
    let requests = TRACE_REQUESTS.min(options.requests.max(20));
    let mut asked = tokio::spawn((trace.ask)(requests));
    // The tracer starts in the service's thread: a moment before the window's requests.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut last = *sent + requests + requests / 4;
    // A worker of several sees its share of the requests only: more are sent until its window
    // has counted its own, up to four windows' worth.
    let most = *sent + 4 * requests;
    progress
        .bar
        .set_message(format!("the agent's {what} trace (not judged)"));
    loop {
        progress.bar.set_length(last as u64);
        if let Some(note) = drive(client, options, state, sent, last, started, progress).await {
            state.notes.push(note);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        if asked.is_finished() || last >= most {
            break;
        }
        last = (last + requests / 2).min(most);
    }
    // The window's requests are sent: its answer is a request like any other from here (the
    // snapshots and their comparison come after the window closes: a heap of kept pyplot
    // figures took past the request timeout, counted from the ask, on 2026-12-07).
    let wait = options.http.timeout.unwrap_or(Duration::from_secs(30));
    let asked = match tokio::time::timeout(wait, &mut asked).await {
        Ok(joined) => joined,
        Err(_) => {
            asked.abort();
            state.notes.push(format!(
                "no {what} trace: no answer within {} after its window's requests were sent",
                humantime::format_duration(wait)
            ));
            return None;
        }
    };
    match asked {
        Ok(Ok(traced)) => {
            if let Some(said) = (trace.note)(&traced) {
                state.notes.push(format!("the {what} trace: {said}"));
            }
            Some(traced)
        }
        Ok(Err(e)) => {
            state.notes.push(format!("no {what} trace: {e:#}"));
            None
        }
        Err(e) => {
            state.notes.push(format!("no {what} trace: {e}"));
            None
        }
    }
}

/// What the service shows of itself at one point of the scan: the agent's census, its memory
/// snapshot.
struct Look {
    at: u64,
    census: Option<agent::Census>,
    snapshot: Option<leaklab_snapshot::Snapshot>,
    /// The census of each other worker that serves an agent of its own, by PID.
    workers: BTreeMap<u32, agent::Census>,
}

/// Takes a [`Look`]; what cannot be had is a note, and the scan goes on without it.
async fn look(
    options: &ScanOptions,
    client: &reqwest::Client,
    at: u64,
    workers: &BTreeMap<u32, String>,
    notes: &mut Vec<String>,
) -> Look {
    // Every worker registered with an agent of its own (leaklab.serve_agent()), besides the one
    // the scan was given: its census, for a growth the tree finds in that process.
    let mut censuses = BTreeMap::new();
    for (pid, base) in workers {
        match agent::fetch(client, base).await {
            Ok(c) if c.pid == *pid => {
                censuses.insert(*pid, c);
            }
            Ok(c) => push_once(notes, format!("the agent registered for process {pid} at {base} answered for process {}: its census is left out", c.pid)),
            Err(e) => push_once(notes, format!("no census from process {pid}'s own agent: {e:#}")),
        }
    }
    let census = match &options.agent_url {
        Some(base) => agent::fetch(client, base)
            .await
            .map_err(|e| {
                push_once(
                    notes,
                    format!("no census from the agent, so no holders named: {e:#}"),
                )
            })
            .ok(),
        None => None,
    };
    let snapshot = match (&options.snapshot_url, &options.agent_url) {
        (Some(url), _) => snapshot(&options.http, url, false, notes).await,
        (None, Some(base)) => {
            snapshot(
                &options.http,
                &format!("{}/snapshot", base.trim_end_matches('/')),
                true,
                notes,
            )
            .await
        }
        (None, None) => None,
    };
    Look {
        at,
        census,
        snapshot,
        workers: censuses,
    }
}

fn push_once(notes: &mut Vec<String>, note: String) {
    if !notes.contains(&note) {
        notes.push(note);
    }
}

/// The service's memory snapshot, decoded; a failure is a note, and the scan goes on without it.
/// `cuda_only`: the agent's route, which answers 409 in a service that uses no CUDA (its census
/// alone then names the holders).
async fn snapshot(
    http: &leaklab_client::ClientOptions,
    url: &str,
    cuda_only: bool,
    notes: &mut Vec<String>,
) -> Option<leaklab_snapshot::Snapshot> {
    let fetched = async {
        // A snapshot of a big service takes a while to pickle: more patience than a request.
        let client = leaklab_client::ClientOptions {
            timeout: Some(Duration::from_secs(120)),
            ..http.clone()
        }
        .build()?;
        let response = client
            .get(url)
            .send()
            .await
            .map_err(|e| anyhow::anyhow!(leaklab_client::describe(&e)))?;
        let status = response.status();
        let body = response.bytes().await?;
        if let Some(refused) = leaklab_client::refused(url, status, &body) {
            bail!("{refused}");
        }
        if cuda_only && status == reqwest::StatusCode::CONFLICT {
            return Ok(None);
        }
        if !status.is_success() {
            bail!(
                "{url} answered {status}: {}",
                String::from_utf8_lossy(&body[..body.len().min(200)]).trim()
            );
        }
        Ok(Some(leaklab_snapshot::from_bytes(&body)?))
    };
    match fetched.await {
        Ok(Some(s)) => Some(s),
        Ok(None) => {
            push_once(notes, "the service uses no CUDA (the agent has no CUDA snapshot): the census alone names the holders".into());
            None
        }
        Err(e) => {
            push_once(
                notes,
                format!("no memory snapshot, so no who-holds-it table by allocating line: {e:#}"),
            );
            None
        }
    }
}

#[derive(Default)]
struct State {
    /// With `--trim`: the request and each series' level right after the full collection
    /// before the warm-up.
    collected_start: Option<(u64, BTreeMap<String, i64>)>,
    /// Series name → kind and samples.
    series: BTreeMap<String, (Kind, Vec<Sample>)>,
    errors: BTreeMap<String, usize>,
    answered: usize,
    dead_signals: Vec<usize>,
    notes: Vec<String>,
    /// Which phase the requests now sent belong to.
    phase: Phase,
    /// The repeat phase's samples, by series.
    repeats: BTreeMap<String, Vec<Sample>>,
    /// The repeat phase's inputs (request indices already sent), cycled from `replay_from`.
    replay: Vec<u64>,
    replay_from: u64,
    /// The process tree process by process, over the judged requests.
    tree: Vec<(u64, tree::TreeReading)>,
    /// The first answer that was not a success: its status and the start of its body.
    first_error: Option<(u16, Vec<u8>)>,
    /// The first request whose answer was an error (a status or a transport error).
    first_error_at: Option<u64>,
    /// Answers counted when the first error answer came (`answered` then).
    answered_at_first_error: Option<usize>,
    /// The last request after which the signals were read, where all of them stopped.
    signals_lost_after: Option<u64>,
    /// The scan stopped because the target failed: too many errors, or nothing left to read.
    target_failed: bool,
}

/// The phases of a scan's requests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Sampled and judged (the warm-up's samples are kept and skipped by the detector).
    #[default]
    Judged,
    /// Inputs already seen, sent again: sampled apart, for the axis.
    Repeats,
    /// Between the looks inside and the probes: not sampled.
    Unjudged,
}

impl State {
    /// The input request `index` sends: itself, or in the repeat phase an earlier one's.
    fn input_of(&self, index: u64) -> u64 {
        match (self.phase, self.replay.is_empty()) {
            (Phase::Repeats, false) => {
                let k = index.saturating_sub(self.replay_from) as usize;
                self.replay[k % self.replay.len()]
            }
            _ => index,
        }
    }

    /// The evidence so far: the series with their capacities, the repeats, the settings; the
    /// tree, the looks inside and the probes are the scan's end's to add.
    fn evidence(&self, options: &ScanOptions, measured: f64) -> Evidence {
        Evidence {
            schema: evidence::SCHEMA.to_string(),
            warmup: options.warmup,
            requests_per_second: measured,
            inputs: diagnosis::Inputs::Same,
            distinct_inputs: 1,
            shapes: None,
            libraries: Vec::new(),
            series: self
                .series
                .iter()
                .map(|(name, (kind, samples))| evidence::Series {
                    name: name.clone(),
                    kind: *kind,
                    samples: samples.clone(),
                    capacity_bytes: capacity_for(*kind, options),
                })
                .collect(),
            repeats: self.repeats.clone(),
            tree: None,
            failing_from: None,
            census: None,
            collector: None,
            trim: None,
            native: None,
            python_trace: None,
            collected: None,
            agents: BTreeMap::new(),
            worker_censuses: BTreeMap::new(),
        }
    }

    /// Each series' level now, from every signal still read.
    async fn levels(&self, options: &ScanOptions) -> BTreeMap<String, i64> {
        let mut out = BTreeMap::new();
        for (i, signal) in options.signals.iter().enumerate() {
            if self.dead_signals.contains(&i) {
                continue;
            }
            if let Ok(readings) = signal.read().await {
                out.extend(readings.into_iter().map(|r| (r.series, r.bytes)));
            }
        }
        out
    }

    /// Where the target began to fail, if the scan stopped for it: its first error answer, or
    /// the request after which nothing could be read any more, whichever came first.
    fn failing_from(&self) -> Option<u64> {
        if !self.target_failed {
            return None;
        }
        let lost = self.signals_lost_after.map(|x| x + 1);
        self.first_error_at.into_iter().chain(lost).min()
    }

    fn settle(&mut self, index: u64, result: Result<Answer>) {
        self.answered += 1;
        if !matches!(
            result,
            Ok(Answer {
                error_body: None,
                ..
            })
        ) {
            self.first_error_at = Some(self.first_error_at.map_or(index, |e| e.min(index)));
            self.answered_at_first_error.get_or_insert(self.answered);
        }
        match result {
            Ok(Answer {
                status,
                error_body: None,
            }) => debug_assert!((200..300).contains(&status)),
            Ok(Answer {
                status,
                error_body: Some(body),
            }) => {
                *self.errors.entry(format!("HTTP {status}")).or_default() += 1;
                self.first_error.get_or_insert((status, body));
            }
            Err(e) => *self.errors.entry(error_kind(&e)).or_default() += 1,
        }
    }

    async fn sample(&mut self, options: &ScanOptions, x: u64) {
        for (i, signal) in options.signals.iter().enumerate() {
            if self.dead_signals.contains(&i) {
                continue;
            }
            // The children's private memory is a walk of their mappings: every fourth judged
            // sample.
            let private = self.phase == Phase::Judged && x.is_multiple_of(4);
            match signal.read_with_tree(private).await {
                Ok((readings, tree)) => {
                    for r in readings {
                        if self.phase == Phase::Repeats {
                            self.repeats.entry(r.series).or_default().push((x, r.bytes));
                            continue;
                        }
                        self.series
                            .entry(r.series)
                            .or_insert_with(|| (r.kind, Vec::new()))
                            .1
                            .push((x, r.bytes));
                    }
                    // The tree process by process, from the read the series came from.
                    if let (Some(reading), Phase::Judged) = (tree, self.phase) {
                        self.tree.push((x, reading));
                    }
                }
                Err(e) => {
                    self.dead_signals.push(i);
                    if self.dead_signals.len() == options.signals.len() {
                        self.signals_lost_after = Some(x);
                    }
                    self.notes.push(format!(
                        "stopped reading {} after request {x}: {e:#}; its samples so far are kept",
                        signal.describe()
                    ));
                }
            }
        }
    }
}

/// A transport failure in the user's words (an untrusted certificate, a refused connection...).
fn describe(e: &anyhow::Error) -> String {
    match e.downcast_ref::<reqwest::Error>() {
        Some(r) => leaklab_client::describe(r),
        None => format!("{e:#}"),
    }
}

fn error_kind(e: &anyhow::Error) -> String {
    match e.downcast_ref::<reqwest::Error>() {
        Some(r) if r.is_timeout() => "timeout".into(),
        Some(r) if leaklab_client::describe(r).contains("certificate") => {
            "TLS certificate not trusted".into()
        }
        Some(r) if r.is_connect() => "connection refused or reset".into(),
        _ => "transport error".into(),
    }
}

/// Sends requests until `target`, sampling after each answer. Returns why it stopped early.
async fn drive(
    client: &reqwest::Client,
    options: &ScanOptions,
    state: &mut State,
    sent: &mut usize,
    target: usize,
    started: Instant,
    progress: &Progress,
) -> Option<String> {
    let permits = Arc::new(tokio::sync::Semaphore::new(options.concurrency.max(1)));
    // A tick late (the service or this machine stalled) is sent as soon as it can be, so the
    // mean rate holds.
    let mut clock = options
        .pace
        .map(|rate| tokio::time::interval(Duration::from_secs_f64(1.0 / rate)));
    let mut tasks = tokio::task::JoinSet::new();
    let mut stop = None;
    while *sent < target || !tasks.is_empty() {
        if stop.is_none() && *sent < target {
            if started.elapsed() > options.time_limit {
                stop = Some(format!(
                    "the time limit ({:?}) ran out after {} requests",
                    options.time_limit, *sent
                ));
                continue;
            }
            let permit = permits
                .clone()
                .acquire_owned()
                .await
                .expect("semaphore open");
            if let Some(clock) = &mut clock {
                clock.tick().await;
            }
            let (client, target, index) = (client.clone(), options.target.clone(), *sent as u64);
            let input = state.input_of(index);
            tasks.spawn(async move {
                let result = target.send(&client, input).await;
                drop(permit);
                (index, result)
            });
            *sent += 1;
            if tasks.len() < options.concurrency.max(1) {
                continue;
            }
        } else if stop.is_some() && tasks.is_empty() {
            break;
        }
        let Some(done) = tasks.join_next().await else {
            break;
        };
        let Ok((index, result)) = done else { continue };
        state.settle(index, result);
        if state.phase != Phase::Unjudged {
            state.sample(options, index).await;
        }
        progress.bar.inc(1);
        let errors: usize = state.errors.values().sum();
        // Failing: more than the ratio of all answers were errors, or of the answers since
        // the first error (a target that began failing part-way and kept failing is failing,
        // however many good answers came before: 180 errors in the last 180 of 420 answers
        // read PASS before this rule, in a fresh clone's CI, 2026-12-07).
        let since = state
            .answered_at_first_error
            .map_or(0, |at| state.answered + 1 - at);
        let failing = |errors: usize, answers: usize| {
            answers >= 20 && errors as f64 > options.max_error_ratio * answers as f64
        };
        if stop.is_none() && (failing(errors, state.answered) || failing(errors, since)) {
            stop = Some(format!("{errors} of {} answers were errors ({:?}): the target is failing; the scan stopped and kept what it measured", state.answered, state.errors));
            state.target_failed = true;
        }
        if stop.is_none() && state.dead_signals.len() == options.signals.len() {
            stop = Some("no signal can be read any more (the process exited?)".into());
            state.target_failed = true;
        }
    }
    stop
}

pub use leaklab_judge::thresholds::HOST_NOISE_FLOOR;

/// Requests a second the scan drove so far: the rate of the time to OOM without a budget.
fn rate(sent: usize, started: Instant) -> f64 {
    sent as f64 / started.elapsed().as_secs_f64().max(1e-9)
}
