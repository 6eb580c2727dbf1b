//! `leaklab`: thin over the library crates, and free of libtorch. Each subcommand is its flags,
//! one library call that returns a report, and `leaklab_report::finish`, which prints it (or
//! its JSON), writes its files and exits with its answer (0 as expected / pass, 1 a problem
//! found, 2 could not judge or bad usage).
//!
//! - `leaklab snapshot explain|diff|trim`: which lines hold the memory, from PyTorch's snapshot
//!   pickles; a small copy of a large one that PyTorch's memory_viz opens.
//! - `leaklab scan URL --pid N`: a leak verdict and a time to OOM for any running HTTP service;
//!   `leaklab scan --prometheus URL --query Q`: the same for every pod of a fleet, from Prometheus.
//! - `leaklab judge`: the verdict on series measured elsewhere (the pytest plugin's).
//! - `leaklab census-diff`: which holders grew between two tensor censuses (the agent's).
//!
//! The lab's own commands (run-lab, soak, bench) are the `leaklab-lab` binary (crates/runner).

use clap::{Args, Parser, Subcommand};
use leaklab_report::{finish, Output};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "leaklab",
    version,
    about = "Reproduce, detect, explain and fix the memory leaks of PyTorch inference services"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// A leak verdict and a time to OOM for a running HTTP service, judged from outside.
    ///
    /// Drives load at the URL, samples the service's memory after every answer (its process,
    /// its cgroup, its GPU, its own gauges) and judges leak, plateau or flat: how fast, which
    /// memory, and when it runs out. With --prometheus, judges every pod's memory series over a
    /// range instead. Exit 0 pass, 1 fail, 2 cannot judge.
    ///
    /// What fails: a leak the scan proves, unless a budget says it lasts. Without --rate there
    /// is no budget: any proven leak fails, and the time to OOM is at the rate the scan drove.
    /// With --rate (the production rate, or --budget seed), a leak fails when it runs out of its
    /// capacity within --fail-if-oom-within at that rate. A fleet's series run at production's
    /// own rate, so its budget is its capacity and --fail-if-oom-within. A series with no
    /// capacity known has no budget.
    #[command(after_help = SCAN_EXAMPLES)]
    Scan(Box<ScanArgs>),
    /// A watch of a service in production: sends no request, judges bytes per request.
    ///
    /// Every --interval it reads the service's own request count (leaklab's agent, or its
    /// Prometheus counter) and its memory (--pid, --cgroup, --gpu, or the agent's figures), for
    /// --duration; judges each run between restarts per request with the scan's detector, and
    /// apart per hour the memory that moves while no request arrives. Ctrl-C, SIGTERM or the
    /// end keeps the report. Exit 0 pass, 1 fail, 2 no verdict yet. The budget as the scan's.
    #[command(after_help = WATCH_EXAMPLES)]
    Watch(Box<WatchArgs>),
    /// Which lines hold the memory, from a memory snapshot pickle (PyTorch's or leaklab's).
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    /// The verdict on series measured elsewhere (the pytest plugin's), by the detector `scan`
    /// uses: a JSON document of samples and censuses in, the outcome and who holds it out.
    /// Exit 0 pass, 1 fail, 2 cannot judge.
    Judge(JudgeArgs),
    /// Which holders of tensors grew between two tensor censuses of one process (the agent's
    /// `GET /debug/leaklab/tensors`, or `leaklab.census.census()`), by the diff `scan --agent`
    /// and the pytest plugin use. A holder reached by another path is the same holder. Exit 0.
    #[command(after_help = CENSUS_DIFF_EXAMPLES)]
    CensusDiff(CensusDiffArgs),
}

const CENSUS_DIFF_EXAMPLES: &str = "Examples:
  curl -s localhost:8000/debug/leaklab/tensors > before.json   # then send 500 requests
  curl -s localhost:8000/debug/leaklab/tensors > after.json
  leaklab census-diff before.json after.json --steps 500";

const SCAN_EXAMPLES: &str = "Examples:
  leaklab scan http://127.0.0.1:8000/predict --body request.json --pid 4242
  leaklab scan http://127.0.0.1:8000/predict --body request.json --pid 4242 --capacity 2GiB --rate 10 --fail-if-oom-within 7d
  leaklab scan https://infer.internal/v1/infer --body req.json --ca-cert ca.pem --bearer-token-file token --metrics https://infer.internal/metrics --series process_resident_memory_bytes
  leaklab scan --prometheus https://prometheus:9090 --basic-auth ops:/run/secrets/prom --query DCGM_FI_DEV_FB_USED --unit MiB --capacity-query 'DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE'";

const WATCH_EXAMPLES: &str = "Examples:
  leaklab watch --agent http://127.0.0.1:8000/debug/leaklab --pid 4242 --interval 5s --duration 2h
  leaklab watch --agent http://127.0.0.1:8000/debug/leaklab --cgroup /sys/fs/cgroup --until-confident --rate 10 --duration 1d
  leaklab watch --metrics http://127.0.0.1:8000/metrics --requests-series http_requests_total --pid 4242";

/// `leaklab watch`'s flags (docs/watch.md).
#[derive(Args)]
struct WatchArgs {
    /// The base of leaklab's agent in the service, e.g. http://127.0.0.1:8000/debug/leaklab:
    /// its request count (summed over workers that share a folder), without --pid or --cgroup
    /// its memory figures, and its tensor census at the start and on a leak at the end (who
    /// holds it).
    #[arg(long, value_name = "BASE", help_heading = "The request count")]
    agent: Option<String>,
    /// Without the agent: the service's Prometheus endpoint, e.g. http://127.0.0.1:8000/metrics...
    #[arg(long, value_name = "URL", help_heading = "The request count")]
    metrics: Option<String>,
    /// ...and its counter of requests there, e.g. http_requests_total (summed over its labels).
    #[arg(long, value_name = "NAME", help_heading = "The request count")]
    requests_series: Option<String>,
    /// Watch this process and its children (RSS, anonymous memory); with --agent, a restarted
    /// service's new process is followed.
    #[arg(long, help_heading = "What to watch")]
    pid: Option<u32>,
    /// Watch this cgroup folder (v1 or v2 memory controller); without --agent or --pid, its
    /// processes are the serving ones, so one replaced inside it is a restart.
    #[arg(long, help_heading = "What to watch")]
    cgroup: Option<PathBuf>,
    /// Watch the GPU memory of --pid through NVML.
    #[arg(long, help_heading = "What to watch")]
    gpu: bool,
    /// Memory gauges to read from --metrics (repeat), e.g. process_resident_memory_bytes.
    #[arg(long = "series", help_heading = "What to watch")]
    series: Vec<String>,
    /// Time between two looks, e.g. 5s (default: chosen from --duration and the traffic, 100ms to 5s, for twice the 30 looks a verdict needs).
    #[arg(long, value_parser = humantime::parse_duration, help_heading = "How long")]
    interval: Option<std::time::Duration>,
    /// How long to watch at the most, e.g. 2h or 3d; Ctrl-C or SIGTERM ends it sooner with the report.
    #[arg(long, default_value = "2h", value_parser = humantime::parse_duration, help_heading = "How long")]
    duration: std::time::Duration,
    /// Requests at the start of each run (after a restart) not judged: caches warming.
    #[arg(long, default_value_t = 50, help_heading = "How long")]
    warmup: u64,
    /// Stop as soon as every verdict is one more looks cannot change (after --min-requests).
    #[arg(long, help_heading = "How long")]
    until_confident: bool,
    /// With --until-confident: requests a run must see after its warm-up first.
    #[arg(long, default_value_t = 600, help_heading = "How long")]
    min_requests: u64,
    /// A request's longest wait (the agent's stats, the metrics, the census at the end), e.g. 30s.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration, help_heading = "How long")]
    timeout: std::time::Duration,
    #[command(flatten, next_help_heading = "Connection: TLS, credentials, headers")]
    http: HttpArgs,
    /// Memory that may be used, e.g. 16GiB (default: the cgroup limit, the GPU total, or the machine's memory).
    #[arg(long, help_heading = "Budget")]
    capacity: Option<bytesize::ByteSize>,
    /// Requests per second in production, e.g. 10: the budget's rate (without it, no budget).
    #[arg(long, value_parser = positive_rate, conflicts_with = "budget", help_heading = "Budget")]
    rate: Option<f64>,
    /// A named budget instead of --rate: `seed`.
    #[arg(long, value_name = "NAME", help_heading = "Budget")]
    budget: Option<leaklab_scan::verdict::Named>,
    /// Fail when memory runs out sooner than this at the budget's rate, e.g. 3d (default 7d).
    #[arg(long, value_parser = humantime::parse_duration, help_heading = "Budget")]
    fail_if_oom_within: Option<std::time::Duration>,
    /// Report folder (report.html, report.md, report.json, plots).
    #[arg(long, default_value = "target/leaklab/watch", help_heading = "Report")]
    out: PathBuf,
    /// Print the report as JSON and nothing else (no live line).
    #[arg(long, help_heading = "Report")]
    json: bool,
}

/// `leaklab watch`: the flags handed to leaklab-watch.
fn watch(a: WatchArgs) -> ExitCode {
    let output = Output::folder(&a.out, a.json);
    let watch = leaklab_watch::WatchCommand {
        agent: a.agent,
        metrics: a.metrics,
        requests_series: a.requests_series,
        series: a.series,
        pid: a.pid,
        cgroup: a.cgroup,
        gpu: a.gpu,
        interval: a.interval,
        duration: a.duration,
        warmup: a.warmup,
        until_confident: a.until_confident,
        min_requests: a.min_requests,
        capacity: a.capacity.map(|c| c.as_u64()),
        rate: a.rate,
        budget: a.budget,
        fail_if_oom_within: a.fail_if_oom_within,
        http: a.http.options(a.timeout),
        quiet: a.json,
    };
    finish("watch", leaklab_watch::run(watch), &output)
}

#[derive(Subcommand)]
enum SnapshotCommand {
    /// Live memory grouped by allocating stack, largest first; with --since, what was
    /// allocated after that point and never freed; and reserved-but-unallocated per segment.
    Explain {
        /// A pickle from torch.cuda.memory._dump_snapshot() or a leaklab service.
        file: PathBuf,
        /// Only the trace after this point: an event index (1200) or seconds after the first event (12.5s).
        #[arg(long)]
        since: Option<leaklab_snapshot::Since>,
        #[command(flatten)]
        view: SnapshotView,
        /// Also write the report into this folder: report.html (open it in a browser), report.md, report.json.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
    /// Blocks live in AFTER and not in BEFORE, grouped by allocating stack.
    Diff {
        before: PathBuf,
        after: PathBuf,
        /// The request counts at the two snapshots, for bytes per request: `--requests 100,600`.
        #[arg(long, value_parser = parse_pair)]
        requests: Option<(u64, u64)>,
        #[command(flatten)]
        view: SnapshotView,
        /// Also write the report into this folder: report.html (open it in a browser), report.md, report.json.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
    /// A small copy of a large snapshot that PyTorch's memory_viz opens: every segment, the
    /// blocks of the top holders (the others merged, totals kept), the trace from --since on.
    Trim {
        /// The snapshot pickle to trim.
        file: PathBuf,
        /// Keep the trace from this point: an event index (1200) or seconds after the first event (12.5s); no trace without it.
        #[arg(long)]
        since: Option<leaklab_snapshot::Since>,
        /// Holders whose blocks are kept, largest first.
        #[arg(long, default_value_t = 10)]
        top: usize,
        /// The small pickle to write (through a temporary file, renamed when complete).
        #[arg(short = 'o', long = "output", value_name = "SMALL.pickle")]
        output: PathBuf,
        /// Group holders with torch internals and the standard library in their stacks.
        #[arg(long)]
        all_frames: bool,
        /// Print JSON (stable field names) instead of the summary.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
struct SnapshotView {
    /// Keep torch internals and the standard library in the stacks.
    #[arg(long)]
    all_frames: bool,
    /// Print each holder's whole stack, not just its first frame in your code.
    #[arg(long)]
    stacks: bool,
    /// Holders to show.
    #[arg(long, default_value_t = 10)]
    top: usize,
    /// Print JSON (stable field names) instead of the table.
    #[arg(long)]
    json: bool,
}

impl SnapshotView {
    fn view(&self) -> leaklab_snapshot::View {
        leaklab_snapshot::View {
            all_frames: self.all_frames,
        }
    }

    /// Printed, and written into `out` when given.
    fn output(&self, out: Option<PathBuf>) -> Output {
        Output {
            json: self.json,
            markdown: out.map(|dir| dir.join("report.md")),
        }
    }
}

#[derive(Args)]
struct ScanArgs {
    /// The endpoint to drive, e.g. http://127.0.0.1:8000/v1/infer (not with --prometheus).
    #[arg(required_unless_present = "prometheus", conflicts_with = "prometheus")]
    url: Option<String>,
    /// Request body: a file, a folder of files (cycled), or - for stdin (repeat the flag to cycle several).
    #[arg(long = "body", help_heading = "Requests")]
    bodies: Vec<String>,
    #[arg(long, default_value = "POST", help_heading = "Requests")]
    method: reqwest::Method,
    /// Nudge every number in the JSON body per request (caches leak on new inputs only), seeded.
    #[arg(long, num_args = 0..=1, default_missing_value = "1", help_heading = "Requests")]
    vary: Option<u64>,
    /// Requests judged, after the warm-up.
    #[arg(long, default_value_t = 600, help_heading = "Requests")]
    requests: usize,
    /// Requests first, not judged (start-up, caches warming).
    #[arg(long, default_value_t = 50, help_heading = "Requests")]
    warmup: usize,
    /// Keep sending, half the requests at a time, until the verdict cannot change, up to --max-requests.
    #[arg(long, help_heading = "Requests")]
    until_confident: bool,
    #[arg(long, default_value_t = 5000, help_heading = "Requests")]
    max_requests: usize,
    #[arg(long, default_value_t = 1, help_heading = "Requests")]
    concurrency: usize,
    /// Send at most this many requests a second, at a steady rate (a shared service, or memory that a Prometheus watches over time), e.g. 20.
    #[arg(long, value_parser = positive_rate, help_heading = "Requests")]
    pace: Option<f64>,
    /// A request's longest wait, e.g. 30s.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration, help_heading = "Requests")]
    timeout: std::time::Duration,
    /// The whole scan's longest run, e.g. 10m; what was measured is kept.
    #[arg(long, default_value = "30m", value_parser = humantime::parse_duration, help_heading = "Requests")]
    time_limit: std::time::Duration,
    /// Stop when more than this share of the answers are errors (of all, or of those since
    /// the first error: a target that began failing part-way and kept failing).
    #[arg(long, default_value_t = 0.5, help_heading = "Requests")]
    max_error_ratio: f64,
    #[command(flatten, next_help_heading = "Connection: TLS, credentials, headers")]
    http: HttpArgs,
    /// Watch this process and its children (RSS, anonymous memory).
    #[arg(long, help_heading = "What to watch")]
    pid: Option<u32>,
    /// Watch this cgroup folder (v1 or v2 memory controller), e.g. /sys/fs/cgroup/memory/mysvc.
    #[arg(long, help_heading = "What to watch")]
    cgroup: Option<PathBuf>,
    /// Watch the GPU memory of --pid through NVML.
    #[arg(long, help_heading = "What to watch")]
    gpu: bool,
    /// Scrape this Prometheus endpoint after each request...
    #[arg(long, help_heading = "What to watch")]
    metrics: Option<String>,
    /// ...for these series (repeat), e.g. process_resident_memory_bytes.
    #[arg(long = "series", help_heading = "What to watch")]
    series: Vec<String>,
    /// The service's memory snapshot endpoint (a PyTorch snapshot pickle), fetched after the
    /// warm-up and at the end: the report names the lines that hold what accumulated.
    #[arg(long, help_heading = "What to watch")]
    snapshot: Option<String>,
    /// The base of leaklab's agent in the service (`leaklab.asgi.LeaklabDebug`), e.g.
    /// http://127.0.0.1:8000/debug/leaklab: its tensor census after the warm-up and at the end
    /// names the objects that keep the memory (and, on CUDA, its snapshot the lines).
    #[arg(long, value_name = "BASE", help_heading = "What to watch")]
    agent: Option<String>,
    /// With --agent: ask its trim probe (opt-in, `allow_trim=True`) what gc.collect() frees and
    /// what malloc_trim(0) then returns, after the looks inside.
    #[arg(long, requires = "agent", help_heading = "What to watch")]
    trim: bool,
    /// With --agent (its trim probe allowed): a full collection and malloc_trim(0) before the
    /// warm-up and after the judged requests, each series read after each: a growth they give
    /// back is the collector's garbage and passes (docs/scan.md, the axis `garbage`).
    #[arg(long, requires = "agent", help_heading = "What to watch")]
    collect: bool,
    /// With --agent: its native allocation trace (opt-in, `native_max_seconds`, memray) over a
    /// window of requests after the looks inside: where the native memory was allocated.
    #[arg(long, requires = "agent", help_heading = "What to watch")]
    native: bool,
    /// With --agent: its Python trace (opt-in, `python_trace_max_seconds`, tracemalloc) over a
    /// window of requests after the looks inside: Python objects kept that hold no tensor (a
    /// metric's series per user, per-user state), named by the line that allocated them.
    #[arg(long, requires = "agent", help_heading = "What to watch")]
    python_trace: bool,
    /// Memory that may be used, e.g. 16GiB (default: the cgroup limit, the GPU total, or the
    /// machine's memory; with --prometheus, --capacity-query).
    #[arg(long, help_heading = "Budget")]
    capacity: Option<bytesize::ByteSize>,
    /// Requests per second in production, e.g. 10: the budget's rate (without it, no budget).
    #[arg(long, value_parser = positive_rate, conflicts_with_all = ["budget", "prometheus"], help_heading = "Budget")]
    rate: Option<f64>,
    /// A named budget instead of --rate: `seed`, the lab's reference scenario (one request every 32 s, 7 days).
    #[arg(
        long,
        value_name = "NAME",
        conflicts_with = "prometheus",
        help_heading = "Budget"
    )]
    budget: Option<leaklab_scan::verdict::Named>,
    /// Fail when memory runs out sooner than this at the budget's rate, e.g. 3d (default 7d).
    #[arg(long, value_parser = humantime::parse_duration, help_heading = "Budget")]
    fail_if_oom_within: Option<std::time::Duration>,
    /// Report folder (report.html, report.md, report.json, plots).
    #[arg(long, default_value = "target/leaklab/scan", help_heading = "Report")]
    out: PathBuf,
    /// Print the report as JSON and nothing else.
    #[arg(long, help_heading = "Report")]
    json: bool,
    #[command(
        flatten,
        next_help_heading = "A fleet from Prometheus (instead of a URL)"
    )]
    fleet: FleetArgs,
}

/// How to reach the service (or, with --prometheus, the server): TLS trust and credentials, as
/// Prometheus's own scrape configs name them. Secrets are read from files, never from flags.
#[derive(Args)]
struct HttpArgs {
    /// A header, `Name: value`, sent with every request (repeat).
    #[arg(long = "header", value_parser = parse_header)]
    headers: Vec<(String, String)>,
    /// A file holding a bearer token, sent as `Authorization: Bearer …` (e.g. a Kubernetes
    /// service account token).
    #[arg(long, value_name = "FILE", conflicts_with = "basic_auth")]
    bearer_token_file: Option<PathBuf>,
    /// Basic auth: the user, and a file holding the password.
    #[arg(long, value_name = "USER:PASSWORD_FILE")]
    basic_auth: Option<leaklab_client::BasicAuth>,
    /// A PEM file of CA certificates to trust for https:// (besides the system's and Mozilla's roots).
    #[arg(long, value_name = "FILE")]
    ca_cert: Option<PathBuf>,
}

impl HttpArgs {
    fn options(&self, timeout: std::time::Duration) -> leaklab_client::ClientOptions {
        leaklab_client::ClientOptions {
            headers: self.headers.clone(),
            bearer_token_file: self.bearer_token_file.clone(),
            basic_auth: self.basic_auth.clone(),
            ca_cert: self.ca_cert.clone(),
            timeout: Some(timeout),
        }
    }
}

/// `leaklab scan --prometheus`: the fleet, from the Prometheus server it already runs.
#[derive(Args)]
struct FleetArgs {
    /// A Prometheus server, e.g. http://prometheus:9090: judge every group of --query over --range.
    #[arg(long)]
    prometheus: Option<String>,
    /// The memory series, e.g. DCGM_FI_DEV_FB_USED or container_memory_working_set_bytes{container="server"}.
    #[arg(long, requires = "prometheus")]
    query: Option<String>,
    /// Labels to group by (`sum by (...)`), comma-separated; "" for the series as they come.
    #[arg(long, default_value = "pod", requires = "prometheus")]
    by: String,
    /// How far back, e.g. 12h.
    #[arg(long, default_value = "12h", value_parser = humantime::parse_duration, requires = "prometheus")]
    range: std::time::Duration,
    /// Resolution (default: 2,880 points over the range, never under 15s).
    #[arg(long, value_parser = humantime::parse_duration, requires = "prometheus")]
    step: Option<std::time::Duration>,
    /// The range's end: unix seconds or RFC 3339 (default: now).
    #[arg(long, value_parser = parse_time, requires = "prometheus")]
    end: Option<f64>,
    /// The query's unit: bytes, or MiB (DCGM's framebuffer gauges).
    #[arg(long, default_value = "bytes", requires = "prometheus")]
    unit: Unit,
    /// Each group's capacity, in the query's unit, e.g. DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE.
    #[arg(long, requires = "prometheus", conflicts_with = "capacity")]
    capacity_query: Option<String>,
    /// Each group's requests per second, for bytes per request, e.g. rate(http_requests_total[5m]).
    #[arg(long, requires = "prometheus")]
    rate_query: Option<String>,
    /// The start of each life that began in the range, left unjudged (start-up, load ramping back).
    #[arg(long, default_value = "30m", value_parser = humantime::parse_duration, requires = "prometheus")]
    life_warmup: std::time::Duration,
    /// Groups in the table, most urgent first (--json has them all).
    #[arg(long, default_value_t = 20, requires = "prometheus")]
    top: usize,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Unit {
    Bytes,
    #[value(name = "MiB")]
    Mib,
}

fn parse_time(s: &str) -> Result<f64, String> {
    if let Ok(unix) = s.parse::<f64>() {
        return Ok(unix);
    }
    let t = humantime::parse_rfc3339_weak(s)
        .map_err(|e| format!("`{s}`: give unix seconds or an RFC 3339 time ({e})"))?;
    Ok(t.duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_secs_f64())
}

impl From<Unit> for leaklab_fleet::Unit {
    fn from(unit: Unit) -> leaklab_fleet::Unit {
        match unit {
            Unit::Bytes => leaklab_fleet::Unit::Bytes,
            Unit::Mib => leaklab_fleet::Unit::Mib,
        }
    }
}

fn parse_header(s: &str) -> Result<(String, String), String> {
    leaklab_client::parse_header(s).map_err(|e| e.to_string())
}

/// Requests a second for `--pace`: a steady clock needs a positive, finite period.
fn positive_rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(rate) if (0.001..=1e6).contains(&rate) => Ok(rate),
        _ => Err(format!(
            "`{s}` is not a rate: give requests a second between 0.001 and 1000000, e.g. 20"
        )),
    }
}

/// `leaklab scan`: a URL to drive, or with --prometheus a fleet to read.
fn scan(a: ScanArgs) -> ExitCode {
    let output = Output::folder(&a.out, a.json);
    let f = a.fleet;
    if let Some(prometheus) = f.prometheus {
        let fleet = leaklab_fleet::FleetCommand {
            prometheus,
            query: f.query,
            by: f.by,
            range: f.range,
            step: f.step,
            end: f.end,
            unit: f.unit.into(),
            capacity_query: f.capacity_query,
            capacity: a.capacity.map(|c| c.as_u64()),
            rate_query: f.rate_query,
            life_warmup: f.life_warmup,
            fail_if_oom_within: a
                .fail_if_oom_within
                .unwrap_or(leaklab_scan::command::DEFAULT_WITHIN),
            // Prometheus's range queries over a fleet take longer than a request to a service.
            http: a
                .http
                .options(a.timeout.max(std::time::Duration::from_secs(60))),
            top: f.top,
        };
        return finish("scan", leaklab_fleet::run(fleet), &output);
    }
    let scan = leaklab_scan::ScanCommand {
        url: a.url.unwrap_or_default(),
        bodies: a.bodies,
        method: a.method,
        vary: a.vary,
        requests: a.requests,
        warmup: a.warmup,
        until_confident: a.until_confident,
        max_requests: a.max_requests,
        concurrency: a.concurrency,
        pace: a.pace,
        time_limit: a.time_limit,
        max_error_ratio: a.max_error_ratio,
        http: a.http.options(a.timeout),
        pid: a.pid,
        cgroup: a.cgroup,
        gpu: a.gpu,
        metrics: a.metrics,
        series: a.series,
        snapshot: a.snapshot,
        agent: a.agent,
        capacity: a.capacity.map(|c| c.as_u64()),
        rate: a.rate,
        budget: a.budget,
        fail_if_oom_within: a.fail_if_oom_within,
        quiet: a.json,
        trim: a.trim,
        collect: a.collect,
        native: a.native,
        python_trace: a.python_trace,
    };
    finish("scan", leaklab_scan::run(scan), &output)
}

fn parse_pair(s: &str) -> Result<(u64, u64), String> {
    let (a, b) = s
        .split_once(',')
        .ok_or_else(|| format!("`{s}`: give two request counts, e.g. 100,600"))?;
    let parse = |t: &str| {
        t.trim()
            .parse::<u64>()
            .map_err(|_| format!("`{t}` is not a request count"))
    };
    Ok((parse(a)?, parse(b)?))
}

fn snapshot(cmd: SnapshotCommand) -> ExitCode {
    match cmd {
        SnapshotCommand::Explain {
            file,
            since,
            view,
            out,
        } => {
            let report = leaklab_snapshot::report::explain_file(
                &file,
                since,
                view.view(),
                view.top,
                view.stacks,
            );
            finish(
                "snapshot explain",
                report.map_err(Into::into),
                &view.output(out),
            )
        }
        SnapshotCommand::Diff {
            before,
            after,
            requests,
            view,
            out,
        } => {
            let report = leaklab_snapshot::report::diff_files(
                &before,
                &after,
                requests,
                view.view(),
                view.top,
                view.stacks,
            );
            finish(
                "snapshot diff",
                report.map_err(Into::into),
                &view.output(out),
            )
        }
        SnapshotCommand::Trim {
            file,
            since,
            top,
            output,
            all_frames,
            json,
        } => {
            let options = leaklab_snapshot::trim::TrimOptions {
                since,
                top,
                view: leaklab_snapshot::View { all_frames },
            };
            finish(
                "snapshot trim",
                leaklab_snapshot::trim::trim(&file, &output, &options).map_err(Into::into),
                &Output::stdout(json),
            )
        }
    }
}

#[derive(Args)]
struct JudgeArgs {
    /// The request document (`leaklab_scan::judge::JudgeRequest`, docs/pytest.md), or - for stdin.
    #[arg(required_unless_present = "evidence", conflicts_with = "evidence")]
    input: Option<PathBuf>,
    /// Re-judge a scan's or a watch's recording (the `evidence.json`, or `evidence.json.gz`,
    /// beside its report) and print its report as the scan or the watch did.
    #[arg(long, value_name = "FILE")]
    evidence: Option<PathBuf>,
    /// With --evidence: write the report's files (report.md, report.json, report.html, the
    /// plots) into this folder.
    #[arg(long, requires = "evidence")]
    out: Option<PathBuf>,
    /// Print the answer as JSON (the outcome, every series' verdict, the census difference and
    /// the message) instead of the message.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct CensusDiffArgs {
    /// The first census (a `leaklab.census/1` document), or - for stdin.
    before: PathBuf,
    /// The second census, of the same process.
    after: PathBuf,
    /// Requests or calls between the two censuses (the growth is also said per step).
    #[arg(long, default_value_t = 1)]
    steps: u64,
    /// What a step is, in the text.
    #[arg(long, default_value = "request")]
    step: String,
    /// Grown holders listed in the text (the JSON has them all).
    #[arg(long, default_value_t = 10)]
    top: usize,
    /// Print the difference as JSON (every grown holder, the totals, the notes).
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Scan(a) => scan(*a),
        Command::Watch(a) => watch(*a),
        Command::Snapshot(cmd) => snapshot(cmd),
        Command::Judge(a) => match (a.evidence, a.input) {
            (Some(file), _) => {
                let output = a
                    .out
                    .map_or(Output::stdout(a.json), |dir| Output::folder(&dir, a.json));
                let read = leaklab_scan::recording::read_document(&file);
                let schema = read
                    .as_ref()
                    .ok()
                    .and_then(|v| v.pointer("/evidence/schema"));
                if leaklab_judge::watch::is_watch(schema) {
                    let watched = read.and_then(|v| {
                        leaklab_watch::recording::WatchRecording::from_value(v)
                            .map_err(|e| e.context(file.display().to_string()))
                    });
                    finish("judge", watched.map(|r| r.judged()), &output)
                } else {
                    let scanned = read.and_then(|v| {
                        leaklab_scan::recording::Recording::from_value(v)
                            .map_err(|e| e.context(file.display().to_string()))
                    });
                    finish("judge", scanned.map(|r| r.judged()), &output)
                }
            }
            (None, Some(input)) => finish(
                "judge",
                leaklab_scan::judge::judge_file(&input),
                &Output::stdout(a.json),
            ),
            (None, None) => unreachable!("clap requires one of the two"),
        },
        Command::CensusDiff(a) => finish(
            "census-diff",
            leaklab_scan::agent::diff_files(&a.before, &a.after, a.steps, &a.step, a.top),
            &Output::stdout(a.json),
        ),
    }
}
