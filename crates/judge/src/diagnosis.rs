//! The diagnosis beyond a slope: the axis memory grows along (per request, per new input, per
//! new thread, in another process), measured by the scan, and who owns it (a Python holder the
//! census names, native memory, another process), with the mechanism and the fix where the
//! evidence names them. General rules over measurements, not a table of known services.
//!
//! The axis comes from phases the scan drives apart: the judged requests, each a new input where
//! the bodies differ (a folder of distinct bodies, or `--vary`), then a repeat phase that sends
//! inputs already seen again. A cache keyed by input grows over the first and not over the
//! second; a per-request leak grows over both. The process tree, read process by process, says
//! which process grew and whether the threads grew with the memory.

use crate::agent::{CensusDiff, Collector, PyTrace};
pub use crate::thresholds::{
    GARBAGE_KEPT_SHARE, GIVEN_BACK_SHARE, PYTHON_SHARE, REPEAT_SHARE, SETTLED_GIVEN_BACK_SHARE,
    SETTLED_SHARE,
};
use crate::tree::{ProcessGrowth, ThreadCount};
use leaklab_detect::{NoisyJudgement, Slope, Verdict};
use leaklab_report::{human_bytes, signed_bytes};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The axis memory grows along, as measured (the zoo's vocabulary, lab/zoo/_zoo.py).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Axis {
    /// Every request adds, repeats as much as new inputs.
    PerRequest,
    /// New inputs add, repeats do not: a cache keyed by input.
    PerNewInput,
    /// The memory grows with the threads alive.
    PerNewThread,
    /// A child process grows while the scanned process does not.
    OtherProcess,
    /// It grew and held, and the allocator returned it when the trim probe asked: memory kept
    /// free by the allocator, not held by anything.
    GivenBack,
    /// It grew, and a full collection gave it back: the collector's garbage (reference cycles
    /// awaiting its next full collection), bounded by its cadence.
    Garbage,
    /// Nothing grows.
    None,
    /// It grows, and the phases could not tell along what (said why in the words).
    Undetermined,
}

impl Axis {
    pub fn words(self) -> &'static str {
        match self {
            Axis::PerRequest => "per request",
            Axis::PerNewInput => "per new input",
            Axis::PerNewThread => "per new thread",
            Axis::OtherProcess => "in another process",
            Axis::GivenBack => "given back",
            Axis::Garbage => "garbage",
            Axis::None => "none",
            Axis::Undetermined => "undetermined",
        }
    }
}

/// What the judged requests sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Inputs {
    /// Each judged request a new input (distinct bodies, or `--vary`).
    New,
    /// One body, sent again and again.
    Same,
    /// A folder of fewer bodies than requests, cycled.
    Cycled,
}

/// One phase's slope, on the series the axis is read from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Phase {
    pub requests: usize,
    pub verdict: Verdict,
    pub slope: Slope,
    pub rise_bytes: f64,
    /// The first judged sample's level, which a rise is a share of (0 in reports from before it
    /// was kept).
    #[serde(default)]
    pub level_bytes: f64,
}

impl Phase {
    pub fn of(j: &NoisyJudgement) -> Phase {
        Phase {
            requests: j.samples,
            verdict: j.verdict,
            slope: j.slope,
            rise_bytes: j.rise_bytes,
            level_bytes: j.first.1 as f64,
        }
    }
}

/// The axis, with the figures it was read from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AxisReading {
    pub axis: Axis,
    /// It grew, then stopped within the judged requests (a capacity, the distinct inputs).
    pub bounded: bool,
    /// The series the axis is read from (the deciding one).
    pub series: String,
    pub inputs: Inputs,
    /// Distinct inputs the scan had (bodies, or one varied per request).
    pub distinct_inputs: usize,
    /// The judged requests (new inputs where `inputs` is `new`).
    pub judged: Phase,
    /// The repeat phase: inputs already seen, sent again (`requests`: all it sent; its slope
    /// over all but the first tenth).
    pub repeats: Option<Phase>,
    pub threads: Option<ThreadCount>,
    /// Each process of the tree over the judged requests, the scanned one first.
    pub processes: Vec<ProcessGrowth>,
    /// The axis in a sentence, with its figures.
    pub words: String,
    /// Bodies of this many shapes cycled grew it on shapes already seen, and the growth
    /// stopped: a cache keyed by shape smaller than the shapes sent (see [`shapes`]).
    #[serde(default)]
    pub churn: Option<usize>,
}

/// Threads added over the judged requests that count as "the threads grow": at least 8, and one
/// per 20 requests (a pool that starts a few workers lazily adds fewer).
fn threads_grew(threads: Option<ThreadCount>, requests: usize) -> Option<u64> {
    let t = threads?;
    let added = t.last.saturating_sub(t.first);
    (added >= 8 && added as f64 >= requests as f64 / 20.0).then_some(added)
}

/// The most the repeats can grow a repeat: Theil–Sen's bound, or their rise's where tighter,
/// where the floor wandered (a CI run: ±228.6 kB by Theil–Sen against 298 kB a new input, slope
/// 0).
pub fn repeats_high(r: &NoisyJudgement) -> f64 {
    r.slope.high.min(r.rise_high())
}

/// What an axis's words end with where its growth stopped within the judged requests.
fn stopped_words(rise_bytes: f64) -> String {
    format!(
        "; it rose {} and stopped within the judged requests: bounded (a capacity, or the distinct inputs)",
        signed_bytes(rise_bytes)
    )
}

/// The root of the tree, where `series` sums the tree's anonymous memory and proves a growth
/// that the root's own cannot hold: the root not a leak, its slope's upper bound below the sum's
/// lower one. The rest is in the root's descendants, though each may be within its own noise
/// (two workers sharing a leak of 1 to 4 KiB a request: lab/corpus/README.md).
fn beyond_the_root<'a>(
    series: &str,
    judged: &NoisyJudgement,
    processes: &'a [ProcessGrowth],
) -> Option<&'a ProcessGrowth> {
    if series != "anonymous" || processes.len() < 2 || judged.slope.low <= 0.0 {
        return None;
    }
    let root = processes.iter().find(|p| p.root)?;
    let holds = root.bytes_per_request + root.bound;
    (root.verdict.is_some_and(|v| v != Verdict::Leak) && holds < judged.slope.low).then_some(root)
}

/// The axis from the phases. `judged`: the deciding series over the judged requests; `repeats`:
/// the same series over the repeat phase (none where it did not run).
pub fn axis(
    series: &str,
    judged: &NoisyJudgement,
    inputs: Inputs,
    distinct_inputs: usize,
    repeats: Option<&NoisyJudgement>,
    threads: Option<ThreadCount>,
    processes: Vec<ProcessGrowth>,
) -> AxisReading {
    let per = judged.slope.bytes_per_request;
    let bounded = judged.verdict == Verdict::Plateau;
    let bound_words = if bounded {
        stopped_words(judged.rise_bytes)
    } else {
        String::new()
    };
    let child = processes.iter().find(|p| p.child_leaking());
    let root_grows = processes
        .iter()
        .any(|p| p.root && p.verdict == Some(Verdict::Leak));
    let (axis, words) = if let (Some(c), false) = (child, root_grows) {
        let others = processes
            .iter()
            .filter(|p| p.root || (p.pid != c.pid && p.child_leaking()))
            .map(ProcessGrowth::line);
        let lines: Vec<String> = std::iter::once(c.line()).chain(others).collect();
        (
            Axis::OtherProcess,
            format!("{}: the growth is in another process", lines.join(", ")),
        )
    } else if let Some(root) = beyond_the_root(series, judged, &processes) {
        let rose = processes
            .iter()
            .filter(|p| p.child_rising())
            .map(ProcessGrowth::line);
        let lines: Vec<String> = std::iter::once(root.line()).chain(rose).collect();
        (
            Axis::OtherProcess,
            format!(
                "{series} of the tree {} ± {} a request, more than this process can hold at its bound: {}: the growth is in the other processes together, none past its own noise alone",
                signed_bytes(per),
                human_bytes(judged.slope.half_width()),
                lines.join(", ")
            ),
        )
    } else if judged.verdict == Verdict::Flat {
        (
            Axis::None,
            format!("{series} is flat over the judged requests"),
        )
    } else if let (Some(added), true) = (
        threads_grew(threads, judged.samples),
        judged.slope.low > 0.0,
    ) {
        let t = threads.expect("threads_grew read them");
        let per_thread = per * judged.samples as f64 / added as f64;
        (
            Axis::PerNewThread,
            format!(
                "{} per new thread: the threads alive went from {} to {} over {} requests while {series} grew {} a request",
                signed_bytes(per_thread),
                t.first,
                t.last,
                judged.samples,
                signed_bytes(per)
            ),
        )
    } else {
        match (inputs, repeats) {
            (Inputs::New, Some(r)) => {
                let r_per = r.slope.bytes_per_request;
                let figures = format!(
                    "{} per new input, {} per repeat ({} new inputs, then {} repeats of inputs already seen judged)",
                    signed_bytes(per),
                    signed_bytes(r_per),
                    judged.samples,
                    r.samples
                );
                let r_high = repeats_high(r);
                let figures = if r_high < r.slope.high {
                    format!(
                        "{figures}; the repeats rose {} in all, at most {} a repeat",
                        signed_bytes(r.rise_bytes),
                        human_bytes(r_high)
                    )
                } else {
                    figures
                };
                if r.verdict == Verdict::Leak {
                    (Axis::PerRequest, format!("{figures}: repeats grow as new inputs do, so every request adds"))
                } else if r_high < REPEAT_SHARE * per {
                    (Axis::PerNewInput, format!("{figures}: a cache keyed by input, bounded by the number of distinct inputs or by its capacity"))
                } else if r.slope.low > 0.0 {
                    // Proven to grow, as much as new inputs within its bound, though too short
                    // to prove it went on to its end: a cache keyed by input does not grow on
                    // repeats at all (calibration: every leak per request of 1 KiB read
                    // repeats' lower bounds of 244 B or more, every must-pass and per-new-input
                    // subject -865 B or less). Repeats that rose, then stopped, read so too:
                    // whatever holds it grew on requests it had seen.
                    (Axis::PerRequest, format!("{figures}: the repeats grew too (at least {} a repeat), so every request adds", human_bytes(r.slope.low)))
                } else {
                    (Axis::Undetermined, format!("{figures}: the repeats' slope (bound {} .. {}) tells neither a per-request nor a per-input growth", human_bytes(r.slope.low), human_bytes(r_high)))
                }
            }
            (Inputs::New, None) => (
                Axis::Undetermined,
                format!("{} per new input; no repeat phase ran (the time limit, or the target failing), so repeats were not measured", signed_bytes(per)),
            ),
            (Inputs::Same, _) => (
                Axis::PerRequest,
                format!("{} a request, every request the same input: it grows per request, not per new input", signed_bytes(per)),
            ),
            (Inputs::Cycled, _) => (
                Axis::PerRequest,
                format!("{} a request over {distinct_inputs} bodies cycled: it grows on inputs already seen, so per request", signed_bytes(per)),
            ),
        }
    };
    AxisReading {
        axis,
        // Another process's growth is judged on its own (a leak there, by the rule above).
        bounded: bounded && !matches!(axis, Axis::None | Axis::OtherProcess),
        series: series.to_string(),
        inputs,
        distinct_inputs,
        judged: Phase::of(judged),
        repeats: repeats.map(Phase::of),
        threads,
        processes,
        words: if matches!(axis, Axis::None | Axis::OtherProcess) {
            words
        } else {
            format!("{words}{bound_words}")
        },
        churn: None,
    }
}

/// The bodies' shapes, where they differ: said beside the axis. Where bodies of several shapes
/// were cycled and the growth stopped, when it stopped tells what memory can: before the first
/// pass through the bodies ended (request `bodies`, the warm-up's included), new shapes stopped
/// adding to it, so the cache holds fewer than the shapes sent and evicts and rebuilds them
/// (churn), its capacity bounding it, not the shapes. Stopped with the first pass, it grew on
/// new shapes only (per new input), and memory cannot tell a cache that holds them all from
/// one that rebuilds them in the memory the first pass took (the native trace can). Cycled
/// shapes that grow it without stopping are per request, not per shape. `judged` is the
/// deciding series' judgement, whose floor says when it stopped.
pub fn shapes(axis: &mut AxisReading, s: &crate::evidence::Shapes, judged: &NoisyJudgement) {
    if s.distinct < 2 || matches!(axis.axis, Axis::None | Axis::OtherProcess) {
        return;
    }
    let said = format!(
        "the {} bodies come in {} shapes (e.g. {})",
        s.bodies,
        s.distinct,
        s.examples.join("; ")
    );
    axis.words = match (axis.inputs, axis.axis, axis.bounded) {
        (Inputs::Cycled, Axis::PerRequest, true) => {
            // The first floor point within the noise of where the floor ended.
            let top = judged.floor_now as f64 - judged.noise_bytes;
            let stopped = judged
                .floor
                .iter()
                .find(|p| p.1 as f64 >= top)
                .map_or(judged.last.0, |p| p.0);
            if stopped < s.bodies as u64 {
                axis.churn = Some(s.distinct);
                format!(
                    "{said}; cycled, it stopped growing by request {stopped}, before the first pass through them ended (request {}): a cache keyed by shape that holds fewer than the {} shapes sent, evicting and rebuilding them (churn); its capacity bounds it, not the shapes (oneDNN's ONEDNN_PRIMITIVE_CACHE_CAPACITY, cuDNN's TORCH_CUDNN_V8_API_LRU_CACHE_LIMIT set it) (was: {})",
                    s.bodies, s.distinct, axis.words
                )
            } else {
                axis.axis = Axis::PerNewInput;
                format!(
                    "{said}; cycled, it stopped growing by request {stopped}, as the first pass through them ended (request {}): it grew on new shapes only, a cache keyed by input or by its shape; whether it holds them all or evicts and rebuilds them in the memory the first pass took, memory cannot tell (--native traces the rebuilds) (was: {})",
                    s.bodies, axis.words
                )
            }
        }
        (Inputs::Cycled, Axis::PerRequest, false) => format!(
            "{}; {said}: shapes already seen grow it too, so per request, not per shape",
            axis.words
        ),
        (Inputs::New, Axis::PerNewInput, _) => format!(
            "{}; {said}: a cache keyed by input or by its shape",
            axis.words
        ),
        _ => format!("{}; {said}", axis.words),
    };
}

/// A growth that rose less than [`SETTLED_SHARE`] of the memory over the judged requests, and
/// does not fail its budget, is the service settling (pages first touched, pools filled, each
/// thread's heap grown to its work): no axis. Whether it stopped does not tell the two apart:
/// settling comes in steps that thin out, and one late in the window reads as still climbing.
/// Measured on the zoo's fixed twins: rises of 0.03 to 0.64 % (0.16 to 2.23 MB) that stopped,
/// and one under CI's load still climbing at the end, `thread_per_request`'s at 2.97 kB ± 1.37 kB
/// a request over 300 (0.9 MB at that slope, 0.26 % of the ~342 MB it holds here; CI printed
/// no rise); the smallest bounded cause,
/// glibc's arenas, rose 1.53 % (9.6 MB). A growth that fails its budget keeps its axis however
/// small: a failing verdict needs its reason, and more judged requests lift a slow leak over
/// the share.
pub fn settled(axis: &mut AxisReading, fails: bool) {
    let judged = &axis.judged;
    if fails
        || matches!(axis.axis, Axis::None | Axis::OtherProcess)
        || judged.rise_bytes >= SETTLED_SHARE * judged.level_bytes.max(1.0)
    {
        return;
    }
    let rise = rose(&axis.series, judged.rise_bytes, judged.level_bytes);
    axis.words = if judged.verdict == Verdict::Leak {
        format!(
            "{rise} over the judged requests, still climbing at the end ({} a request) and within its budget: no more than a service settling rises, too little to read an axis from (more judged requests tell a slow leak from settling; was: {})",
            signed_bytes(judged.slope.bytes_per_request),
            axis.words
        )
    } else {
        format!("{rise} and stopped: the service settling, not growth")
    };
    axis.axis = Axis::None;
    axis.bounded = false;
}

/// A growth that stopped, all of which the trim probe's `malloc_trim(0)` returned, is the
/// allocator keeping free memory (glibc's arenas), not a holder: the axis becomes `given-back`;
/// under [`SETTLED_GIVEN_BACK_SHARE`] of the memory, the service settling: no axis.
/// The collector's share is garbage, not this (said as the probe's finding).
pub fn given_back(axis: &mut AxisReading, trim: &crate::agent::Trim) {
    // The probe trims the agent's process: growth elsewhere (a child, per-thread state) is not
    // what it returns.
    if !matches!(
        axis.axis,
        Axis::PerNewInput | Axis::PerRequest | Axis::Undetermined
    ) {
        return;
    }
    let returned = trim.allocator_returned() as f64;
    let rise = axis.judged.rise_bytes;
    if !axis.bounded || rise <= 0.0 {
        return;
    }
    let level = axis.judged.level_bytes;
    if returned < GIVEN_BACK_SHARE * rise {
        if returned > 0.0 {
            axis.words = format!(
                "{}; malloc_trim(0) returned {} when asked ({:.0} % of the rise, free memory the allocator kept), too little to say nothing holds the growth",
                axis.words,
                human_bytes(returned),
                100.0 * returned / rise
            );
        }
    } else if rise < SETTLED_GIVEN_BACK_SHARE * level {
        // Less than the free memory every such service keeps: no axis, as a smaller rise.
        axis.words = format!(
            "{} and held; malloc_trim(0) then returned {}: the service settling into free memory the allocator keeps, not growth (was: {})",
            rose(&axis.series, rise, level),
            human_bytes(returned),
            axis.words
        );
        axis.axis = Axis::None;
        axis.bounded = false;
    } else {
        axis.words = format!(
            "it rose {} and held; malloc_trim(0) then returned {} ({:.0} % of the rise): the allocator kept free memory, nothing holds it (was: {})",
            signed_bytes(rise),
            human_bytes(returned),
            100.0 * returned / rise,
            axis.words
        );
        axis.axis = Axis::GivenBack;
    }
}

/// "`series` rose X (Y % of its Z)": a rise as a share of the level it rose from.
fn rose(series: &str, rise: f64, level: f64) -> String {
    format!(
        "{series} rose {} ({:.2} % of its {})",
        signed_bytes(rise),
        100.0 * rise / level.max(1.0),
        human_bytes(level)
    )
}

/// Where the growing memory lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Owner {
    /// Tensors reachable from a Python root the census names.
    Python,
    /// Not tensors reachable from Python: a library's cache, the allocator, per-thread state.
    Native,
    /// A child process of the scanned one.
    OtherProcess,
    /// Nothing grows.
    None,
    /// Not told apart: without the agent's census the scan cannot tell Python from native.
    Unknown,
}

/// Who owns the growth, the mechanism and the fix, as far as the evidence goes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OwnerReading {
    pub owner: Owner,
    /// The census's holder that grew most, from its root.
    pub holder: Option<String>,
    /// The census's bytes a request over the scan's (the deciding series').
    pub census_share: Option<f64>,
    pub words: String,
    pub mechanism: String,
    /// The change that fixes it: a knob, a call, a code change.
    pub fix: String,
    /// The process state that explains a cause (the collector disabled).
    pub findings: Vec<String>,
}

/// The census's kind for tensors it reached from no Python referrer (leaklab/_unreached.py).
pub const NATIVE_KIND: &str = "native";

/// The census's kind for tensors held by reference cycles that nothing reaches
/// (leaklab/_unreached.py): garbage that the collector frees at its next full collection, where
/// it is enabled.
pub const GARBAGE_KIND: &str = "unreachable cycle";

/// A failing growth that full collections gave back ([`crate::judge`]): after the trim probe's
/// `gc.collect()` and `malloc_trim(0)` before the warm-up and after the judged requests, the
/// series kept no more than `allowance` over the `requests` between them.
#[derive(Debug, Clone, PartialEq)]
pub struct Garbage {
    pub series: String,
    pub kept: i64,
    pub requests: u64,
    pub allowance: f64,
}

/// A host series that read a plateau while the agent's census, over the requests after the
/// judged ones, saw the tensors reachable from Python go on growing: the allocator's free
/// memory took the growth for a while (a pause in the pages touched, not in what is kept).
#[derive(Debug, Clone, PartialEq)]
pub struct Continued {
    pub series: String,
    /// The census's net growth (every tensor's bytes, after minus before) and its steps.
    pub bytes: i64,
    pub steps: u64,
}

impl Continued {
    pub fn bytes_per_request(&self) -> f64 {
        self.bytes as f64 / self.steps.max(1) as f64
    }
}

/// The axis of a plateau the census shows went on: not bounded.
pub fn continued(axis: &mut AxisReading, c: &Continued) {
    let stopped = stopped_words(axis.judged.rise_bytes);
    let words = axis.words.strip_suffix(&stopped).unwrap_or(&axis.words);
    axis.words = format!(
        "{words}; its pages stopped growing within the judged requests (+{} in all), but the agent's census, over the {} requests after them, saw the tensors reachable from Python grow {} ({} a request): what is kept did not stop, the allocator's free memory took it for a while",
        human_bytes(axis.judged.rise_bytes),
        c.steps,
        signed_bytes(c.bytes as f64),
        signed_bytes(c.bytes_per_request()),
    );
    axis.bounded = false;
}

/// The axis of a growth that full collections gave back: the collector's garbage.
pub fn garbage(axis: &mut AxisReading, g: &Garbage, collector: Option<&Collector>) {
    let cadence = collector
        .filter(|c| c.thresholds.len() == 3)
        .map_or(String::new(), |c| {
            format!(
                " (thresholds {}, {}, {})",
                c.thresholds[0], c.thresholds[1], c.thresholds[2]
            )
        });
    axis.words = format!(
        "{} rose {} over the judged requests ({} a request); after a full collection and malloc_trim(0) before the warm-up and again after the judged requests it kept {} over the {} requests between them, within the {} allowed: the collector's garbage, given back at its full collections{cadence}, not a leak",
        axis.series,
        signed_bytes(axis.judged.rise_bytes),
        signed_bytes(axis.judged.slope.bytes_per_request),
        signed_bytes(g.kept as f64),
        g.requests,
        human_bytes(g.allowance),
    );
    axis.axis = Axis::Garbage;
    axis.bounded = false;
}

/// Whether Python owns a growth of which the census holds `share`, its top holder having gained
/// `tensors_per_step` tensors a request (or call): a quarter of the bytes, or an eighth where
/// the holder keeps a tensor at least every other request. The census counts tensors' storage,
/// not their objects nor what malloc keeps beside them, and for small tensors that is most of
/// it: the twin's refs-leaky keeps 16.38 kB of storage a request and its process grew 66.42 kB
/// (a 31-minute watch, 5,316 requests; 1.0 to 4.04 times in the scan's runs, docs/scan.md).
pub fn python_owns(share: f64, tensors_per_step: f64) -> bool {
    share >= PYTHON_SHARE || (share >= PYTHON_SHARE / 2.0 && tensors_per_step >= 0.5)
}

/// The owner from the axis, the census and the collector's state.
pub fn owner(
    axis: &AxisReading,
    census: Option<&CensusDiff>,
    collector: Option<&Collector>,
) -> OwnerReading {
    owner_kept(axis, census, collector, None, &Elsewhere::nothing(), &[])
}

/// [`owner`], where `kept` is what the memory kept a request through full collections before the
/// warm-up and after the judged requests (the trim probe's, [`crate::evidence::Collected`]):
/// with it, garbage is ruled out or not by measurement, not by the census's share. `elsewhere`:
/// the service's other processes' agents and censuses (where a growth in one is owned);
/// `libraries`: the shared libraries the process has mapped, which name a native mechanism as
/// likely.
pub fn owner_kept(
    axis: &AxisReading,
    census: Option<&CensusDiff>,
    collector: Option<&Collector>,
    kept: Option<f64>,
    elsewhere: &Elsewhere,
    libraries: &[String],
) -> OwnerReading {
    let step = "request";
    let native = native_mechanism(axis, libraries);
    // Each process's census counts, where the service's processes serve agents of their own (a
    // worker pool's growth is spread over its workers, each keeping its share).
    let own_pid = census.and_then(|c| c.pid);
    let merged = crate::agent::merged(census, elsewhere.censuses);
    let census = merged.as_ref();
    let weighed = census_owner(
        &Weighed {
            per_step: axis.judged.slope.bytes_per_request,
            step,
            steps: None,
            kept,
            python_mechanism: format!(
                "a Python holder reachable from a root keeps what each {step} leaves"
            ),
            native: (native.0.as_str(), native.1.as_str()),
            without: (
                "Python or native: not told apart without the agent's census (mount it and scan with --agent)",
                "scan again with --agent to name the owner, and with --collect to tell garbage the collector frees from a leak",
            ),
        },
        census,
        collector,
    );
    match axis.axis {
        // Not "nothing grows": a growth read as the service settling has a slope of its own.
        Axis::None => weighed.instead(
            Owner::None,
            "no growth to own (the axis: flat, or the service settling)".into(),
            "none",
            "none needed".into(),
        ),
        Axis::Garbage => {
            let cycle = census.and_then(|c| c.grown.iter().find(|g| g.kind == GARBAGE_KIND));
            let words = match cycle {
                Some(g) => format!(
                    "reference cycles that nothing reaches, awaiting the collector: `{}` grew most",
                    g.holder
                ),
                None => "reference cycles that nothing reaches, awaiting the collector".into(),
            };
            let holder = cycle.map(|g| g.holder.clone());
            let mut reading = weighed.instead(
                Owner::Python,
                words,
                "reference cycles made per request wait for the collector's next full collection: on a large heap it runs only once the objects that outlived its young collections reach a quarter of its oldest generation, thousands of requests apart",
                "none needed: the collector bounds it; to keep the peak lower, break the cycle so that reference counting frees it at once (a weakref for the back-reference, or clear it when done), or gc.freeze() after start-up so that full collections scan less and come sooner".into(),
            );
            reading.holder = holder;
            reading
        }
        Axis::OtherProcess => {
            let mut grew: Vec<&ProcessGrowth> = axis
                .processes
                .iter()
                .filter(|p| p.child_leaking())
                .collect();
            if grew.is_empty() {
                // None grew past its own noise (the tree's sum read it): those that rose.
                grew = axis.processes.iter().filter(|p| p.child_rising()).collect();
            }
            other_process(weighed, &grew, "scan", elsewhere)
        }
        _ => held_in(weighed, elsewhere, own_pid),
    }
}

/// A Python owner's words say which of the service's processes hold it, where their censuses
/// were taken through their own agents; not where the one that holds it is the process whose
/// census the scan took anyway (`own`: a service of one process, its workers folder set).
pub(crate) fn held_in(
    reading: OwnerReading,
    elsewhere: &Elsewhere,
    own: Option<u32>,
) -> OwnerReading {
    let Some(holder) = reading
        .holder
        .as_deref()
        .filter(|_| reading.owner == Owner::Python)
    else {
        return reading;
    };
    let pids = crate::agent::holding(elsewhere.censuses, holder);
    if pids.is_empty() || (pids.len() == 1 && Some(pids[0]) == own) {
        return reading;
    }
    let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
    let words = format!(
        "{}, in process{} {} of the service (each census taken in its own process, through the agent it serves)",
        reading.words,
        if pids.len() == 1 { "" } else { "es" },
        pids.join(" and ")
    );
    OwnerReading { words, ..reading }
}

/// The owner of a growth in processes beside the serving ones (workers, children), `grew` those
/// that grew, for the scan and the watch alike; `tool`, the command that looks inside one.
pub fn other_process(
    weighed: OwnerReading,
    grew: &[&ProcessGrowth],
    tool: &str,
    elsewhere: &Elsewhere,
) -> OwnerReading {
    let agents = elsewhere.agents;
    // The ones that serve an agent of their own and whose census was taken: the owner inside
    // them, by the one rule, their censuses summed and weighed against their growth summed
    // (LitServe's workers share the requests, each keeping its own part).
    let looked: Vec<&ProcessGrowth> = grew
        .iter()
        .copied()
        .filter(|g| elsewhere.censuses.contains_key(&g.pid))
        .collect();
    if !looked.is_empty() {
        let censuses: BTreeMap<u32, CensusDiff> = looked
            .iter()
            .map(|g| (g.pid, elsewhere.censuses[&g.pid].clone()))
            .collect();
        let census = crate::agent::merged(None, &censuses);
        let inside = census_owner(
            &Weighed {
                per_step: looked.iter().map(|g| g.bytes_per_request).sum(),
                step: "request",
                steps: None,
                kept: None,
                python_mechanism:
                    "a Python holder in a worker process keeps what each request gives it".into(),
                native: NATIVE_PER_REQUEST,
                without: ("", ""),
            },
            census.as_ref(),
            None,
        );
        let who = match looked.as_slice() {
            [g] => format!(
                "process {} ({}), whose own agent{} answered",
                g.pid,
                g.command,
                agents
                    .get(&g.pid)
                    .map_or(String::new(), |u| format!(" at {u}"))
            ),
            _ => format!(
                "processes {} ({}), whose own agents answered (their censuses summed)",
                looked
                    .iter()
                    .map(|g| g.pid.to_string())
                    .collect::<Vec<_>>()
                    .join(" and "),
                looked[0].command
            ),
        };
        return OwnerReading {
            owner: Owner::OtherProcess,
            words: format!("{who}: {}", inside.words),
            ..inside
        };
    }
    let first = grew.first();
    let who = first.map_or("another process of the service".into(), |c| {
        format!("process {} ({})", c.pid, c.command)
    });
    let pid = first.map_or(0, |c| c.pid);
    let fix = match agents.get(&pid) {
        // A worker that serves the agent itself (leaklab.serve_agent()): its census is a scan away.
        Some(url) => format!("look inside that process through the agent it serves: leaklab {tool} … --pid {pid} --agent {url} (its census names the holder)"),
        None => format!("look inside that process: leaklab {tool} --pid {pid} (its census, where it serves the agent: leaklab.serve_agent() in a worker that serves no HTTP)"),
    };
    weighed.instead(
        Owner::OtherProcess,
        format!("{who}: the serving processes' own memory is flat, so a census inside them finds nothing"),
        "a worker process of the service keeps what the requests give it",
        fix,
    )
}

/// What the scan knows of the service's other processes: the agents its workers serve of their
/// own (`leaklab.serve_agent()`), by PID, and the census difference of each, where taken.
#[derive(Clone, Copy)]
pub struct Elsewhere<'a> {
    pub agents: &'a BTreeMap<u32, String>,
    pub censuses: &'a BTreeMap<u32, CensusDiff>,
}

impl Elsewhere<'_> {
    /// Nothing known of other processes.
    pub fn nothing() -> Elsewhere<'static> {
        static AGENTS: BTreeMap<u32, String> = BTreeMap::new();
        static CENSUSES: BTreeMap<u32, CensusDiff> = BTreeMap::new();
        Elsewhere {
            agents: &AGENTS,
            censuses: &CENSUSES,
        }
    }
}

/// What a census is weighed against: the memory's growth a step, by the axis's own rate.
pub struct Weighed<'a> {
    /// Bytes the memory grew a step.
    pub per_step: f64,
    /// What a step is, in the words ("request", "call", "second").
    pub step: &'a str,
    /// The steps between the two censuses, where they are not the census's own count of
    /// requests (the watch's seconds, for a growth by the clock).
    pub steps: Option<f64>,
    /// What the memory kept a step through full collections at both ends, where measured
    /// ([`crate::evidence::Collected`]).
    pub kept: Option<f64>,
    /// The mechanism where a Python holder owns it.
    pub python_mechanism: String,
    /// The mechanism and the fix where the growth is native and nothing names it.
    pub native: (&'a str, &'a str),
    /// The words and the fix where there is no census to tell Python from native.
    pub without: (&'a str, &'a str),
}

impl OwnerReading {
    /// Another owner than the census's rule reads, its holder, share and findings kept (an axis
    /// that says where the growth is without a census: nowhere, another process).
    pub fn instead(
        self,
        owner: Owner,
        words: String,
        mechanism: &str,
        fix: String,
    ) -> OwnerReading {
        OwnerReading {
            owner,
            words,
            mechanism: mechanism.to_string(),
            fix,
            ..self
        }
    }
}

/// Python objects that hold no tensor, where the agent's Python trace (tracemalloc over a window
/// of requests) kept at least [`PYTHON_SHARE`] of what the memory grew a request: a native
/// reading (the census found no tensor holding it) becomes Python, named by the line that
/// allocated most of what was kept. Any other reading stands.
pub fn python_objects(owner: OwnerReading, per_step: f64, trace: &PyTrace) -> OwnerReading {
    let Some(kept) = trace.kept_per_request() else {
        return owner;
    };
    if owner.owner != Owner::Native || per_step <= 0.0 {
        return owner;
    }
    if kept < PYTHON_SHARE * per_step {
        // Native stands, and says what it ruled out.
        return OwnerReading {
            words: format!(
                "{}; Python objects ruled out: the agent's Python trace (tracemalloc, {} requests) kept {} a request of the {} (under a quarter)",
                owner.words,
                trace.requests,
                human_bytes(kept),
                human_bytes(per_step)
            ),
            ..owner
        };
    }
    let line = trace.top_line().unwrap_or_else(|| "an unnamed line".into());
    owner.instead(
        Owner::Python,
        format!(
            "no tensor holds it, Python objects do: the agent's Python trace (tracemalloc, {} requests) kept {} of {} a request, most allocated at {line}",
            trace.requests,
            human_bytes(kept),
            human_bytes(per_step)
        ),
        "Python objects kept for every request that hold no tensor (a registry's or a metric's entries per key, per-user state, handlers or records appended and never dropped): the tensor census cannot see them",
        format!("stop keeping what {line} allocates for each request, or bound it (a cap on distinct keys, an LRU, a TTL)"),
    )
}

/// The one rule for Python against native, for the scan, the watch and the plugin alike: Python
/// owns a growth where the census's top holder grew and the census holds enough of what the
/// memory grew ([`python_owns`]); tensors held from native code are not Python's; a disabled
/// collector is said, and names the mechanism where Python owns it.
pub fn census_owner(
    w: &Weighed,
    census: Option<&CensusDiff>,
    collector: Option<&Collector>,
) -> OwnerReading {
    let mut findings = Vec::new();
    let gc_off = collector.is_some_and(|c| !c.enabled);
    if gc_off {
        findings.push("gc is disabled in the process (gc.disable()): reference cycles are never collected, whatever they hold".to_string());
    }
    let (per, step) = (w.per_step, w.step);
    let steps = |c: &CensusDiff| w.steps.unwrap_or(c.steps as f64).max(1.0);
    // Tensors the census found held from native code (no Python referrer) are not Python's;
    // nor, where the collector runs, those in cycles nothing reaches (its garbage, which it
    // frees): Python's share is what every tensor gained less those.
    let gc_on = collector.is_some_and(|c| c.enabled);
    let garbage = |g: &&crate::agent::Growth| gc_on && g.kind == GARBAGE_KIND;
    let held = census.map(|c| c.total_bytes as f64 / steps(c));
    let native_held = census.map_or(0.0, |c| c.native_bytes() / steps(c));
    let garbage_held = census.map_or(0.0, |c| {
        c.grown
            .iter()
            .filter(garbage)
            .map(|g| g.bytes.max(0) as f64)
            .sum::<f64>()
            / steps(c)
    });
    let share = held
        .filter(|_| per > 0.0)
        .map(|h| (h - native_held - garbage_held).max(0.0) / per);
    let top = census.and_then(|c| c.python_grown().find(|g| !garbage(g)));
    let reading = |owner, words: String, mechanism: &str, fix: &str| OwnerReading {
        owner,
        holder: top.map(|g| g.holder.clone()),
        census_share: share,
        words,
        mechanism: mechanism.to_string(),
        fix: fix.to_string(),
        findings: findings.clone(),
    };
    let share_words = |held: f64| {
        format!(
            "the census holds {} of {} a {step}",
            human_bytes(held.max(0.0)),
            human_bytes(per)
        )
    };
    match (census, held, share) {
        (Some(c), Some(held), Some(s))
            if top.is_some_and(|t| python_owns(s, t.tensors as f64 / steps(c))) =>
        {
            let holder = top.expect("a Python holder grew");
            let mechanism = if gc_off {
                "reference cycles kept because the collector is disabled".to_string()
            } else {
                w.python_mechanism.clone()
            };
            let fix = if gc_off {
                "gc.enable() (or gc.collect() on a schedule), or break the cycle".to_string()
            } else {
                holder.fix(step)
            };
            reading(
                Owner::Python,
                format!(
                    "{}: `{}` ({}) grew most",
                    share_words(held),
                    holder.holder,
                    holder.kind_words()
                ),
                &mechanism,
                &fix,
            )
        }
        (Some(_), Some(held), _)
            if per > 0.0
                && garbage_held >= PYTHON_SHARE * per
                && w.kept.is_none_or(|k| k <= GARBAGE_KEPT_SHARE * per) =>
        {
            reading(
            Owner::Python,
            format!(
                "{}, {} of it in reference cycles that nothing reaches, awaiting the collector (its garbage, which a full collection frees): not a holder's",
                share_words(held),
                human_bytes(garbage_held)
            ),
            "reference cycles made per request, awaiting the collector's next full collection: garbage, unless memory grows beyond what the collector gives back",
            "`leaklab scan --collect` (the agent's allow_trim) measures what a full collection gives back before the warm-up and after the judged requests; to free the cycles at once, break them (a weakref for the back-reference, or clear it when done)",
        )
        }
        (Some(_), Some(held), _) => {
            let (mechanism, fix) = if native_held >= PYTHON_SHARE * per && per > 0.0 {
                ("tensors kept alive from native code with no Python referrer (a C++ reference cycle, such as an autograd graph that holds its own input after backward(create_graph=True))", "break the cycle where the tensors are made (for create_graph, clear the inputs' .grad or use torch.autograd.grad with inputs=), and --native names the allocating stacks")
            } else {
                w.native
            };
            let mut from_native = if native_held > 0.0 {
                format!(
                    " ({} of it held from native code, no Python referrer)",
                    human_bytes(native_held)
                )
            } else {
                String::new()
            };
            if garbage_held > 0.0 {
                from_native.push_str(&format!(
                    " ({} of it in cycles awaiting the collector: its garbage, not counted)",
                    human_bytes(garbage_held)
                ));
            }
            if let Some(k) = w.kept {
                from_native.push_str(&format!(
                    "; through full collections before the warm-up and after the judged requests it kept {} a {step}, so it is not the collector's garbage",
                    signed_bytes(k)
                ));
            }
            reading(
                Owner::Native,
                format!("{}{from_native}; the rest is not tensors reachable from Python (native memory: a library's cache, the allocator, per-thread state; or Python objects other than tensors)", share_words(held)),
                mechanism,
                fix,
            )
        }
        _ => reading(
            Owner::Unknown,
            w.without.0.into(),
            "not named without the agent",
            w.without.1,
        ),
    }
}

/// Native memory kept per request, and what names it.
const NATIVE_PER_REQUEST: (&str, &str) = (
    "native memory kept per request, reachable from no Python tensor",
    "--native (the agent's native trace) names the allocating stacks",
);

/// Libraries whose mapping in the process names a native cache keyed by input as likely: a
/// part of the library's file name, and the cache.
const CACHES: [(&str, &str); 4] = [
    (
        "libtorch_cpu",
        "oneDNN's primitive cache (PyTorch builds oneDNN into libtorch_cpu.so)",
    ),
    ("libcudnn", "cuDNN's execution-plan cache (libcudnn)"),
    ("onnxruntime", "ONNX Runtime's arena (onnxruntime)"),
    ("tokenizers", "a tokenizer's cache (the tokenizers library)"),
];

/// What native growth along `axis` usually is, and what to do about it, named as likely from
/// the axis (and the bodies' shapes, and the `libraries` the process has mapped, where they
/// name a cache); the native trace (`--native`) names the stacks where the agent allows it.
fn native_mechanism(axis: &AxisReading, libraries: &[String]) -> (String, String) {
    let loaded: Vec<&str> = CACHES
        .iter()
        .filter(|(needle, _)| libraries.iter().any(|l| l.contains(needle)))
        .map(|(_, cache)| *cache)
        .collect();
    let (caches, from) = if loaded.is_empty() {
        (
            "a per-shape kernel cache such as oneDNN's primitive cache or cuDNN's plan cache, a tokenizer's cache".to_string(),
            "",
        )
    } else {
        (
            format!("of the libraries loaded: {}", loaded.join("; ")),
            " and the libraries loaded",
        )
    };
    if let Some(shapes) = axis.churn {
        return (
            format!("likely a per-shape kernel cache that holds fewer than the {shapes} shapes sent ({caches}): it evicts and rebuilds them (churn); named from the axis, the shapes{from}, not traced (--native names it from its frames)"),
            format!("raise the cache's capacity above the {shapes} shapes' kernels (oneDNN: ONEDNN_PRIMITIVE_CACHE_CAPACITY; cuDNN: TORCH_CUDNN_V8_API_LRU_CACHE_LIMIT), or bucket or pad the inputs to fewer shapes than it holds"),
        );
    }
    let (mechanism, fix) = match axis.axis {
        Axis::PerNewInput => (
            format!("likely a native cache keyed by input ({caches}): named from the axis{from}, not traced"),
            "bucket or pad inputs to a few shapes, or cap the cache (oneDNN: ONEDNN_PRIMITIVE_CACHE_CAPACITY, LRU_CACHE_CAPACITY; cuDNN: TORCH_CUDNN_V8_API_LRU_CACHE_LIMIT); --native names the allocating stacks",
        ),
        Axis::PerNewThread => (
            "native per-thread state kept by every thread that ran the model (allocator arenas, thread-local caches)".to_string(),
            "run the model on a fixed pool of threads, not a thread per request (MALLOC_ARENA_MAX bounds glibc's arenas)",
        ),
        Axis::GivenBack => (
            "the allocator keeps freed memory for reuse (glibc's arenas, one per thread that allocates)".to_string(),
            "nothing leaks; to return it: malloc_trim(0) after bursts, MALLOC_ARENA_MAX=2, or a pinned M_MMAP_THRESHOLD",
        ),
        _ => (NATIVE_PER_REQUEST.0.to_string(), NATIVE_PER_REQUEST.1),
    };
    (mechanism, fix.to_string())
}

/// The report's first lines: verdict, axis, owner, mechanism, fix.
pub fn first_lines(verdict: &str, axis: &AxisReading, owner: &OwnerReading) -> Vec<String> {
    first_lines_per(verdict, axis, owner, "request")
}

/// [`first_lines`], the axis said per `step` where it is per request ("per call": a check).
pub fn first_lines_per(
    verdict: &str,
    axis: &AxisReading,
    owner: &OwnerReading,
    step: &str,
) -> Vec<String> {
    let mut axis_words = match axis.axis {
        Axis::PerRequest => format!("per {step}"),
        other => other.words().to_string(),
    };
    if axis.bounded {
        axis_words.push_str(", bounded");
    }
    let mut lines = vec![
        format!("verdict:   {verdict}"),
        format!("axis:      {axis_words}: {}", axis.words),
        format!("owner:     {}: {}", kebab(owner.owner), owner.words),
    ];
    if axis.axis != Axis::None {
        lines.push(format!("mechanism: {}", owner.mechanism));
        lines.push(format!("fix:       {}", owner.fix));
    }
    lines.extend(owner.findings.iter().map(|f| format!("finding:   {f}")));
    lines
}

/// A serde name as JSON writes it ("per-new-input").
pub fn kebab<T: Serialize>(value: T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use leaklab_detect::{judge_noisy, NoisyConfig, Sample};

    fn judged(per: impl Fn(u64) -> i64, n: u64) -> NoisyJudgement {
        let s: Vec<Sample> = (0..n)
            .map(|i| {
                (
                    i,
                    300_000_000 + per(i) + ((i * 2_654_435_761) % 30_000) as i64,
                )
            })
            .collect();
        let mut config = NoisyConfig::new(0);
        config.quantum_bytes = crate::thresholds::HOST_NOISE_FLOOR;
        judge_noisy(&s, &config).unwrap()
    }

    #[test]
    fn python_objects_the_trace_kept_make_a_native_reading_python_and_a_request_in_flight_does_not()
    {
        use crate::agent::TracedLine;
        let native = || OwnerReading {
            owner: Owner::Native,
            holder: None,
            census_share: Some(0.0),
            words: "the census holds 0 B".into(),
            mechanism: String::new(),
            fix: String::new(),
            findings: Vec::new(),
        };
        let line = |file: &str, bytes: i64, blocks: i64| TracedLine {
            file: file.into(),
            line: 25,
            bytes,
            blocks,
        };
        // The zoo's metrics_label_cardinality as read on 2026-12-07: 88 requests, 4.4 kB each
        // in lines of ~30 blocks a request, against 6.5 kB a request of anonymous memory.
        let trace = PyTrace {
            requests: 88,
            seconds: 1.0,
            kept_bytes: 88 * 4_400,
            kept_blocks: 88 * 30,
            between_requests: true,
            top: vec![line(
                "/venv/prometheus_client/values.py",
                88 * 4_400,
                88 * 30,
            )],
            note: None,
        };
        let read = python_objects(native(), 6_530.0, &trace);
        assert_eq!(read.owner, Owner::Python);
        assert!(
            read.words.contains("prometheus_client/values.py:25"),
            "{}",
            read.words
        );
        assert!(
            read.fix.contains("prometheus_client/values.py:25"),
            "{}",
            read.fix
        );
        let beside = python_objects(native(), 100_000.0, &trace);
        assert_eq!(
            beside.owner,
            Owner::Native,
            "4.4 kB of 100 kB a request is beside the point"
        );
        assert!(
            beside
                .words
                .contains("Python objects ruled out: the agent's Python trace (tracemalloc, 88 requests) kept 4.40 kB a request"),
            "{}",
            beside.words
        );
        // A request's input in flight at one snapshot: 1.34 MB in 2 blocks (onnxruntime_arena).
        let in_flight = PyTrace {
            top: vec![line("/zoo/onnxruntime_arena.py", 1_335_392, 2)],
            ..trace.clone()
        };
        assert_eq!(
            python_objects(native(), 6_530.0, &in_flight).owner,
            Owner::Native
        );
        let python = OwnerReading {
            owner: Owner::Python,
            ..native()
        };
        assert_eq!(
            python_objects(python.clone(), 6_530.0, &trace),
            python,
            "only a native reading changes"
        );
    }

    #[test]
    fn new_inputs_that_grow_and_repeats_that_do_not_are_a_cache_keyed_by_input() {
        let new = judged(|i| 200_000 * i as i64, 300);
        let flat = judged(|_| 0, 150);
        let a = axis(
            "anonymous",
            &new,
            Inputs::New,
            400,
            Some(&flat),
            None,
            vec![],
        );
        assert_reads(&a, Axis::PerNewInput, false);
        assert!(a.words.contains("per repeat"), "{}", a.words);
        // A cache that filled within the new inputs: per new input, bounded.
        let filled = judged(|i| 200_000 * i.min(120) as i64, 300);
        let b = axis(
            "anonymous",
            &filled,
            Inputs::New,
            400,
            Some(&flat),
            None,
            vec![],
        );
        assert_reads(&b, Axis::PerNewInput, true);
        // Repeats that grow as new inputs do: per request.
        let again = judged(|i| 200_000 * i as i64, 150);
        let c = axis(
            "anonymous",
            &new,
            Inputs::New,
            400,
            Some(&again),
            None,
            vec![],
        );
        assert_eq!(c.axis, Axis::PerRequest);
        // Repeats that settle a little (not a leak, far under half): still per new input.
        let settling = judged(|i| 20_000 * i.min(40) as i64, 150);
        let g = axis(
            "anonymous",
            &new,
            Inputs::New,
            400,
            Some(&settling),
            None,
            vec![],
        );
        assert_eq!(g.axis, Axis::PerNewInput, "{}", g.words);
        // Repeats that rose as fast as new inputs, then stopped: they grew on inputs already
        // seen, so per request.
        let halfway = judged(|i| 200_000 * i.min(100) as i64, 150);
        assert_ne!(halfway.verdict, Verdict::Leak);
        let h = axis(
            "anonymous",
            &new,
            Inputs::New,
            400,
            Some(&halfway),
            None,
            vec![],
        );
        assert_eq!(h.axis, Axis::PerRequest, "{}", h.words);
        // Repeats proven to grow that kept pace to their end, too noisy to prove it there (a
        // leak of 1 KiB a request under a 64 KiB floor): per request.
        let slow_new = judged(|i| 1_200 * i as i64 + (i as i64 % 4) * 30_000, 1000);
        let slow = judged(|i| 1_200 * i as i64 + (i as i64 % 4) * 30_000, 450);
        let s = axis(
            "anonymous",
            &slow_new,
            Inputs::New,
            1000,
            Some(&slow),
            None,
            vec![],
        );
        assert_ne!(slow.verdict, Verdict::Leak, "{slow:?}");
        assert!(slow.slope.low > 0.0, "{slow:?}");
        assert_eq!(s.axis, Axis::PerRequest, "{}", s.words);
        // Repeats whose floor wanders 0-4 MB from window to window around a flat level (a CI
        // run's oneDNN scan: slope 0, Theil–Sen's bound ±228.6 kB against 298 kB a new input):
        // their rise bounds them, so per new input; the same wander on repeats that climb half
        // as fast as new inputs is not.
        let wander = |i: u64| {
            let mut k = (i / 8 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            k ^= k >> 29;
            (k.wrapping_mul(0xBF58_476D_1CE4_E5B9) >> 32) as i64 % 4_000_000
        };
        let wide = judged(|i| 300_000 * i as i64, 400);
        let wandering = judged(wander, 180);
        assert!(
            wandering.slope.high >= REPEAT_SHARE * 300_000.0,
            "{wandering:?}"
        );
        let w = axis(
            "rss",
            &wide,
            Inputs::New,
            420,
            Some(&wandering),
            None,
            vec![],
        );
        assert_eq!(w.axis, Axis::PerNewInput, "{}", w.words);
        assert!(w.words.contains("the repeats rose"), "{}", w.words);
        let half = judged(|i| 150_000 * i as i64 + wander(i), 180);
        let x = axis("rss", &wide, Inputs::New, 420, Some(&half), None, vec![]);
        assert_ne!(x.axis, Axis::PerNewInput, "{}", x.words);
        // Repeats that wander ten times as far, proving no growth and ruling out none as large
        // as new inputs: neither, said so.
        let aimless = judged(|i| 10 * wander(i), 180);
        let u = axis("rss", &wide, Inputs::New, 420, Some(&aimless), None, vec![]);
        assert!(aimless.slope.low <= 0.0, "{aimless:?}");
        assert_eq!(u.axis, Axis::Undetermined, "{}", u.words);
        // The same body every time: per request, without a repeat phase.
        let d = axis("anonymous", &new, Inputs::Same, 1, None, None, vec![]);
        assert_eq!(d.axis, Axis::PerRequest);
        // Nothing grows: none, whatever else.
        let e = axis("anonymous", &flat, Inputs::New, 400, None, None, vec![]);
        assert_reads(&e, Axis::None, false);
        // New inputs with no repeat phase: not guessed.
        let f = axis("anonymous", &new, Inputs::New, 400, None, None, vec![]);
        assert_eq!(f.axis, Axis::Undetermined);
    }

    #[test]
    fn cycled_shapes_that_grow_then_stop_are_a_cache_smaller_than_the_shapes() {
        let shapes = crate::evidence::Shapes {
            bodies: 120,
            distinct: 120,
            examples: vec!["image: 3×64×64".into(), "image: 3×64×71".into()],
        };
        // The axis over 120 bodies cycled, before the shapes are read.
        let cycled =
            |j: &NoisyJudgement| axis("anonymous", j, Inputs::Cycled, 120, None, None, vec![]);
        // Cycled over 120 bodies: rose 200 kB a request for 65 requests, then held.
        let filled = judged(|i| 200_000 * i.min(65) as i64, 400);
        let mut a = cycled(&filled);
        assert_reads(&a, Axis::PerRequest, true);
        super::shapes(&mut a, &shapes, &filled);
        assert_eq!(a.churn, Some(120));
        assert!(
            a.words.contains("120 shapes") && a.words.contains("(churn)"),
            "{}",
            a.words
        );
        assert!(
            a.words.contains("ONEDNN_PRIMITIVE_CACHE_CAPACITY"),
            "{}",
            a.words
        );
        let nothing = crate::agent::CensusDiff {
            pid: None,
            steps: 100,
            grown: vec![],
            total_bytes: 0,
            total_tensors: 0,
            total_graph_nodes: 0,
            census_seconds: (0.1, 0.1),
            notes: vec![],
            heap: None,
        };
        let owner = owner(&a, Some(&nothing), None);
        assert_eq!(owner.owner, Owner::Native, "{owner:?}");
        assert!(
            owner
                .mechanism
                .starts_with("likely a per-shape kernel cache")
                && owner.mechanism.contains("fewer than the 120 shapes"),
            "{}",
            owner.mechanism
        );
        assert!(
            owner.fix.contains("raise the cache's capacity"),
            "{}",
            owner.fix
        );
        // The libraries the process mapped name the cache, as likely.
        let libraries = ["libc.so.6".to_string(), "libtorch_cpu.so".to_string()];
        let named = owner_kept(
            &a,
            Some(&nothing),
            None,
            None,
            &Elsewhere::nothing(),
            &libraries,
        );
        assert!(
            named
                .mechanism
                .contains("of the libraries loaded: oneDNN's primitive cache")
                && named
                    .mechanism
                    .contains("the shapes and the libraries loaded, not traced"),
            "{}",
            named.mechanism
        );
        // Still climbing on shapes already seen: per request, not per shape, no churn.
        let climbing = judged(|i| 200_000 * i as i64, 400);
        let mut b = cycled(&climbing);
        super::shapes(&mut b, &shapes, &climbing);
        assert_eq!((b.axis, b.churn), (Axis::PerRequest, None));
        assert!(b.words.contains("not per shape"), "{}", b.words);
        // Held from the end of the first pass on: per new shape, churn not told.
        let all = judged(|i| 200_000 * i.min(120) as i64, 400);
        let mut d = cycled(&all);
        super::shapes(&mut d, &shapes, &all);
        assert_eq!((d.axis, d.churn), (Axis::PerNewInput, None), "{}", d.words);
        assert!(d.words.contains("memory cannot tell"), "{}", d.words);
        // One shape (a body varied): nothing said.
        let mut c = cycled(&filled);
        let before = c.words.clone();
        super::shapes(
            &mut c,
            &crate::evidence::Shapes {
                distinct: 1,
                ..shapes.clone()
            },
            &filled,
        );
        assert_eq!((c.words, c.churn), (before, None));
    }

    /// Asserts that `a` reads `want`, bounded or not, the whole reading in the message.
    #[track_caller]
    fn assert_reads(a: &AxisReading, want: Axis, bounded: bool) {
        assert_eq!((a.axis, a.bounded), (want, bounded), "{a:?}");
    }

    /// The trim probe's finding that `malloc_trim(0)` returned `returned` bytes.
    fn trim(returned: i64) -> crate::agent::Trim {
        crate::agent::Trim {
            malloc_trim: crate::agent::TrimShare {
                given_back_bytes: Some(returned),
            },
            ..Default::default()
        }
    }

    #[test]
    fn a_small_rise_that_stopped_is_settling_and_one_the_allocator_returns_is_given_back() {
        // +1.2 MB on 300 MB (0.4 %), then flat: the service settling, no axis.
        let settling = judged(|i| 4_000 * i.min(300) as i64, 600);
        assert_eq!(settling.verdict, Verdict::Plateau, "{settling:?}");
        let mut a = axis("rss", &settling, Inputs::Same, 1, None, None, vec![]);
        assert_reads(&a, Axis::PerRequest, true);
        settled(&mut a, false);
        assert_reads(&a, Axis::None, false);
        assert!(a.words.contains("settling"), "{}", a.words);
        // +30 MB (10 %), then flat over new inputs, repeats flat.
        let filled = judged(|i| 200_000 * i.min(150) as i64, 400);
        let flat = judged(|_| 0, 150);
        let mut kept = axis(
            "anonymous",
            &filled,
            Inputs::New,
            400,
            Some(&flat),
            None,
            vec![],
        );
        given_back(&mut kept, &trim(35_000_000));
        assert_eq!(
            kept.axis,
            Axis::PerNewInput,
            "about the rise returned: a churning cache"
        );
        assert!(kept.words.contains("too little to say"), "{}", kept.words);
        let mut freed = axis(
            "anonymous",
            &filled,
            Inputs::New,
            400,
            Some(&flat),
            None,
            vec![],
        );
        given_back(&mut freed, &trim(250_000_000));
        assert_reads(&freed, Axis::GivenBack, true);
        // A leak (not bounded) is never given back, whatever the allocator had free.
        let leak = judged(|i| 200_000 * i as i64, 400);
        let mut leaking = axis(
            "anonymous",
            &leak,
            Inputs::New,
            400,
            Some(&flat),
            None,
            vec![],
        );
        given_back(&mut leaking, &trim(500_000_000));
        assert_eq!(leaking.axis, Axis::PerNewInput);
    }

    #[test]
    fn a_small_climb_within_its_budget_is_settling_and_one_that_fails_or_rises_more_is_not() {
        // What CI read from thread_per_request's fixed twin: ~3 kB a request over 300 requests,
        // still climbing at the end, 0.3 % of the memory.
        let creep = judged(|i| 3_000 * i as i64, 300);
        assert_eq!(creep.verdict, Verdict::Leak, "{creep:?}");
        let read = |j: &NoisyJudgement| axis("rss", j, Inputs::Same, 1, None, None, vec![]);
        let mut passing = read(&creep);
        settled(&mut passing, false);
        assert_reads(&passing, Axis::None, false);
        assert!(
            passing.words.contains("still climbing at the end"),
            "{}",
            passing.words
        );
        let own = owner(&passing, None, None);
        assert_eq!(own.owner, Owner::None);
        assert!(own.words.contains("the service settling"), "{}", own.words);
        // The same growth failing its budget keeps its axis: the verdict needs its reason.
        let mut failing = read(&creep);
        settled(&mut failing, true);
        assert_reads(&failing, Axis::PerRequest, false);
        // The same slope over 1,200 requests rose 1.2 % of the memory: an axis.
        let longer = judged(|i| 3_000 * i as i64, 1_200);
        let mut more = read(&longer);
        settled(&mut more, false);
        assert_reads(&more, Axis::PerRequest, false);
    }

    #[test]
    fn a_rise_smaller_than_the_free_memory_the_allocator_keeps_is_settling() {
        let flat = judged(|_| 0, 150);
        // What CI read from a zoo fixed twin: +3.88 MB, then held (1.3 % of 300 MB, over
        // SETTLED_SHARE), and malloc_trim(0) returned 18.18 MB.
        let step = judged(|i| if i < 120 { 0 } else { 3_880_000 }, 250);
        assert_eq!(step.verdict, Verdict::Plateau, "{step:?}");
        let read = || axis("rss", &step, Inputs::New, 250, Some(&flat), None, vec![]);
        assert!(read().bounded, "{}", read().words);
        let mut settled = read();
        given_back(&mut settled, &trim(18_180_000));
        assert_reads(&settled, Axis::None, false);
        assert!(
            settled.words.contains("(1.29 % of its 300"),
            "{}",
            settled.words
        );
        // The allocator returned less than twice the rise: something may hold it, axis kept.
        let mut held = read();
        given_back(&mut held, &trim(6_000_000));
        assert_eq!(held.axis, read().axis, "{}", held.words);
        assert!(held.bounded, "{}", held.words);
        // Twice the share (+7.5 MB, 2.5 %), the same trim: given back, an axis of its own.
        let bigger = judged(|i| if i < 120 { 0 } else { 7_500_000 }, 250);
        let mut freed = axis("rss", &bigger, Inputs::New, 250, Some(&flat), None, vec![]);
        given_back(&mut freed, &trim(18_180_000));
        assert_reads(&freed, Axis::GivenBack, true);
    }

    #[test]
    fn small_tensors_kept_every_request_are_python_s_though_their_storage_is_a_quarter() {
        // The twin's refs-leaky watched for 31 minutes: 87.10 MB of storage in 5,316 tensors
        // of the 353.07 MB its process grew over 5,316 requests.
        assert!(python_owns(87.10 / 353.07, 1.0));
        assert!(
            python_owns(0.3, 0.0),
            "a quarter of the bytes needs no count"
        );
        assert!(
            !python_owns(0.2, 0.01),
            "a tensor every hundred requests is beside the point"
        );
        assert!(
            !python_owns(0.1, 1.0),
            "nor a tensor a request holding a tenth"
        );
    }

    #[test]
    fn tensors_held_from_native_code_are_not_python_s_share() {
        use crate::agent::{CensusDiff, Growth};
        let grew = judged(|i| 36_000 * i as i64, 300);
        let a = axis("anonymous", &grew, Inputs::Same, 1, None, None, vec![]);
        let census = CensusDiff {
            pid: None,
            steps: 100,
            grown: vec![Growth {
                holder: "held from native code (no Python referrer)".into(),
                kind: NATIVE_KIND.into(),
                bytes: 2_100_000,
                bytes_per_step: 21_000.0,
                tensors: 100,
                graph_nodes: 0,
                bytes_after: 0,
                shapes: vec![],
                entries: None,
            }],
            total_bytes: 2_100_000,
            total_tensors: 100,
            total_graph_nodes: 0,
            census_seconds: (0.1, 0.1),
            notes: vec![],
            heap: None,
        };
        let o = owner(&a, Some(&census), None);
        assert_eq!(o.owner, Owner::Native, "{}", o.words);
        assert!(o.words.contains("held from native code"), "{}", o.words);
        assert!(
            o.mechanism.contains("no Python referrer"),
            "{}",
            o.mechanism
        );
    }

    #[test]
    fn threads_that_grow_with_the_memory_and_a_child_that_grows_alone_are_their_own_axes() {
        let new = judged(|i| 740_000 * i as i64, 300);
        let threads = Some(ThreadCount {
            first: 14,
            last: 314,
        });
        let a = axis("anonymous", &new, Inputs::Same, 1, None, threads, vec![]);
        assert_eq!(a.axis, Axis::PerNewThread);
        // 740 kB a request, one thread a request: 740 kB a thread (the floor's slope, ±0.1 %).
        assert!(
            a.words.starts_with("+739.")
                && a.words.contains("kB per new thread")
                && a.words.contains("from 14 to 314"),
            "{}",
            a.words
        );
        // A pool that started 4 workers: not the threads' axis.
        let few = Some(ThreadCount {
            first: 14,
            last: 18,
        });
        assert_eq!(
            axis("anonymous", &new, Inputs::Same, 1, None, few, vec![]).axis,
            Axis::PerRequest
        );
        let process = |pid, root, verdict| ProcessGrowth {
            pid,
            command: "python worker.py".into(),
            root,
            verdict: Some(verdict),
            measure: "anonymous".into(),
            bytes_per_request: if verdict == Verdict::Leak {
                8900.0
            } else {
                10.0
            },
            bound: 100.0,
            rise_bytes: 0.0,
        };
        let tree = vec![
            process(10, true, Verdict::Flat),
            process(11, false, Verdict::Leak),
        ];
        let b = axis("anonymous", &new, Inputs::Same, 1, None, None, tree.clone());
        assert_eq!(b.axis, Axis::OtherProcess);
        assert!(
            b.words
                .contains("child process 11 (python worker.py) +8.90 kB"),
            "{}",
            b.words
        );
        let o = owner(&b, None, None);
        assert_eq!(o.owner, Owner::OtherProcess);
        assert!(o.fix.contains("leaklab scan --pid 11"), "{}", o.fix);
        // A worker that serves the agent itself: the fix is its census, at its address.
        let agents = BTreeMap::from([(11, "http://127.0.0.1:4242/debug/leaklab".to_string())]);
        let served = owner_kept(
            &b,
            None,
            None,
            None,
            &Elsewhere {
                agents: &agents,
                censuses: &BTreeMap::new(),
            },
            &[],
        );
        assert!(
            served
                .fix
                .contains("--pid 11 --agent http://127.0.0.1:4242/debug/leaklab"),
            "{}",
            served.fix
        );
        // Both growing: the service itself leaks, the child's line is evidence only.
        let both = vec![
            process(10, true, Verdict::Leak),
            process(11, false, Verdict::Leak),
        ];
        assert_eq!(
            axis("anonymous", &new, Inputs::Same, 1, None, None, both).axis,
            Axis::PerRequest
        );
    }

    /// Two workers share a leak that each keeps within its own noise: the tree's sum proves it,
    /// and the root's bound cannot hold it, so it is in the workers; a root whose bound could
    /// hold it leaves the axis to the sum (lab/corpus/README.md, the workers regime).
    #[test]
    fn a_sum_that_grows_past_what_its_root_can_hold_is_in_the_children() {
        let sum = judged(|i| 2_048 * i as i64, 600);
        let process = |pid, root, bytes_per_request, bound| ProcessGrowth {
            pid,
            command: "python worker.py".into(),
            root,
            verdict: Some(Verdict::Plateau),
            measure: "anonymous".into(),
            bytes_per_request,
            bound,
            rise_bytes: 0.0,
        };
        let tree = |root_bound| {
            vec![
                process(10, true, 0.0, root_bound),
                process(11, false, 1_100.0, 1_400.0),
                process(12, false, 950.0, 1_300.0),
            ]
        };
        let a = axis("anonymous", &sum, Inputs::Same, 1, None, None, tree(683.0));
        assert_eq!(a.axis, Axis::OtherProcess, "{}", a.words);
        assert!(
            a.words.contains("this process 10 +0 B ± 683 B")
                && a.words.contains("child process 11")
                && a.words.contains("child process 12")
                && a.words.contains("none past its own noise alone"),
            "{}",
            a.words
        );
        let o = owner(&a, None, None);
        assert_eq!(o.owner, Owner::OtherProcess, "{}", o.words);
        assert!(o.fix.contains("--pid 11"), "{}", o.fix);
        // The root's bound holds the whole growth: nothing says where it is.
        let wide = axis(
            "anonymous",
            &sum,
            Inputs::Same,
            1,
            None,
            None,
            tree(3_000.0),
        );
        assert_eq!(wide.axis, Axis::PerRequest, "{}", wide.words);
        // Another series than the tree's sum (RSS, a gauge): not compared with its processes.
        let rss = axis("rss", &sum, Inputs::Same, 1, None, None, tree(683.0));
        assert_eq!(rss.axis, Axis::PerRequest, "{}", rss.words);
    }

    /// A pool of workers (LitServe's inference workers, gunicorn's) grows by the request in its
    /// processes together, each keeping its share: the census of each process, taken through
    /// its own agent, is summed, and the owner names the holder and the processes that hold it.
    #[test]
    fn a_growth_spread_over_workers_is_owned_by_their_censuses_summed() {
        use crate::agent::{CensusDiff, Growth};
        let new = judged(|i| 8_192 * i as i64, 300);
        let a = axis("anonymous", &new, Inputs::Same, 1, None, None, vec![]);
        let census = |holder: &str, per_step: i64| CensusDiff {
            pid: None,
            steps: 75,
            grown: vec![Growth {
                holder: holder.into(),
                kind: "frame".into(),
                bytes: per_step * 75,
                bytes_per_step: per_step as f64,
                tensors: 37,
                graph_nodes: 0,
                bytes_after: 0,
                shapes: vec![vec![8, 256]],
                entries: None,
            }]
            .into_iter()
            .filter(|_| per_step > 0)
            .collect(),
            total_bytes: per_step * 75,
            total_tensors: if per_step > 0 { 37 } else { 0 },
            total_graph_nodes: 0,
            census_seconds: (0.4, 0.4),
            notes: vec![],
            heap: None,
        };
        let kept = "thread 'MainThread' inference_worker (loops.py:61) local 'lit_api'.outputs";
        // The API server's own census: nothing grew there.
        let own = census("", 0);
        let lone = owner(&a, Some(&own), None);
        assert_eq!(lone.owner, Owner::Native, "{}", lone.words);
        let workers = BTreeMap::from([
            (11, census(kept, 4_100)),
            (12, census(kept, 4_000)),
            (13, census("", 0)),
        ]);
        let agents = BTreeMap::new();
        let elsewhere = Elsewhere {
            agents: &agents,
            censuses: &workers,
        };
        let pool = owner_kept(&a, Some(&own), None, None, &elsewhere, &[]);
        assert_eq!(pool.owner, Owner::Python, "{}", pool.words);
        assert_eq!(pool.holder.as_deref(), Some(kept));
        assert!(
            pool.words
                .starts_with("the census holds 8.10 kB of 8.20 kB a request")
                && pool.words.contains("in processes 11 and 12 of the service"),
            "{}",
            pool.words
        );
        // The agent the scan was given answered from worker 11 both times: that process counts
        // once, its census through either agent.
        let through_11 = CensusDiff {
            pid: Some(11),
            ..census(kept, 4_100)
        };
        let once = owner_kept(&a, Some(&through_11), None, None, &elsewhere, &[]);
        assert!(
            once.words
                .starts_with("the census holds 8.10 kB of 8.20 kB a request"),
            "{}",
            once.words
        );
        // One worker's census alone: half the growth, still over Python's share, and only that
        // process named.
        let half = BTreeMap::from([(11, census(kept, 4_100))]);
        let one = owner_kept(
            &a,
            Some(&own),
            None,
            None,
            &Elsewhere {
                agents: &agents,
                censuses: &half,
            },
            &[],
        );
        assert_eq!(one.owner, Owner::Python, "{}", one.words);
        assert!(
            one.words.starts_with("the census holds 4.10 kB of 8.20 kB")
                && one.words.contains(", in process 11 of the service"),
            "{}",
            one.words
        );
        // A service of one process whose workers folder is set: its own census, through either
        // address, names no process.
        let alone_here = BTreeMap::from([(11, census(kept, 8_100))]);
        let one_process = owner_kept(
            &a,
            Some(&CensusDiff {
                pid: Some(11),
                ..census(kept, 8_100)
            }),
            None,
            None,
            &Elsewhere {
                agents: &agents,
                censuses: &alone_here,
            },
            &[],
        );
        assert_eq!(one_process.owner, Owner::Python, "{}", one_process.words);
        assert!(
            one_process
                .words
                .starts_with("the census holds 8.10 kB of 8.20 kB")
                && !one_process.words.contains("of the service"),
            "{}",
            one_process.words
        );
        // Where the tree finds the growth in the workers, not the serving process: both
        // workers' censuses summed, weighed against both workers' growth (main weighed one
        // worker's census against its own growth and named that worker alone).
        let child = |pid: u32, per_request: f64| crate::tree::ProcessGrowth {
            pid,
            command: "python -c from multiprocessing.spawn …".into(),
            root: false,
            verdict: Some(Verdict::Leak),
            measure: "anonymous".into(),
            bytes_per_request: per_request,
            bound: 500.0,
            rise_bytes: per_request * 300.0,
        };
        let (w11, w12) = (child(11, 7_000.0), child(12, 7_300.0));
        let weighed = owner(&a, None, None);
        let both = other_process(weighed.clone(), &[&w11, &w12], "scan", &elsewhere);
        assert_eq!(both.owner, Owner::OtherProcess, "{}", both.words);
        assert_eq!(both.holder.as_deref(), Some(kept));
        assert!(
            both.words.starts_with(
                "processes 11 and 12 (python -c from multiprocessing.spawn …), whose own agents answered (their censuses summed): the census holds 8.10 kB of 14.30 kB a request"
            ),
            "{}",
            both.words
        );
        // A worker whose census was not taken is not counted in the sum: one census, one growth.
        let alone = other_process(
            weighed,
            &[&w11, &w12],
            "scan",
            &Elsewhere {
                agents: &agents,
                censuses: &half,
            },
        );
        assert!(
            alone.words.starts_with("process 11 (python -c from multiprocessing.spawn …), whose own agent answered: the census holds 4.10 kB of 7.00 kB a request"),
            "{}",
            alone.words
        );
    }

    #[test]
    fn the_owner_is_python_only_where_the_census_holds_a_real_share_and_gc_off_is_said() {
        use crate::agent::{CensusDiff, Growth};
        let new = judged(|i| 16_384 * i as i64, 300);
        let a = axis("anonymous", &new, Inputs::Same, 1, None, None, vec![]);
        let census = |per_step: i64| CensusDiff {
            pid: None,
            steps: 100,
            grown: vec![Growth {
                holder: "app.state.kept".into(),
                kind: "module global".into(),
                bytes: per_step * 100,
                bytes_per_step: per_step as f64,
                tensors: 100,
                graph_nodes: 0,
                bytes_after: 0,
                shapes: vec![],
                entries: None,
            }],
            total_bytes: per_step * 100,
            total_tensors: 100,
            total_graph_nodes: 0,
            census_seconds: (0.1, 0.1),
            notes: vec![],
            heap: None,
        };
        let python = owner(&a, Some(&census(16_000)), None);
        assert_eq!(python.owner, Owner::Python);
        assert_eq!(python.holder.as_deref(), Some("app.state.kept"));
        let small = owner(&a, Some(&census(1_000)), None);
        assert_eq!(
            small.owner,
            Owner::Native,
            "6 % held by Python is not its owner"
        );
        assert!(
            small.words.starts_with("the census holds 1.00 kB of 16.3"),
            "{}",
            small.words
        );
        assert_eq!(owner(&a, None, None).owner, Owner::Unknown);
        let off = Collector {
            enabled: false,
            ..Collector::default()
        };
        let cycles = owner(&a, Some(&census(16_000)), Some(&off));
        assert!(cycles.findings[0].contains("gc is disabled"));
        assert!(cycles.fix.starts_with("gc.enable()"));
        let lines = first_lines("FAIL (leak)", &a, &cycles);
        assert!(lines[0].starts_with("verdict:") && lines[1].starts_with("axis:      per request"));
        assert!(lines
            .iter()
            .any(|l| l.starts_with("finding:   gc is disabled")));
        // The same tensors in cycles nothing reaches, with the collector on: its garbage, not a
        // holder's; Python's, awaiting the collector, until full collections show what is kept.
        let mut cycle = census(16_000);
        cycle.grown[0].holder = "unreachable cycle (awaiting gc): app.Handle.held".into();
        cycle.grown[0].kind = GARBAGE_KIND.into();
        let on = Collector::default();
        let awaiting = owner(&a, Some(&cycle), Some(&on));
        assert_eq!(awaiting.owner, Owner::Python, "{}", awaiting.words);
        assert!(
            awaiting.words.contains("awaiting the collector") && awaiting.fix.contains("--collect")
        );
        // Kept through full collections at both ends (12 kB a request): not garbage, native.
        let kept = owner_kept(
            &a,
            Some(&cycle),
            Some(&on),
            Some(12_000.0),
            &Elsewhere::nothing(),
            &[],
        );
        assert_eq!(kept.owner, Owner::Native, "{}", kept.words);
        assert!(
            kept.words.contains("not the collector's garbage"),
            "{}",
            kept.words
        );
        // With the collector off, the same cycles are the leak, as above.
        assert!(owner(&a, Some(&cycle), Some(&off))
            .mechanism
            .contains("collector is disabled"));
    }
}
