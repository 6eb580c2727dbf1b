//! The zoo's driver (issue 37): every cause in `lab/zoo` served leaky and fixed, scanned from
//! outside by the `leaklab` binary exactly as docs/zoo.md tells a learner to, and compared with
//! what the entry predicted before it was measured. One table, one report.
//!
//! The entries are Python modules; the driver knows them only through `serve.py`: `--list`
//! (every `ENTRY` as JSON), `NAME --bodies DIR` (the bodies the scan sends, written once for
//! both variants) and `NAME --variants leaky,fixed` (one process that imports what both
//! variants import, then forks each variant's service in turn, each printing its pid and
//! `listening on http://…`: one import of torch a cause, not two, where importing it is most of
//! a service's start-up, 1.6-2.3 s of CPU). The scan is the released binary, run with the
//! entry's own budget flags, so an entry is judged by the very command a user runs, and its
//! JSON is read back as the scan's own `ScanReport`.
//!
//! The verdict is checked today. The growth axis and the owner are the entry's predictions: the
//! diagnosis (issue 38) measures them; until then the table shows them as expected, beside what
//! the scan's RSS and anonymous series and the agent's census already say, the census coloured
//! by whether it agrees with the predicted owner (a Python holder grows exactly when the owner
//! is Python).

use anyhow::{bail, Context, Result};
use leaklab_detect::Verdict;
use leaklab_report::page::{Page, Section, Summary};
use leaklab_report::{human_bytes, human_duration, Cell, Outcome, Report, Table, Tone};
use leaklab_scan::diagnosis::{Axis as MeasuredAxis, Owner as MeasuredOwner};
use leaklab_scan::ScanReport;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

/// The two services of a cause: the bug as reported, and the same with its fix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ZooVariant {
    Leaky,
    Fixed,
}

impl Axis {
    /// Whether the scan's measured axis (and whether the growth stopped within its judged
    /// requests) is this predicted one. `bounded` is a growth that stopped: a cache with a cap
    /// is per new input and bounded, so the scan's per-new-input, per-request or given-back
    /// growth that stopped agrees with it; `given-back` only the trim probe can tell.
    pub fn agrees(self, measured: MeasuredAxis, bounded: bool) -> bool {
        match self {
            Axis::PerRequest => measured == MeasuredAxis::PerRequest,
            Axis::PerNewInput => measured == MeasuredAxis::PerNewInput,
            Axis::PerNewThread => measured == MeasuredAxis::PerNewThread,
            Axis::OtherProcess => measured == MeasuredAxis::OtherProcess,
            Axis::Bounded => {
                bounded
                    && matches!(
                        measured,
                        MeasuredAxis::PerNewInput
                            | MeasuredAxis::PerRequest
                            | MeasuredAxis::GivenBack
                    )
            }
            // Only the trim probe's answer: a judged window that read nothing growing is a
            // miss (see `Reading`), not memory given back.
            Axis::GivenBack => measured == MeasuredAxis::GivenBack,
            Axis::Garbage => measured == MeasuredAxis::Garbage,
            Axis::None => measured == MeasuredAxis::None,
        }
    }
}

impl Owner {
    /// Whether the scan's measured owner is this predicted one (`unknown` never is).
    pub fn agrees(self, measured: MeasuredOwner) -> bool {
        matches!(
            (self, measured),
            (Owner::Python, MeasuredOwner::Python)
                | (Owner::Native, MeasuredOwner::Native)
                | (Owner::OtherProcess, MeasuredOwner::OtherProcess)
                | (Owner::None, MeasuredOwner::None)
        )
    }
}

/// How a variant's reading compares with what its entry states (issue 49): as stated, or
/// seeing less than there is, or seeing something else. A miss is never counted as a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reading {
    /// The verdict, the axis and the owner the entry states.
    AsPredicted,
    /// Less than there is: a leak read as a pass, a growth read as none (or undetermined), an
    /// owner left unnamed; nothing read that is not there.
    Missed,
    /// Something else: a false alarm, another axis or owner, or no reading at all.
    Wrong,
}

impl Reading {
    /// A reading of one verdict, axis or owner: what agrees, what sees nothing where something
    /// is, and the rest.
    fn of(agrees: bool, saw_nothing: bool) -> Reading {
        match (agrees, saw_nothing) {
            (true, _) => Reading::AsPredicted,
            (false, true) => Reading::Missed,
            (false, false) => Reading::Wrong,
        }
    }

    /// The variant's reading: its worst part.
    pub fn judge(
        expect: Expect,
        verdict: Outcome,
        axis: (MeasuredAxis, bool),
        owner: MeasuredOwner,
    ) -> Reading {
        let verdict = Reading::of(
            verdict == expect.verdict,
            expect.verdict == Outcome::Fail && verdict == Outcome::Pass,
        );
        let axis = Reading::of(
            expect.axis.agrees(axis.0, axis.1),
            expect.axis != Axis::None
                && matches!(axis.0, MeasuredAxis::None | MeasuredAxis::Undetermined),
        );
        let owner = Reading::of(
            expect.owner.agrees(owner),
            expect.owner != Owner::None
                && matches!(owner, MeasuredOwner::None | MeasuredOwner::Unknown),
        );
        verdict.max(axis).max(owner)
    }

    pub fn words(self) -> &'static str {
        match self {
            Reading::AsPredicted => "as predicted",
            Reading::Missed => "missed",
            Reading::Wrong => "wrong",
        }
    }
}

impl ZooVariant {
    pub const BOTH: [ZooVariant; 2] = [ZooVariant::Leaky, ZooVariant::Fixed];

    pub fn name(self) -> &'static str {
        match self {
            ZooVariant::Leaky => "leaky",
            ZooVariant::Fixed => "fixed",
        }
    }
}

/// The axis along which memory grows (lab/zoo/_zoo.py says what each means): the entry's
/// prediction; the scan measures its own ([`leaklab_scan::diagnosis::Axis`]) and [`Axis::agrees`]
/// compares them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Axis {
    PerRequest,
    PerNewInput,
    PerNewThread,
    OtherProcess,
    Bounded,
    GivenBack,
    /// Grows between the collector's full collections, which free it (`--collect` measures it).
    Garbage,
    None,
}

/// Where the growing memory lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Owner {
    Python,
    Native,
    OtherProcess,
    None,
}

/// What should see a cause: the scan from outside, the agent's census inside the service, the
/// pytest plugin in-process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Instrument {
    Scan,
    Agent,
    Plugin,
}

/// How the scan's bodies are made: one body again and again, one body nudged by value per
/// request (`--vary`), or a folder of bodies of distinct shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Inputs {
    Same,
    Vary,
    Shapes,
}

/// Where a cause can run: anywhere, or only beside a CUDA device (`device` in lab/zoo/_zoo.py).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    #[default]
    Cpu,
    Cuda,
}

/// What one variant should get.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Expect {
    /// `pass` or `fail`, under the entry's budget.
    pub verdict: Outcome,
    pub axis: Axis,
    pub owner: Owner,
}

/// One cause, as `serve.py --list` describes it (the `Entry` of lab/zoo/_zoo.py).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub name: String,
    pub title: String,
    /// "pytorch/pytorch#27971": repository#number.
    pub reports: Vec<String>,
    pub symptom: String,
    pub instruments: Vec<Instrument>,
    pub below_python: bool,
    /// Must not be judged a leak: both variants pass.
    pub must_pass: bool,
    pub leaky: Expect,
    pub fixed: Expect,
    /// The scan's budget flags, as given on its command line.
    pub budget: Vec<String>,
    pub inputs: Inputs,
    pub requests: usize,
    pub warmup: usize,
    #[serde(default)]
    pub env: BTreeMap<String, BTreeMap<String, String>>,
    /// A limit of the instrument declared before a run showed it (empty: none): a reading
    /// that sees less than the entry states is then a declared miss, shown as a miss.
    #[serde(default)]
    pub known_miss: String,
    /// The commit that declared `known_miss`.
    #[serde(default)]
    pub known_miss_since: String,
    /// The commit that first held the entry's module, whose prediction `leaky` and `fixed` keep.
    pub predicted_in: String,
    /// That commit already held the module's first reading: its rows do not count as predicted.
    pub predicted_after_measuring: bool,
    #[serde(default)]
    pub device: Device,
    /// Headers every request carries besides `content-type: application/json` (`Name: value`).
    #[serde(default)]
    pub headers: Vec<String>,
}

impl Entry {
    pub fn expect(&self, variant: ZooVariant) -> Expect {
        match variant {
            ZooVariant::Leaky => self.leaky,
            ZooVariant::Fixed => self.fixed,
        }
    }

    /// Whether the zoo accepts a reading of this entry: as predicted, or a miss of a limit the
    /// entry declared (never a wrong reading, never an undeclared miss).
    pub fn accepts(&self, reading: Reading) -> bool {
        match reading {
            Reading::AsPredicted => true,
            Reading::Missed => !self.known_miss.is_empty(),
            Reading::Wrong => false,
        }
    }

    /// The zoo's contract on predictions (issues 37, 49): a leak's leaky variant fails and its
    /// fixed twin passes, even where today's instrument misses it (a miss is a miss, never an
    /// expected pass); a must-pass entry passes both; a declared limit and a prediction cite
    /// their commits. What breaks it, in words.
    pub fn contract_broken(&self) -> Option<String> {
        let wanted = if self.must_pass {
            (Outcome::Pass, Outcome::Pass)
        } else {
            (Outcome::Fail, Outcome::Pass)
        };
        let got = (self.leaky.verdict, self.fixed.verdict);
        let is_commit = |c: &str| c.len() >= 7 && c.chars().all(|ch| ch.is_ascii_hexdigit());
        if got != wanted {
            let kind = if self.must_pass {
                "a must-pass entry expects pass and pass"
            } else {
                "a leak expects fail (leaky) and pass (fixed), a known miss included"
            };
            Some(format!(
                "{}: {kind}, it declares {:?} and {:?}",
                self.name, got.0, got.1
            ))
        } else if !self.known_miss.is_empty() && !is_commit(&self.known_miss_since) {
            Some(format!(
                "{}: a known miss names the commit that declared it (known_miss_since), it says {:?}",
                self.name, self.known_miss_since
            ))
        } else if !is_commit(&self.predicted_in) {
            Some(format!(
                "{}: the prediction names the commit that first held it (predicted_in), it says {:?}",
                self.name, self.predicted_in
            ))
        } else {
            None
        }
    }
}

/// `leaklab run-lab --zoo`: where the zoo is, what runs it, which causes.
#[derive(Debug, Clone)]
pub struct ZooCommand {
    /// The folder of the entries and serve.py (lab/zoo).
    pub zoo: PathBuf,
    /// The python with torch and FastAPI (default: $LEAKLAB_PYTHON, else python3).
    pub python: Option<PathBuf>,
    /// The `leaklab` binary that scans (default: beside the running executable).
    pub leaklab: Option<PathBuf>,
    /// Causes to run, by name; all when empty.
    pub only: Vec<String>,
    /// Causes at a time (each one python server, serving and scanning a variant at a time).
    pub jobs: usize,
    /// Each variant's scan report goes into `out/NAME-VARIANT/`.
    pub out: PathBuf,
    /// Longest wait for a service to print its address (torch's import is most of it).
    pub start_timeout: Duration,
    /// Say nothing on stderr as variants finish (for `--json`).
    pub quiet: bool,
}

impl ZooCommand {
    /// The defaults of `cargo xtask run-lab --zoo`, run from the repository's root.
    pub fn new(zoo: PathBuf, out: PathBuf) -> ZooCommand {
        ZooCommand {
            zoo,
            python: None,
            leaklab: None,
            only: Vec::new(),
            jobs: 2,
            out,
            start_timeout: Duration::from_secs(180),
            quiet: false,
        }
    }

    fn python(&self) -> PathBuf {
        self.python
            .clone()
            .or_else(|| std::env::var_os("LEAKLAB_PYTHON").map(PathBuf::from))
            .unwrap_or_else(|| "python3".into())
    }

    fn serve_py(&self) -> PathBuf {
        self.zoo.join("serve.py")
    }
}

/// `leaklab-lab run-lab --zoo`: the zoo run, its report written into `out/zoo`, printed, and
/// the exit code (1 when a variant did not get its predicted verdict).
pub fn finish(args: crate::commands::ZooArgs, out: &Path, json: bool) -> std::process::ExitCode {
    let out = out.join("zoo");
    let mut cmd = ZooCommand::new(args.zoo_dir, out.clone());
    cmd.only = args.only;
    cmd.jobs = args.jobs;
    cmd.quiet = json;
    leaklab_report::finish(
        "run-lab --zoo",
        run(&cmd),
        &leaklab_report::Output::folder(&out, json),
    )
}

/// The `leaklab` binary: `explicit`, else the one beside the running executable (cargo and
/// the wheel put it there; it is the running executable under `leaklab run-lab --zoo`).
pub fn locate_leaklab(explicit: Option<PathBuf>) -> Result<PathBuf> {
    let path = match explicit {
        Some(path) => path,
        None => std::env::current_exe()
            .context("cannot tell where this executable is")?
            .with_file_name("leaklab"),
    };
    if !path.is_file() {
        bail!(
            "the `leaklab` binary is not at {}: build it with `cargo build -p leaklab`",
            path.display()
        );
    }
    Ok(path)
}

/// Every entry, as serve.py lists them.
pub fn list(python: &Path, serve_py: &Path) -> Result<Vec<Entry>> {
    if !serve_py.is_file() {
        bail!(
            "no zoo at {}: run from the repository's root, or name the folder of lab/zoo",
            serve_py.display()
        );
    }
    let out = Command::new(python)
        .arg(serve_py)
        .arg("--list")
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {}", python.display()))?;
    if !out.status.success() {
        bail!(
            "{} {} --list failed ({}): {}",
            python.display(),
            serve_py.display(),
            out.status,
            tail(&String::from_utf8_lossy(&out.stderr), 5)
        );
    }
    serde_json::from_slice(&out.stdout)
        .context("serve.py --list printed something other than the entries' JSON")
}

/// What the scan's RSS or anonymous series says: its slope with its bound and its verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SeriesFigure {
    pub series: String,
    pub verdict: Verdict,
    pub bytes_per_request: f64,
    /// Half the width of the slope's interval.
    pub bound: f64,
}

/// A holder the census saw grow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HolderFigure {
    pub holder: String,
    pub bytes_per_request: f64,
}

/// What the agent's census says.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "census")]
pub enum CensusWord {
    /// The entry names no agent: the scan ran without it.
    NotAsked,
    /// The census ran twice and no holder grew.
    NoneGrew,
    /// The holders that grew, most first.
    Grew { holders: Vec<HolderFigure> },
    /// Asked for, and the scan's report has none (see its notes).
    Missing,
}

/// One variant of one cause, scanned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ZooRun {
    pub name: String,
    pub variant: ZooVariant,
    pub expect: Expect,
    /// The scan's answer; None when the variant could not be scanned (`failure` says why).
    pub got: Option<Outcome>,
    /// The scan's deciding series among the process tree's RSS and anonymous memory.
    pub memory: Option<SeriesFigure>,
    pub census: CensusWord,
    /// The scan's one sentence on which memory grows.
    pub diagnosis: Option<String>,
    /// The axis the scan measured, whether the growth stopped, and its words.
    pub axis: Option<(MeasuredAxis, bool, String)>,
    /// The owner the scan named, and its words.
    pub owner: Option<(MeasuredOwner, String)>,
    pub notes: Vec<String>,
    pub requests_sent: usize,
    pub errors: usize,
    /// Where the agent was asked: whether its census agrees with the predicted owner (a Python
    /// holder grew exactly when the owner is Python). None without the agent.
    pub census_agrees: Option<bool>,
    /// The measured axis is the predicted one (None: could not scan).
    pub axis_agrees: Option<bool>,
    /// The measured owner is the predicted one.
    pub owner_agrees: Option<bool>,
    /// The reading against the entry: as predicted, missed or wrong (could not scan: wrong).
    /// (The census's own column is shown, not judged: the owner is the diagnosis's, from the
    /// census's share of the growth.)
    pub reading: Reading,
    /// The zoo accepts it: as predicted, or a miss its entry declared (`known_miss`) before
    /// the run; an undeclared miss and a wrong reading fail the zoo.
    pub accepted: bool,
    pub failure: Option<String>,
    pub seconds: f64,
    /// The scan, as a learner would type it (the folder of bodies and the pid are this run's).
    pub command: Vec<String>,
    /// The scan's own report folder (report.html and its charts).
    pub report: PathBuf,
}

/// The zoo, run: every entry listed, and each variant scanned.
#[derive(Debug, Clone, Serialize)]
pub struct ZooReport {
    pub entries: Vec<Entry>,
    pub runs: Vec<ZooRun>,
    /// CUDA-only causes left out where torch sees no CUDA device (the device check runs them).
    pub device_only: Vec<String>,
    pub seconds: f64,
}

/// Runs the zoo: the entries `cmd.only` names (all when empty), each variant its own service,
/// `cmd.jobs` at a time.
pub fn run(cmd: &ZooCommand) -> Result<ZooReport> {
    let started = Instant::now();
    let python = cmd.python();
    let leaklab = locate_leaklab(cmd.leaklab.clone())?;
    let mut entries = list(&python, &cmd.serve_py())?;
    if let Some(unknown) = cmd
        .only
        .iter()
        .find(|n| !entries.iter().any(|e| &e.name == *n))
    {
        let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
        bail!(
            "no cause `{unknown}` in the zoo; it has: {}",
            names.join(", ")
        );
    }
    if !cmd.only.is_empty() {
        entries.retain(|e| cmd.only.contains(&e.name));
    }
    let mut device_only = Vec::new();
    if entries.iter().any(|e| e.device == Device::Cuda) && !cuda_available(&python) {
        device_only = entries
            .iter()
            .filter(|e| e.device == Device::Cuda)
            .map(|e| e.name.clone())
            .collect();
        entries.retain(|e| e.device != Device::Cuda);
        if entries.is_empty() {
            bail!(
                "CUDA not available: {} need a CUDA device, and torch here sees none (run them \
                 where a GPU is: their tests are device-only)",
                device_only.join(", ")
            );
        }
    }
    if !cmd.quiet {
        eprintln!(
            "leaklab zoo: {} causes, {} services, {} at a time",
            entries.len(),
            entries.len() * ZooVariant::BOTH.len(),
            cmd.jobs.max(1)
        );
    }
    // A cause at a time per job: its variants are served one after the other, forked from one
    // process that imported their modules once (`serve.py --variants`).
    let next = AtomicUsize::new(0);
    let done = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..cmd.jobs.clamp(1, entries.len().max(1)) {
            s.spawn(|| {
                while let Some(entry) = entries.get(next.fetch_add(1, Ordering::SeqCst)) {
                    for run in run_entry(cmd, &python, &leaklab, entry) {
                        if !cmd.quiet {
                            eprintln!(
                                "leaklab zoo: {}-{}: {} ({:.0} s)",
                                run.name,
                                run.variant.name(),
                                run_words(&run),
                                run.seconds
                            );
                        }
                        done.lock().expect("no worker panics holding it").push(run);
                    }
                }
            });
        }
    });
    let mut runs = done.into_inner().expect("workers are done");
    let order = |r: &ZooRun| {
        let entry = entries.iter().position(|e| e.name == r.name);
        (entry, ZooVariant::BOTH.iter().position(|v| *v == r.variant))
    };
    runs.sort_by_key(order);
    Ok(ZooReport {
        entries,
        runs,
        device_only,
        seconds: started.elapsed().as_secs_f64(),
    })
}

fn run_words(run: &ZooRun) -> String {
    match (&run.failure, run.got) {
        (Some(f), _) => format!("could not scan: {f}"),
        (None, Some(got)) => {
            let mut words = format!(
                "{} (expected {}), axis {} (expected {}), owner {} (expected {})",
                got.answer(),
                run.expect.verdict.answer(),
                run.axis_cell_text(),
                kebab(&run.expect.axis),
                run.owner.as_ref().map_or("-".into(), |o| kebab(&o.0)),
                kebab(&run.expect.owner),
            );
            words.push_str(&format!(": {}", run.reading.words()));
            if !run.accepted {
                words.push_str(if run.reading == Reading::Missed {
                    ", UNDECLARED"
                } else {
                    ", UNEXPECTED"
                });
            }
            words
        }
        (None, None) => "no answer".into(),
    }
}

/// One cause: its bodies written, its server started, then each variant served, scanned and
/// stopped in turn.
fn run_entry(cmd: &ZooCommand, python: &Path, leaklab: &Path, entry: &Entry) -> Vec<ZooRun> {
    let started = Instant::now();
    let bodies = cmd.out.join(format!("{}-bodies", entry.name));
    let log = cmd.out.join(format!("{}-service.log", entry.name));
    let mut server = write_bodies(cmd, python, entry, &bodies)
        .and_then(|()| ZooServer::start(python, &cmd.serve_py(), entry, &log, cmd.start_timeout));
    let mut runs: Vec<ZooRun> = ZooVariant::BOTH
        .iter()
        .map(|&v| run_variant(leaklab, entry, v, &cmd.out, &bodies, &mut server))
        .collect();
    // The bodies and the server's start-up count in the first variant's time.
    let variants: f64 = runs.iter().map(|r| r.seconds).sum();
    runs[0].seconds += (started.elapsed().as_secs_f64() - variants).max(0.0);
    runs
}

/// The bodies the scan sends, written once for both variants.
fn write_bodies(cmd: &ZooCommand, python: &Path, entry: &Entry, bodies: &Path) -> Result<()> {
    let _ = std::fs::remove_dir_all(bodies);
    let written = Command::new(python)
        .arg(cmd.serve_py())
        .arg(&entry.name)
        .arg("--bodies")
        .arg(bodies)
        .stdin(Stdio::null())
        .output()?;
    if !written.status.success() {
        bail!(
            "serve.py {} --bodies failed ({}): {}",
            entry.name,
            written.status,
            tail(&String::from_utf8_lossy(&written.stderr), 5)
        );
    }
    Ok(())
}

/// One variant: served by the cause's server, scanned, stopped.
fn run_variant(
    leaklab: &Path,
    entry: &Entry,
    variant: ZooVariant,
    out: &Path,
    bodies: &Path,
    server: &mut Result<ZooServer>,
) -> ZooRun {
    let started = Instant::now();
    let report = out.join(format!("{}-{}", entry.name, variant.name()));
    let expect = entry.expect(variant);
    let mut run = ZooRun {
        name: entry.name.clone(),
        variant,
        expect,
        got: None,
        memory: None,
        census: CensusWord::NotAsked,
        diagnosis: None,
        axis: None,
        owner: None,
        axis_agrees: None,
        owner_agrees: None,
        notes: Vec::new(),
        requests_sent: 0,
        errors: 0,
        census_agrees: None,
        reading: Reading::Wrong,
        accepted: false,
        failure: None,
        seconds: 0.0,
        command: Vec::new(),
        report: report.clone(),
    };
    let scanned = match server {
        Ok(server) => scan_variant(
            server,
            leaklab,
            entry,
            variant,
            bodies,
            &report,
            &mut run.command,
        ),
        Err(e) => Err(anyhow::anyhow!("{e:#}")),
    };
    match scanned {
        Ok(scan) => {
            run.got = Some(scan.outcome);
            run.memory = memory_figure(&scan);
            run.census = census_word(&scan, true);
            run.census_agrees = census_agrees(expect.owner, &run.census);
            // No axis where no series could be judged: then nothing was seen to grow.
            let (axis, bounded, words) = scan.explained.axis.as_ref().map_or(
                (MeasuredAxis::None, false, "no series grows".to_string()),
                |a| (a.axis, a.bounded, a.words.clone()),
            );
            let (owner, owner_words) = scan
                .explained
                .owner
                .as_ref()
                .map_or((MeasuredOwner::None, "nothing grows".to_string()), |o| {
                    (o.owner, o.words.clone())
                });
            run.axis_agrees = Some(expect.axis.agrees(axis, bounded));
            run.owner_agrees = Some(expect.owner.agrees(owner));
            run.reading = Reading::judge(expect, scan.outcome, (axis, bounded), owner);
            run.accepted = entry.accepts(run.reading);
            run.axis = Some((axis, bounded, words));
            run.owner = Some((owner, owner_words));
            run.diagnosis = Some(scan.diagnosis);
            run.notes = scan.notes;
            run.requests_sent = scan.requests_sent;
            run.errors = scan.errors;
        }
        Err(e) => run.failure = Some(format!("{e:#}")),
    }
    run.seconds = started.elapsed().as_secs_f64();
    run
}

/// Whether the zoo's python sees a CUDA device (`torch.cuda.is_available()`).
fn cuda_available(python: &Path) -> bool {
    Command::new(python)
        .args([
            "-c",
            "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn scan_variant(
    server: &mut ZooServer,
    leaklab: &Path,
    entry: &Entry,
    variant: ZooVariant,
    bodies: &Path,
    report: &Path,
    command: &mut Vec<String>,
) -> Result<ScanReport> {
    std::fs::create_dir_all(report)
        .with_context(|| format!("cannot create {}", report.display()))?;
    let service = server.serve(variant)?;
    let mut args: Vec<String> = vec![
        "scan".into(),
        format!("{}/predict", service.base),
        "--body".into(),
        bodies.display().to_string(),
    ];
    args.extend([
        "--pid".into(),
        service.pid.to_string(),
        "--header".into(),
        "content-type: application/json".into(),
    ]);
    for header in &entry.headers {
        args.extend(["--header".into(), header.clone()]);
    }
    args.extend([
        "--requests".into(),
        entry.requests.to_string(),
        "--warmup".into(),
        entry.warmup.to_string(),
    ]);
    if entry.inputs == Inputs::Vary {
        args.push("--vary".into());
    }
    args.extend(entry.budget.iter().cloned());
    // Every zoo service mounts the agent (lab/zoo/_zoo.py's serve): the diagnosis asks its
    // census and its process state for the owner, whatever instruments the entry predicted.
    // Its trim probe (allowed by the zoo's serve) tells memory the allocator gives back.
    args.extend([
        "--agent".into(),
        format!("{}/debug/leaklab", service.base),
        "--trim".into(),
        // Its Python trace (allowed by the zoo's serve) tells Python objects that hold no
        // tensor from native memory, where the census finds no tensor growing.
        "--python-trace".into(),
    ]);
    // A stuck entry must not hold CI: the scan keeps what it measured and says it stopped.
    if !entry.budget.iter().any(|a| a == "--time-limit") {
        args.extend(["--time-limit".into(), "10m".into()]);
    }
    args.extend([
        "--json".into(),
        "--out".into(),
        report.display().to_string(),
    ]);
    *command = std::iter::once("leaklab".to_string())
        .chain(args.iter().cloned())
        .collect();
    let out = Command::new(leaklab)
        .args(&args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {}", leaklab.display()))?;
    let alive = service.alive();
    server.stop();
    match serde_json::from_slice::<ScanReport>(&out.stdout) {
        Ok(scan) => Ok(scan),
        Err(_) => {
            let died = if alive {
                String::new()
            } else {
                format!(
                    " (the service had exited; its stderr is in {})",
                    server.log.display()
                )
            };
            bail!(
                "the scan gave no report ({}){died}: {}",
                out.status,
                tail(&String::from_utf8_lossy(&out.stderr), 5)
            )
        }
    }
}

/// A cause's server: `serve.py NAME --variants leaky,fixed`, which imports what both variants
/// import once (torch: most of a service's start-up) and then forks each variant's service in
/// turn, the next once the last was killed. The server leads its own process group and dies
/// with the driver; each service leads a group of its own (a cause may fork workers) and dies
/// with the server. Dropped, both groups are killed.
struct ZooServer {
    /// The cause's name.
    name: String,
    child: Child,
    /// The `listening on` lines, as the services print them.
    lines: mpsc::Receiver<String>,
    /// The server's stderr, and its services'.
    log: PathBuf,
    timeout: Duration,
    /// The service now serving, which leads its process group.
    serving: Option<u32>,
}

/// A variant's service, as its line says: its address and its pid.
struct ZooService {
    base: String,
    pid: u32,
}

impl ZooService {
    /// `leaklab-zoo NAME-VARIANT pid PID listening on URL`, for this label.
    fn parse(line: &str, label: &str) -> Option<ZooService> {
        let (head, url) = line.split_once(" listening on ")?;
        let mut words = head.split_whitespace().skip(1);
        let (Some(name), Some("pid"), Some(pid)) = (words.next(), words.next(), words.next())
        else {
            return None;
        };
        (name == label).then_some(())?;
        Some(ZooService {
            base: url.trim().to_string(),
            pid: pid.parse().ok()?,
        })
    }

    fn alive(&self) -> bool {
        std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).is_ok_and(|stat| {
            // The state follows the command's closing parenthesis: Z or X is gone.
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, r)| r.trim().chars().next());
            !matches!(state, Some('Z' | 'X') | None)
        })
    }
}

impl ZooServer {
    fn start(
        python: &Path,
        serve_py: &Path,
        entry: &Entry,
        log: &Path,
        timeout: Duration,
    ) -> Result<ZooServer> {
        if let Some(folder) = log.parent() {
            std::fs::create_dir_all(folder)
                .with_context(|| format!("cannot create {}", folder.display()))?;
        }
        let stderr = std::fs::File::create(log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        let variants: Vec<&str> = ZooVariant::BOTH.iter().map(|v| v.name()).collect();
        let mut command = Command::new(python);
        command
            .arg(serve_py)
            .arg(&entry.name)
            .args(["--variants", &variants.join(",")]);
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .process_group(0);
        // SAFETY: prctl is async-signal-safe, and nothing else runs between fork and exec.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = command
            .spawn()
            .with_context(|| format!("cannot start {}", python.display()))?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let (tx, rx) = mpsc::channel();
        // Reads the addresses, and keeps draining so the server never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.contains(" listening on ") {
                    let _ = tx.send(line);
                }
            }
        });
        Ok(ZooServer {
            name: entry.name.clone(),
            child,
            lines: rx,
            log: log.to_path_buf(),
            timeout,
            serving: None,
        })
    }

    /// Waits for `variant`'s service (the server forks it once the last one was stopped).
    fn serve(&mut self, variant: ZooVariant) -> Result<ZooService> {
        self.stop();
        let label = format!("{}-{}", self.name, variant.name());
        let line = match self.lines.recv_timeout(self.timeout) {
            Ok(line) => line,
            Err(e) => bail!("the service did not start: {}", self.why_gone(e)),
        };
        let Some(service) = ZooService::parse(&line, &label) else {
            bail!("the server said {line:?} where {label} was to start");
        };
        self.serving = Some(service.pid);
        Ok(service)
    }

    /// Why no address came: the server exited (with its stderr's tail), or it said nothing in time.
    fn why_gone(&mut self, e: mpsc::RecvTimeoutError) -> String {
        // Its stdout closed: it is exiting; give it a moment to be reaped.
        let wait = if e == mpsc::RecvTimeoutError::Disconnected {
            50
        } else {
            1
        };
        let mut exited = None;
        for _ in 0..wait {
            exited = self.child.try_wait().ok().flatten();
            if exited.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let status = exited.map_or_else(
            || format!("no address after {:?}", self.timeout),
            |s| format!("it exited ({s})"),
        );
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        format!("{status}; stderr: {}", tail(&text, 5))
    }

    /// Kills the service now serving, and its workers; the server then forks the next.
    fn stop(&mut self) {
        if let Some(pid) = self.serving.take() {
            // SAFETY: signalling the process group that service leads (it made it at its start).
            unsafe { libc::killpg(pid as i32, libc::SIGKILL) };
        }
    }
}

impl Drop for ZooServer {
    fn drop(&mut self) {
        self.stop();
        // SAFETY: signalling the process group this child leads (its pid is its group's id).
        unsafe { libc::killpg(self.child.id() as i32, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

/// A holder's path in a table cell: its end (the object that keeps the memory), the whole path
/// in the JSON.
const HOLDER_CHARS: usize = 64;

fn shorten(text: &str, max: usize) -> String {
    let chars: Vec<char> = text.chars().collect();
    if chars.len() <= max {
        return text.to_string();
    }
    format!(
        "…{}",
        chars[chars.len() - (max - 1)..].iter().collect::<String>()
    )
}

/// The last `n` lines of `text`, on one line.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(n)..].join(" | ");
    if tail.is_empty() {
        "(empty)".into()
    } else {
        tail
    }
}

/// The process tree's series that decides: the one that fails, else the steepest of RSS and
/// anonymous memory.
fn memory_figure(scan: &ScanReport) -> Option<SeriesFigure> {
    let host: Vec<_> = scan
        .series
        .iter()
        .filter(|s| s.series == "rss" || s.series == "anonymous")
        .filter_map(|s| Some((s, s.judgement.as_ref()?)))
        .collect();
    let failing = host.iter().find(|(s, _)| s.ops.is_some_and(|o| o.fails()));
    let (s, j) = failing.or_else(|| {
        host.iter().max_by(|a, b| {
            a.1.slope
                .bytes_per_request
                .total_cmp(&b.1.slope.bytes_per_request)
        })
    })?;
    Some(SeriesFigure {
        series: s.series.clone(),
        verdict: j.verdict,
        bytes_per_request: j.slope.bytes_per_request,
        bound: j.slope.half_width(),
    })
}

/// The owner, as far as the census tells it: a Python holder grows exactly when the memory is
/// Python-held (native memory, another process's and no growth leave no holder); a census asked
/// for and absent cannot agree.
fn census_agrees(owner: Owner, census: &CensusWord) -> Option<bool> {
    match census {
        CensusWord::NotAsked => None,
        CensusWord::Missing => Some(false),
        CensusWord::NoneGrew => Some(owner != Owner::Python),
        CensusWord::Grew { .. } => Some(owner == Owner::Python),
    }
}

fn census_word(scan: &ScanReport, asked: bool) -> CensusWord {
    match (&scan.census, asked) {
        (_, false) => CensusWord::NotAsked,
        (None, true) => CensusWord::Missing,
        (Some(c), true) if c.grown.is_empty() => CensusWord::NoneGrew,
        (Some(c), true) => CensusWord::Grew {
            holders: c
                .grown
                .iter()
                .map(|g| HolderFigure {
                    holder: g.holder.clone(),
                    bytes_per_request: g.bytes_per_step,
                })
                .collect(),
        },
    }
}

impl ZooRun {
    /// `per-new-input, bounded`: the measured axis as the table shows it.
    pub fn axis_cell_text(&self) -> String {
        match &self.axis {
            Some((axis, true, _)) => format!("{}, bounded", kebab(axis)),
            Some((axis, false, _)) => kebab(axis),
            None => "-".into(),
        }
    }

    pub fn memory_words(&self) -> String {
        match &self.memory {
            Some(m) => format!(
                "{} {} ± {}/req ({})",
                m.series,
                human_bytes(m.bytes_per_request),
                human_bytes(m.bound),
                m.verdict
            ),
            None if self.failure.is_some() => "-".into(),
            None => "not judged".into(),
        }
    }

    pub fn census_words(&self) -> String {
        match &self.census {
            CensusWord::NotAsked => "not asked".into(),
            CensusWord::NoneGrew => "no holder grew".into(),
            CensusWord::Missing => "asked, none in the report".into(),
            CensusWord::Grew { holders } => {
                let top = &holders[0];
                let more = if holders.len() > 1 {
                    format!(" (+{} more)", holders.len() - 1)
                } else {
                    String::new()
                };
                format!(
                    "{} {}/req{more}",
                    shorten(&top.holder, HOLDER_CHARS),
                    human_bytes(top.bytes_per_request)
                )
            }
        }
    }

    fn got_cell(&self) -> Cell {
        match (&self.failure, self.got) {
            (Some(_), _) | (None, None) => Cell::new("could not scan").tone(Tone::Bad),
            (None, Some(got)) => {
                let tone = if got == self.expect.verdict {
                    Tone::Good
                } else {
                    Tone::Bad
                };
                Cell::new(got.answer().to_lowercase()).tone(tone)
            }
        }
    }

    /// `as predicted`, `missed (declared)`, `missed (UNDECLARED)` or `wrong`.
    fn reading_cell(&self) -> Cell {
        match (self.reading, self.accepted) {
            (Reading::AsPredicted, _) => Cell::new("as predicted").tone(Tone::Good),
            (Reading::Missed, true) => Cell::new("missed (declared)").tone(Tone::Warn),
            (Reading::Missed, false) => Cell::new("missed (UNDECLARED)").tone(Tone::Bad),
            (Reading::Wrong, _) => Cell::new("wrong").tone(Tone::Bad),
        }
    }
}

/// `fail, per-request, python`: a prediction in one cell.
fn expect_words(expect: &Expect) -> String {
    format!(
        "{}, {}, {}",
        expect.verdict.answer().to_lowercase(),
        kebab(&expect.axis),
        kebab(&expect.owner)
    )
}

const HEADER: [&str; 10] = [
    "cause",
    "variant",
    "reference",
    "predicted (verdict, axis, owner)",
    "verdict",
    "axis",
    "owner",
    "RSS / anonymous",
    "census",
    "reading",
];

/// How the table was measured, said under it.
const HOW: &str = "Each variant is its own service (lab/zoo/serve.py), scanned from outside \
    by `leaklab scan` with the entry's budget, --json and --agent (every zoo service mounts the \
    agent); its RSS and anonymous memory are judged on their floor (slope ± bound per request). \
    The verdict, the growth axis and the owner the scan measured (docs/scan.md, the diagnosis) are \
    each read against the entry's prediction of what the variant is (a leak fails, even where the \
    scan cannot see it): *as predicted*; *missed* where the scan saw less than there is (a leak \
    read as a pass, a growth read as none, an owner unnamed), *declared* where the entry named \
    that limit of the instrument in a commit before the run, and never counted as a pass; *wrong* \
    otherwise. A prediction marked *after measuring* was first committed beside its reading and \
    does not count as predicted. A cause predicted `bounded` agrees with a growth per new input \
    or per request that stopped within the judged requests. The census column shows the holder \
    that grew most, marked where it disagrees with the predicted owner; shown, not judged (the \
    owner is the diagnosis's, from the census's share of the growth).";

impl ZooReport {
    fn entry(&self, name: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.name == name)
    }

    fn rows(&self) -> Vec<Vec<Cell>> {
        self.runs
            .iter()
            .map(|r| {
                let reference = self
                    .entry(&r.name)
                    .map_or_else(String::new, |e| e.reports.join(", "));
                let after = self
                    .entry(&r.name)
                    .is_some_and(|e| e.predicted_after_measuring);
                let predicted = if after {
                    format!("{} (after measuring)", expect_words(&r.expect))
                } else {
                    expect_words(&r.expect)
                };
                vec![
                    Cell::code(&r.name),
                    r.variant.name().into(),
                    reference.into(),
                    predicted.into(),
                    r.got_cell(),
                    Cell::new(r.axis_cell_text()).tone(tone(r.axis_agrees)),
                    Cell::new(r.owner.as_ref().map_or("-".into(), |o| kebab(&o.0)))
                        .tone(tone(r.owner_agrees)),
                    r.memory_words().into(),
                    Cell::code(r.census_words()).tone(tone(r.census_agrees)),
                    r.reading_cell(),
                ]
            })
            .collect()
    }

    pub fn table(&self) -> Table {
        Table::new(HEADER).numeric(&[7]).rows(self.rows())
    }

    /// The runs the zoo does not accept (wrong, or an undeclared miss), each with why.
    pub fn disagreements(&self) -> Vec<String> {
        self.runs
            .iter()
            .filter(|r| !r.accepted)
            .map(|r| format!("{}-{}: {}", r.name, r.variant.name(), run_words(r)))
            .collect()
    }

    /// How many runs read so.
    pub fn count(&self, reading: Reading) -> usize {
        self.runs.iter().filter(|r| r.reading == reading).count()
    }

    /// The causes whose prediction was written before their first measurement.
    fn predicted_before(&self) -> usize {
        self.entries
            .iter()
            .filter(|e| !e.predicted_after_measuring)
            .count()
    }

    /// The counts, misses apart from what was right: `22 of 26 variants as predicted, 4
    /// missed (4 declared), 0 wrong; 13 causes, 0 predicted before measuring`.
    fn headline(&self) -> String {
        let missed = self.count(Reading::Missed);
        let declared = self
            .runs
            .iter()
            .filter(|r| r.reading == Reading::Missed && r.accepted)
            .count();
        format!(
            "{} of {} variants as predicted, {missed} missed ({declared} declared before the run), \
             {} wrong; {} causes, {} predicted before measuring",
            self.count(Reading::AsPredicted),
            self.runs.len(),
            self.count(Reading::Wrong),
            self.entries.len(),
            self.predicted_before()
        )
    }

    /// What the reader must know besides the table: variants that could not be scanned, and
    /// predictions that break the zoo's contract (the per-entry tests fail on those).
    fn notes(&self) -> Vec<String> {
        let failures = self.runs.iter().filter_map(|r| {
            let f = r.failure.as_ref()?;
            Some(format!(
                "Could not scan {}-{}: {f}",
                r.name,
                r.variant.name()
            ))
        });
        let broken = self.entries.iter().filter_map(|e| {
            let why = e.contract_broken()?;
            Some(format!(
                "A prediction that breaks the zoo's contract: {why}"
            ))
        });
        let missed = self
            .entries
            .iter()
            .filter(|e| !e.known_miss.is_empty())
            .map(|e| {
                format!(
                    "Known miss, {} (declared in {}): {}",
                    e.name, e.known_miss_since, e.known_miss
                )
            });
        let device_only = (!self.device_only.is_empty()).then(|| {
            format!(
                "Not run here, CUDA only and torch sees no CUDA device (the device check runs \
                 them): {}",
                self.device_only.join(", ")
            )
        });
        failures
            .chain(broken)
            .chain(missed)
            .chain(device_only)
            .collect()
    }
}

fn tone(agrees: Option<bool>) -> Tone {
    match agrees {
        Some(true) => Tone::Good,
        Some(false) => Tone::Bad,
        None => Tone::Plain,
    }
}

/// A serde name as JSON writes it ("per-new-input").
fn kebab<T: Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

impl Report for ZooReport {
    /// Pass only when every variant got what its entry predicted (a variant that could not be
    /// scanned disagrees).
    fn outcome(&self) -> Outcome {
        Outcome::pass_if(!self.runs.is_empty() && self.runs.iter().all(|r| r.accepted))
    }

    fn text(&self) -> String {
        let mut text = format!(
            "{}\n\n{}: {} ({} s).\n{HOW}",
            self.table().text(),
            self.outcome().answer(),
            self.headline(),
            self.seconds.round()
        );
        for note in self.notes() {
            text.push_str(&format!("\n{note}"));
        }
        text
    }

    fn markdown(&self) -> String {
        let mut md = format!(
            "# The zoo\n\n**{}: {}** ({}).\n\n{}\n{HOW}\n",
            self.outcome().answer(),
            self.headline(),
            human_duration(self.seconds),
            self.table().markdown()
        );
        for note in self.notes() {
            md.push_str(&format!("\n- {note}"));
        }
        md.push('\n');
        md
    }

    fn page(&self) -> Option<Page> {
        let outcome = self.outcome();
        let summary = Summary {
            tone: outcome.into(),
            answer: outcome.answer().into(),
            headline: self.headline(),
            figures: vec![
                ("causes".into(), self.entries.len().to_string()),
                (
                    "variants as predicted".into(),
                    format!(
                        "{} of {}",
                        self.count(Reading::AsPredicted),
                        self.runs.len()
                    ),
                ),
                ("missed".into(), self.count(Reading::Missed).to_string()),
                ("wrong".into(), self.count(Reading::Wrong).to_string()),
                (
                    "causes predicted before measuring".into(),
                    format!("{} of {}", self.predicted_before(), self.entries.len()),
                ),
                ("time".into(), human_duration(self.seconds)),
            ],
            text: vec![HOW.into()],
        };
        let mut page = Page::new(
            "leaklab run-lab --zoo",
            format!("The zoo: {} causes, leaky and fixed", self.entries.len()),
            summary,
        )
        .section(
            Section::new("Every cause")
                .table(self.table())
                .notes(&self.notes()),
        );
        for e in &self.entries {
            let mut facts = vec![
                ("reported".to_string(), e.reports.join(", ")),
                ("symptom as reported".to_string(), e.symptom.clone()),
                (
                    "instruments".to_string(),
                    e.instruments
                        .iter()
                        .map(kebab)
                        .collect::<Vec<_>>()
                        .join(", "),
                ),
                (
                    "below Python".to_string(),
                    if e.below_python { "yes" } else { "no" }.to_string(),
                ),
                (
                    "must pass".to_string(),
                    if e.must_pass { "yes" } else { "no" }.to_string(),
                ),
                ("budget".to_string(), e.budget.join(" ")),
                (
                    "predicted in".to_string(),
                    if e.predicted_after_measuring {
                        format!("{} (which already held its first reading)", e.predicted_in)
                    } else {
                        format!("{} (before any measurement)", e.predicted_in)
                    },
                ),
                (
                    "requests".to_string(),
                    format!(
                        "{} warm-up + {} judged, inputs {}",
                        e.warmup,
                        e.requests,
                        kebab(&e.inputs)
                    ),
                ),
            ];
            for r in self.runs.iter().filter(|r| r.name == e.name) {
                facts.push((format!("{} scan", r.variant.name()), r.command.join(" ")));
                facts.push((
                    format!("{} says", r.variant.name()),
                    r.diagnosis
                        .clone()
                        .or_else(|| r.failure.clone())
                        .unwrap_or_default(),
                ));
                if let Some((_, _, words)) = &r.axis {
                    facts.push((
                        format!("{} axis ({})", r.variant.name(), r.axis_cell_text()),
                        words.clone(),
                    ));
                }
                if let Some((owner, words)) = &r.owner {
                    facts.push((
                        format!("{} owner ({})", r.variant.name(), kebab(owner)),
                        words.clone(),
                    ));
                }
                facts.push((
                    format!("{} report", r.variant.name()),
                    r.report.join("report.html").display().to_string(),
                ));
            }
            page = page.section(Section::new(format!("{}: {}", e.name, e.title)).facts(facts));
        }
        Some(page)
    }

    fn problem(&self) -> Option<String> {
        let wrong = self.disagreements();
        (!wrong.is_empty()).then(|| format!("not as predicted: {}", wrong.join("; ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(must_pass: bool, leaky: Outcome, fixed: Outcome) -> Entry {
        let expect = |verdict| Expect {
            verdict,
            axis: Axis::PerRequest,
            owner: Owner::Python,
        };
        Entry {
            name: "x".into(),
            title: "t".into(),
            reports: vec!["a/b#1".into()],
            symptom: "s".into(),
            instruments: vec![Instrument::Scan],
            below_python: false,
            must_pass,
            leaky: expect(leaky),
            fixed: Expect {
                axis: Axis::None,
                owner: Owner::None,
                ..expect(fixed)
            },
            budget: Vec::new(),
            inputs: Inputs::Same,
            requests: 1,
            warmup: 1,
            env: BTreeMap::new(),
            known_miss: String::new(),
            known_miss_since: String::new(),
            predicted_in: "e595376".into(),
            predicted_after_measuring: true,
            device: Device::Cpu,
            headers: Vec::new(),
        }
    }

    #[test]
    fn the_contract_is_a_leak_that_fails_and_its_fix_that_passes_or_two_passes() {
        assert_eq!(
            entry(false, Outcome::Fail, Outcome::Pass).contract_broken(),
            None
        );
        assert_eq!(
            entry(true, Outcome::Pass, Outcome::Pass).contract_broken(),
            None
        );
        assert!(entry(false, Outcome::Pass, Outcome::Pass)
            .contract_broken()
            .is_some());
        assert!(entry(true, Outcome::Fail, Outcome::Pass)
            .contract_broken()
            .is_some());
        let missed = Entry {
            known_miss: "bounded: read as a plateau".into(),
            known_miss_since: "f7222e6".into(),
            ..entry(false, Outcome::Fail, Outcome::Pass)
        };
        assert_eq!(missed.contract_broken(), None);
        let expected_pass = Entry {
            known_miss: "bounded: read as a plateau".into(),
            known_miss_since: "f7222e6".into(),
            ..entry(false, Outcome::Pass, Outcome::Pass)
        };
        assert!(
            expected_pass.contract_broken().is_some(),
            "a known miss still states the leak's fail: the pass it gets is a miss, not a pass"
        );
        let undated = Entry {
            known_miss_since: String::new(),
            ..missed.clone()
        };
        assert!(
            undated.contract_broken().is_some(),
            "a limit names its commit"
        );
        let unsourced = Entry {
            predicted_in: "first".into(),
            ..entry(false, Outcome::Fail, Outcome::Pass)
        };
        assert!(
            unsourced.contract_broken().is_some(),
            "a prediction names its commit"
        );
    }

    /// A run of `e` read `got` (axis, bounded, owner), as `run_variant` reads a scan.
    fn read(
        e: &Entry,
        variant: ZooVariant,
        got: Outcome,
        axis: MeasuredAxis,
        owner: MeasuredOwner,
    ) -> ZooRun {
        let expect = e.expect(variant);
        let reading = Reading::judge(expect, got, (axis, false), owner);
        ZooRun {
            name: e.name.clone(),
            variant,
            expect,
            got: Some(got),
            memory: None,
            census: CensusWord::NotAsked,
            diagnosis: None,
            axis: Some((axis, false, String::new())),
            owner: Some((owner, String::new())),
            notes: Vec::new(),
            requests_sent: 1,
            errors: 0,
            census_agrees: None,
            axis_agrees: Some(expect.axis.agrees(axis, false)),
            owner_agrees: Some(expect.owner.agrees(owner)),
            reading,
            accepted: e.accepts(reading),
            failure: None,
            seconds: 1.0,
            command: Vec::new(),
            report: PathBuf::new(),
        }
    }

    #[test]
    fn a_leak_read_as_a_pass_is_a_miss_that_fails_the_zoo_unless_its_limit_was_declared() {
        let leak = entry(false, Outcome::Fail, Outcome::Pass);
        let fixed = read(
            &leak,
            ZooVariant::Fixed,
            Outcome::Pass,
            MeasuredAxis::None,
            MeasuredOwner::None,
        );
        assert_eq!(fixed.reading, Reading::AsPredicted);
        let missed = read(
            &leak,
            ZooVariant::Leaky,
            Outcome::Pass,
            MeasuredAxis::None,
            MeasuredOwner::None,
        );
        assert_eq!(missed.reading, Reading::Missed);
        let report = ZooReport {
            entries: vec![leak.clone()],
            runs: vec![missed, fixed.clone()],
            device_only: Vec::new(),
            seconds: 1.0,
        };
        assert_eq!(
            report.outcome(),
            Outcome::Fail,
            "an undeclared miss fails the zoo"
        );
        assert!(
            report.text().contains("missed (UNDECLARED)"),
            "{}",
            report.text()
        );
        assert!(
            report
                .headline()
                .starts_with("1 of 2 variants as predicted, 1 missed (0 declared"),
            "{}",
            report.headline()
        );

        let declared = Entry {
            known_miss: "copy-on-write: the summed anonymous memory stays flat".into(),
            known_miss_since: "e595376".into(),
            ..leak
        };
        let missed = read(
            &declared,
            ZooVariant::Leaky,
            Outcome::Pass,
            MeasuredAxis::PerRequest,
            MeasuredOwner::Python,
        );
        assert_eq!(missed.reading, Reading::Missed, "the verdict alone missed");
        let report = ZooReport {
            entries: vec![declared],
            runs: vec![missed, fixed],
            device_only: Vec::new(),
            seconds: 1.0,
        };
        assert_eq!(
            report.outcome(),
            Outcome::Pass,
            "a declared limit is accepted..."
        );
        let text = report.text();
        assert!(
            text.contains("missed (declared)") && !text.contains("every variant"),
            "...and still shown as a miss, never as a pass: {text}"
        );
        assert!(
            report.headline().contains("1 missed (1 declared"),
            "{}",
            report.headline()
        );
    }

    #[test]
    fn a_false_alarm_or_another_axis_is_wrong_and_seeing_nothing_is_a_miss() {
        let leak = entry(false, Outcome::Fail, Outcome::Pass);
        let alarm = read(
            &leak,
            ZooVariant::Fixed,
            Outcome::Fail,
            MeasuredAxis::PerRequest,
            MeasuredOwner::Python,
        );
        assert_eq!(alarm.reading, Reading::Wrong);
        let elsewhere = read(
            &leak,
            ZooVariant::Leaky,
            Outcome::Fail,
            MeasuredAxis::PerNewInput,
            MeasuredOwner::Python,
        );
        assert_eq!(elsewhere.reading, Reading::Wrong);
        let unnamed = read(
            &leak,
            ZooVariant::Leaky,
            Outcome::Fail,
            MeasuredAxis::PerRequest,
            MeasuredOwner::Unknown,
        );
        assert_eq!(unnamed.reading, Reading::Missed);
        let declared = Entry {
            known_miss: "x".into(),
            known_miss_since: "e595376".into(),
            ..leak
        };
        assert!(
            !declared.accepts(Reading::Wrong),
            "a declared limit never excuses a wrong reading"
        );
    }

    #[test]
    fn an_entry_reads_as_serve_py_lists_it() {
        let json = r#"{"below_python": true, "budget": ["--capacity", "256MiB"],
            "env": {"fixed": {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "0"}},
            "fixed": {"axis": "none", "owner": "none", "verdict": "pass"}, "inputs": "shapes",
            "instruments": ["scan", "agent"],
            "leaky": {"axis": "per-new-input", "owner": "native", "verdict": "fail"},
            "must_pass": false, "name": "onednn", "reports": ["pytorch/pytorch#27971"],
            "predicted_in": "82832cb", "predicted_after_measuring": true,
            "requests": 400, "symptom": "grows", "title": "oneDNN", "warmup": 50}"#;
        let e: Entry = serde_json::from_str(json).unwrap();
        assert_eq!(
            (e.leaky.axis, e.leaky.owner, e.inputs),
            (Axis::PerNewInput, Owner::Native, Inputs::Shapes)
        );
        assert_eq!(e.env["fixed"]["ONEDNN_PRIMITIVE_CACHE_CAPACITY"], "0");
        assert_eq!(kebab(&e.leaky.axis), "per-new-input");
        let bad = json.replace("per-new-input", "sideways");
        assert!(
            serde_json::from_str::<Entry>(&bad)
                .unwrap_err()
                .to_string()
                .contains("sideways"),
            "an unknown axis is said, not guessed"
        );
    }

    #[test]
    fn the_census_agrees_when_a_holder_grows_exactly_for_python_owned_memory() {
        let grew = CensusWord::Grew {
            holders: vec![HolderFigure {
                holder: "app.state.kept".into(),
                bytes_per_request: 16384.0,
            }],
        };
        assert_eq!(census_agrees(Owner::Python, &grew), Some(true));
        assert_eq!(census_agrees(Owner::Native, &grew), Some(false));
        assert_eq!(
            census_agrees(Owner::None, &CensusWord::NoneGrew),
            Some(true)
        );
        assert_eq!(
            census_agrees(Owner::Python, &CensusWord::NoneGrew),
            Some(false)
        );
        assert_eq!(
            census_agrees(Owner::Python, &CensusWord::Missing),
            Some(false)
        );
        assert_eq!(census_agrees(Owner::Python, &CensusWord::NotAsked), None);
    }

    #[test]
    fn a_measured_axis_agrees_with_its_prediction_and_bounded_takes_any_growth_that_stopped() {
        assert!(Axis::PerNewInput.agrees(MeasuredAxis::PerNewInput, true));
        assert!(!Axis::PerNewInput.agrees(MeasuredAxis::PerRequest, false));
        assert!(Axis::Bounded.agrees(MeasuredAxis::PerNewInput, true));
        assert!(Axis::Bounded.agrees(MeasuredAxis::GivenBack, true));
        assert!(
            !Axis::Bounded.agrees(MeasuredAxis::PerNewInput, false),
            "a growth that did not stop is not bounded"
        );
        assert!(!Axis::GivenBack.agrees(MeasuredAxis::PerNewInput, true));
        assert!(
            !Axis::GivenBack.agrees(MeasuredAxis::None, false),
            "none is not given back: a flat window is a miss"
        );
        assert!(!Axis::None.agrees(MeasuredAxis::Undetermined, false));
        assert!(Axis::None.agrees(MeasuredAxis::None, false));
        assert!(Owner::Native.agrees(MeasuredOwner::Native));
        assert!(
            !Owner::Python.agrees(MeasuredOwner::Unknown),
            "unknown never agrees"
        );
    }

    #[test]
    fn a_services_line_names_its_variant_and_pid() {
        let line = "leaklab-zoo forward_hook-fixed pid 4242 listening on http://127.0.0.1:5555";
        let service = ZooService::parse(line, "forward_hook-fixed").unwrap();
        assert_eq!(
            (service.base.as_str(), service.pid),
            ("http://127.0.0.1:5555", 4242)
        );
        assert!(
            ZooService::parse(line, "forward_hook-leaky").is_none(),
            "another variant's line is not this one's"
        );
        let no_pid = "leaklab-zoo forward_hook-fixed listening on http://127.0.0.1:5555";
        assert!(ZooService::parse(no_pid, "forward_hook-fixed").is_none());
    }

    #[test]
    fn a_long_holder_keeps_its_end_in_the_table() {
        assert_eq!(shorten("app.state.kept", 64), "app.state.kept");
        let long = format!("thread 'MainThread' {}local 'hidden'", "x".repeat(80));
        let short = shorten(&long, 20);
        assert_eq!(short.chars().count(), 20);
        assert!(short.starts_with('…') && short.ends_with("local 'hidden'"));
    }
}
