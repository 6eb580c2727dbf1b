//! The judgement of a check's calls (`leaklab judge`): the verdict on series a caller measured
//! itself, by the same detector, noise floor and owner rule as the scan's. The pytest plugin (`leaklab.pytest_plugin`) calls a function N times, samples its
//! signals, takes a tensor census after the warm-up and after the last call, and hands them here
//! as one JSON document ([`JudgeRequest`]); the answer ([`JudgeAnswer`]) carries the outcome,
//! each series' verdict with its bound, the holders that grew and the message a failing test
//! prints. One detector for every tool: a leak the scan calls a leak, the test calls a leak.
//!
//! Exact series (the census's bytes, `torch.cuda.memory_allocated()`) are judged with no noise
//! ([`leaklab_detect::judge`]); noisy ones (the process's anonymous memory) on their floor with
//! the noise estimated from the series, at least the host noise floor
//! ([`crate::thresholds::HOST_NOISE_FLOOR`]), as `scan` judges host memory.
//! A series fails when it is a leak, still climbing at the end, with a slope whose lower bound
//! is above the budget (zero without one): a growth proven, not a growth suspected.

use crate::agent::{self, Census, CensusDiff};
use crate::diagnosis::{self, Axis, AxisReading, Inputs, Owner, OwnerReading, Phase, Weighed};
use crate::thresholds::HOST_NOISE_FLOOR;
use leaklab_detect::budget::proven;
use leaklab_detect::{judge, judge_noisy, DetectorConfig, NoisyConfig, Sample, Slope, Verdict};
use leaklab_report::human_bytes;
use serde::{Deserialize, Serialize};

/// How a series' noise is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SeriesKind {
    /// Counts with no noise: a census's bytes, the CUDA allocator's allocated bytes.
    Exact,
    /// Pages and arenas: judged on the floor, noise estimated from the series.
    Noisy,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SeriesIn {
    pub name: String,
    pub kind: SeriesKind,
    /// `(call index, bytes)`, call indices counted from the first warm-up call.
    pub samples: Vec<Sample>,
    /// Noisy series: the least noise amplitude to assume, in bytes; without one, the host noise
    /// floor ([`HOST_NOISE_FLOOR`]: a process's anonymous memory moves in pymalloc pools and
    /// glibc's top pad), as the scan's host series. Given only to sweep it (the plugin's
    /// bench/anon_floor.py). The amplitude estimated from the series is used when larger.
    #[serde(default)]
    pub noise_floor: Option<f64>,
    /// What the values count when they are not bytes (`"graph nodes"`, `"tensors"`; the name
    /// of the series says it in messages): judged by the same detector, printed as plain
    /// numbers, and held to no byte budget (with `max_per_call` set, only byte series fail).
    #[serde(default)]
    pub counts: Option<String>,
}

/// What the caller measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JudgeRequest {
    /// Calls made first and not judged: samples before this index are left out.
    pub warmup: u64,
    /// Judged calls after the warm-up.
    pub calls: u64,
    /// Bytes per call a series may grow by and pass (`None`: any proven growth fails).
    #[serde(default)]
    pub max_per_call: Option<f64>,
    /// What one step is, in messages ("call", "request").
    #[serde(default = "default_unit")]
    pub unit: String,
    pub series: Vec<SeriesIn>,
    /// Censuses around `census_calls` further calls (or, without it, after the warm-up and
    /// after the last call), for who holds it.
    #[serde(default)]
    pub census_before: Option<Census>,
    #[serde(default)]
    pub census_after: Option<Census>,
    /// The calls between the two censuses where they are not the judged ones: the plugin takes
    /// them only once a check failed, around further calls, so that a passing check pays none.
    #[serde(default)]
    pub census_calls: Option<u64>,
}

fn default_unit() -> String {
    "call".into()
}

pub use leaklab_report::Outcome;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SeriesOut {
    pub name: String,
    pub kind: SeriesKind,
    /// What the values count, for a series that is not bytes.
    pub counts: Option<String>,
    pub samples: usize,
    pub verdict: Option<Verdict>,
    pub slope: Option<Slope>,
    pub noise_bytes: Option<f64>,
    pub fails: bool,
    pub why_not_judged: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JudgeAnswer {
    pub outcome: Outcome,
    pub series: Vec<SeriesOut>,
    pub census: Option<CensusDiff>,
    /// A failing check's axis (per call: the check calls one function again and again) and
    /// owner, as the scan's diagnosis reads them; None where it passed or could not judge.
    #[serde(default)]
    pub axis: Option<AxisReading>,
    #[serde(default)]
    pub owner: Option<OwnerReading>,
    /// What a failing test prints: the diagnosis's first lines (verdict, axis, owner, mechanism,
    /// fix) where it failed, then each series' verdict with its bound and the holders that grew.
    pub message: String,
}

fn one(series: &SeriesIn, warmup: u64, budget: Option<f64>) -> SeriesOut {
    let judged: Vec<Sample> = series
        .samples
        .iter()
        .copied()
        .filter(|s| s.0 >= warmup)
        .collect();
    let found = match series.kind {
        SeriesKind::Exact => {
            judge(&judged, &DetectorConfig::exact(0)).map(|j| (j.verdict, j.slope, j.noise_bytes))
        }
        SeriesKind::Noisy => {
            let mut config = NoisyConfig::new(0);
            config.quantum_bytes = config.quantum_bytes.max(floor(series));
            judge_noisy(&judged, &config).map(|j| (j.verdict, j.slope, j.noise_bytes))
        }
    };
    // A count cannot be held to a budget in bytes: with one, only byte series fail.
    let limit = match (&series.counts, budget) {
        (None, b) => Some(b.unwrap_or(0.0).max(0.0)),
        (Some(_), None) => Some(0.0),
        (Some(_), Some(_)) => None,
    };
    let (name, kind, counts, samples) = (
        series.name.clone(),
        series.kind,
        series.counts.clone(),
        judged.len(),
    );
    match found {
        Ok((verdict, slope, noise)) => {
            // The rule every tool applies (`leaklab_detect::budget`): a proven leak fails.
            let fails = limit.is_some_and(|l| proven(verdict, &slope, l));
            SeriesOut {
                name,
                kind,
                counts,
                samples,
                verdict: Some(verdict),
                fails,
                slope: Some(slope),
                noise_bytes: Some(noise),
                why_not_judged: None,
            }
        }
        Err(e) => SeriesOut {
            name,
            kind,
            counts,
            samples,
            verdict: None,
            slope: None,
            noise_bytes: None,
            fails: false,
            why_not_judged: Some(e.to_string()),
        },
    }
}

/// Judges every series of `request`, and diffs its censuses.
pub fn judge_request(request: &JudgeRequest) -> JudgeAnswer {
    let series: Vec<SeriesOut> = request
        .series
        .iter()
        .map(|s| one(s, request.warmup, request.max_per_call))
        .collect();
    let outcome = if series.iter().any(|s| s.fails) {
        Outcome::Fail
    } else if series.iter().any(|s| s.verdict.is_some()) {
        Outcome::Pass
    } else {
        Outcome::CannotJudge
    };
    let census = match (&request.census_before, &request.census_after) {
        (Some(b), Some(a)) => Some(agent::diff(
            b,
            a,
            request.census_calls.unwrap_or(request.calls),
        )),
        _ => None,
    };
    let diagnosis = (outcome == Outcome::Fail)
        .then(|| diagnose(request, &series, census.as_ref()))
        .flatten();
    let mut message = message(request, outcome, &series, census.as_ref());
    if let Some((_, _, lines)) = &diagnosis {
        message = format!("{}\n{message}", lines.join("\n"));
    }
    let (axis, owner) = diagnosis.map_or((None, None), |(a, o, _)| (Some(a), Some(o)));
    JudgeAnswer {
        outcome,
        series,
        census,
        axis,
        owner,
        message,
    }
}

/// A failing check's diagnosis, in the scan's words: the axis from the failing series that grew
/// fastest (per call, what a check can tell: it calls one function with the same inputs), the
/// owner from the census ([`diagnosis::owner_per`]), and the first lines a failure prints.
fn diagnose(
    request: &JudgeRequest,
    series: &[SeriesOut],
    census: Option<&CensusDiff>,
) -> Option<(AxisReading, OwnerReading, Vec<String>)> {
    let unit = &request.unit;
    let fastest = |bytes: bool| {
        series
            .iter()
            .enumerate()
            .filter(|(_, s)| s.fails && s.counts.is_none() == bytes)
            .max_by(|(_, a), (_, b)| {
                let rate = |s: &SeriesOut| s.slope.map_or(0.0, |s| s.bytes_per_request);
                rate(a).total_cmp(&rate(b))
            })
    };
    let (i, deciding) = fastest(true).or_else(|| fastest(false))?;
    let (verdict, slope) = (deciding.verdict?, deciding.slope?);
    let judged: Vec<Sample> = request.series[i]
        .samples
        .iter()
        .copied()
        .filter(|s| s.0 >= request.warmup)
        .collect();
    let (level, rise) = match (judged.first(), judged.last()) {
        (Some(a), Some(b)) => (a.1 as f64, (b.1 - a.1) as f64),
        _ => (0.0, 0.0),
    };
    let rate = match &deciding.counts {
        None => human_bytes(slope.bytes_per_request),
        Some(_) => count(slope.bytes_per_request),
    };
    let axis = AxisReading {
        axis: Axis::PerRequest,
        bounded: false,
        series: deciding.name.clone(),
        inputs: Inputs::Same,
        distinct_inputs: 1,
        judged: Phase {
            requests: deciding.samples,
            verdict,
            slope,
            rise_bytes: rise,
            level_bytes: level,
        },
        repeats: None,
        threads: None,
        processes: Vec::new(),
        words: format!(
            "{} {verdict} at {rate} a {unit} over {} {unit}s of the same function, to the last: every {unit} adds",
            deciding.name, request.calls
        ),
        churn: None,
    };
    // The scan's advice for native memory (its agent's native trace) is not at hand in a test:
    // what is.
    let native_mechanism = format!("memory kept per {unit} that no Python tensor holds: Python objects other than tensors, or native memory (a library's cache, the allocator)");
    let owner = match &deciding.counts {
        None => diagnosis::census_owner(
            &Weighed {
                per_step: slope.bytes_per_request,
                step: unit,
                steps: None,
                kept: None,
                python_mechanism: format!(
                    "a Python holder reachable from a root keeps what each {unit} leaves"
                ),
                native: (
                    &native_mechanism,
                    "name the allocating lines: run the test under pytest-memray (native stacks too, with --native), or compare two tracemalloc snapshots for Python objects",
                ),
                without: (
                    "Python or native: not told apart without the census (torch is not imported by the calls)",
                    "import torch in the test's process, so the census can name the holder",
                ),
            },
            census,
            None,
        ),
        Some(counts) => counted_owner(census, counts, unit),
    };
    let head = match request.max_per_call {
        Some(b) => format!(
            "FAIL: it grows faster than the budget of {} a {unit}",
            human_bytes(b)
        ),
        None => "FAIL: a leak is proven".to_string(),
    };
    let verdict_words = format!("{head} ({} {verdict}, {rate} a {unit})", deciding.name);
    let lines = diagnosis::first_lines_per(&verdict_words, &axis, &owner, unit);
    Some((axis, owner, lines))
}

/// The owner where only a count grew (autograd graph nodes, tensor objects): the census's
/// holder that grew, with no share of bytes to weigh.
fn counted_owner(census: Option<&CensusDiff>, counts: &str, unit: &str) -> OwnerReading {
    let top = census.and_then(|c| c.python_grown().max_by_key(|g| (g.graph_nodes, g.tensors)));
    let steps = census.map_or(1, |c| c.steps.max(1)) as f64;
    match top {
        Some(g) => OwnerReading {
            owner: Owner::Python,
            holder: Some(g.holder.clone()),
            census_share: None,
            words: format!(
                "`{}` ({}) grew most: {} autograd graph nodes and {} tensors a {unit}",
                g.holder,
                g.kind_words(),
                count(g.graph_nodes as f64 / steps),
                count(g.tensors as f64 / steps)
            ),
            mechanism: format!(
                "a Python holder reachable from a root keeps what each {unit} leaves"
            ),
            fix: g.fix(unit),
            findings: Vec::new(),
        },
        None => OwnerReading {
            owner: Owner::Unknown,
            holder: None,
            census_share: None,
            words: format!("{counts} grew, and no census holder grew with them"),
            mechanism: "not named without a holder".into(),
            fix: format!("look at what each {unit} keeps of the objects counted"),
            findings: Vec::new(),
        },
    }
}

/// The least noise a noisy series is judged against: the caller's, else the host noise floor.
fn floor(series: &SeriesIn) -> f64 {
    series.noise_floor.unwrap_or(HOST_NOISE_FLOOR)
}

/// A count per step: whole where it is whole (`3`), else two decimals (`0.33`).
fn count(value: f64) -> String {
    if (value - value.round()).abs() < 1e-9 {
        format!("{value:.0}")
    } else {
        format!("{value:.2}")
    }
}

fn message(
    request: &JudgeRequest,
    outcome: Outcome,
    series: &[SeriesOut],
    census: Option<&CensusDiff>,
) -> String {
    let unit = &request.unit;
    let budget = match request.max_per_call {
        Some(b) => format!("a budget of {} per {unit}", human_bytes(b)),
        None => "no budget: any growth proven is a leak".into(),
    };
    let head = match outcome {
        Outcome::Fail => "memory leak",
        Outcome::Pass => "no leak",
        Outcome::CannotJudge => "cannot judge",
    };
    let mut lines = vec![format!(
        "{head}: {} {unit}s judged after {} warm-up {unit}s, {budget}",
        request.calls, request.warmup
    )];
    for s in series {
        let line = match (&s.verdict, &s.slope) {
            (Some(v), Some(slope)) => {
                let given = request.series.iter().find(|i| i.name == s.name).map(floor);
                let noise = match (s.kind, given) {
                    (SeriesKind::Exact, _) => "exact".to_string(),
                    (SeriesKind::Noisy, Some(floor)) if s.noise_bytes.unwrap_or(0.0) <= floor => {
                        format!(
                            "noise {}, the least this signal is given",
                            human_bytes(floor)
                        )
                    }
                    (SeriesKind::Noisy, _) => format!(
                        "noise {} estimated from the series",
                        human_bytes(s.noise_bytes.unwrap_or(0.0))
                    ),
                };
                let rate = match &s.counts {
                    None => slope.with_bounds(),
                    // The series' name says what is counted: `tensors (objects): leak at 1 (bound 1 .. 1) per call`.
                    Some(_) => format!(
                        "{} (bound {} .. {})",
                        count(slope.bytes_per_request),
                        count(slope.low),
                        count(slope.high)
                    ),
                };
                format!(
                    "{} {}: {v} at {rate} per {unit} ({noise}; {} samples)",
                    if s.fails { "FAIL" } else { "ok  " },
                    s.name,
                    s.samples
                )
            }
            _ => format!(
                "  -  {}: not judged ({})",
                s.name,
                s.why_not_judged.as_deref().unwrap_or("no samples")
            ),
        };
        lines.push(format!("  {line}"));
    }
    if let Some(c) = census {
        lines.push(match request.census_calls {
            Some(n) => format!(
                "who holds it (tensor census before and after {n} further {unit}s, taken once it failed):"
            ),
            None => format!(
                "who holds it (tensor census after the warm-up and after the last {unit}):"
            ),
        });
        lines.push(c.text(8, unit));
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(name: &str, kind: SeriesKind, per_call: f64, calls: u64) -> SeriesIn {
        // A cache filling during the warm-up (30 calls), then `per_call` bytes a call.
        let samples = (0..calls)
            .map(|i| {
                (
                    i,
                    if i < 30 {
                        (i * 100_000) as i64
                    } else {
                        3_000_000 + ((i - 30) as f64 * per_call) as i64
                    },
                )
            })
            .collect();
        SeriesIn {
            name: name.into(),
            kind,
            samples,
            noise_floor: None,
            counts: None,
        }
    }

    fn request(series: Vec<SeriesIn>, max_per_call: Option<f64>) -> JudgeRequest {
        JudgeRequest {
            warmup: 30,
            calls: 300,
            max_per_call,
            unit: "call".into(),
            series,
            census_before: None,
            census_after: None,
            census_calls: None,
        }
    }

    #[test]
    fn a_proven_growth_fails_whatever_its_size_and_the_warmup_is_not_judged() {
        let answer = judge_request(&request(
            vec![series("tensors", SeriesKind::Exact, 1024.0, 330)],
            None,
        ));
        assert_eq!(answer.outcome, Outcome::Fail, "{}", answer.message);
        assert_eq!(answer.series[0].slope.unwrap().bytes_per_request, 1024.0);
        assert!(
            answer.message.contains("FAIL tensors: leak at 1.02 kB"),
            "{}",
            answer.message
        );
        // Filling during the warm-up, flat after: a pass.
        let answer = judge_request(&request(
            vec![series("tensors", SeriesKind::Exact, 0.0, 330)],
            None,
        ));
        assert_eq!(answer.outcome, Outcome::Pass, "{}", answer.message);
        assert_eq!(answer.series[0].verdict, Some(Verdict::Flat));
    }

    #[test]
    fn a_budget_lets_a_slower_growth_pass_and_a_faster_one_fail() {
        let slow = judge_request(&request(
            vec![series("tensors", SeriesKind::Exact, 1024.0, 330)],
            Some(2048.0),
        ));
        assert_eq!(slow.outcome, Outcome::Pass, "{}", slow.message);
        let fast = judge_request(&request(
            vec![series("tensors", SeriesKind::Exact, 4096.0, 330)],
            Some(2048.0),
        ));
        assert_eq!(fast.outcome, Outcome::Fail, "{}", fast.message);
    }

    #[test]
    fn a_count_series_fails_on_its_own_growth_but_is_held_to_no_byte_budget() {
        // A loss accumulated across calls: its graph gains 3 nodes a call while the bytes the
        // tensors hold stay flat (what the nodes save is already counted elsewhere).
        let nodes = SeriesIn {
            name: "autograd graph nodes".into(),
            kind: SeriesKind::Exact,
            samples: (30..330).map(|i| (i, 3 * i as i64)).collect(),
            noise_floor: None,
            counts: Some("graph nodes".into()),
        };
        let bytes = series("tensors (bytes)", SeriesKind::Exact, 0.0, 330);
        let answer = judge_request(&request(vec![bytes.clone(), nodes.clone()], None));
        assert_eq!(answer.outcome, Outcome::Fail, "{}", answer.message);
        assert!(
            answer.message.contains(
                "FAIL autograd graph nodes: leak at 3 (bound 3 .. 3) per call (exact; 300 samples)"
            ),
            "{}",
            answer.message
        );
        assert!(
            answer.message.contains("ok   tensors (bytes): flat at 0 B"),
            "{}",
            answer.message
        );
        // With a budget in bytes, a count cannot fail: the bytes decide.
        let answer = judge_request(&request(vec![bytes, nodes], Some(1024.0)));
        assert_eq!(answer.outcome, Outcome::Pass, "{}", answer.message);
        assert!(
            answer
                .message
                .contains("ok   autograd graph nodes: leak at 3 (bound 3 .. 3) per call"),
            "{}",
            answer.message
        );
    }

    #[test]
    fn a_noise_floor_keeps_allocator_steps_from_failing_and_a_larger_growth_still_fails() {
        // A page every ten calls to the end (410 B a call): the size of the steady creep clean
        // Python functions showed (0.2 to 0.7 kB a call where a page of noise failed them,
        // docs/pytest.md). A leak against a page of noise; flat within the host noise floor,
        // which a series is given where the caller names none, as the scan's host series are.
        let steps: Vec<Sample> = (0..330)
            .map(|i| (i, 100_000_000 + 4096 * (i as i64 / 10)))
            .collect();
        let settle = |floor: Option<f64>| SeriesIn {
            name: "anonymous memory".into(),
            kind: SeriesKind::Noisy,
            samples: steps.clone(),
            noise_floor: floor,
            counts: None,
        };
        assert_eq!(
            judge_request(&request(vec![settle(Some(4096.0))], None)).outcome,
            Outcome::Fail
        );
        for given in [None, Some(HOST_NOISE_FLOOR)] {
            let answer = judge_request(&request(vec![settle(given)], None));
            assert_eq!(
                answer.outcome,
                Outcome::Pass,
                "{given:?}: {}",
                answer.message
            );
            assert!(
                answer
                    .message
                    .contains("noise 65.54 kB, the least this signal is given"),
                "{}",
                answer.message
            );
        }
        // 16 kB a call (4.8 MB over the calls) clears that noise.
        let leak = SeriesIn {
            samples: (0..330)
                .map(|i| (i, 100_000_000 + 16_384 * i as i64))
                .collect(),
            ..settle(None)
        };
        assert_eq!(
            judge_request(&request(vec![leak], None)).outcome,
            Outcome::Fail
        );
    }

    fn census(holders: &[(&str, u64, u64, u64)]) -> Census {
        let sum = |f: fn(&(&str, u64, u64, u64)) -> u64| holders.iter().map(f).sum::<u64>();
        let totals = serde_json::json!({"tensors": sum(|h| h.1), "bytes": sum(|h| h.2),
            "graph_nodes": sum(|h| h.3), "graph_saved_bytes": 0});
        let holders: Vec<serde_json::Value> = holders
            .iter()
            .map(|&(name, tensors, bytes, nodes)| {
                serde_json::json!({"holder": name, "kind": "module global", "tensors": tensors,
                    "bytes": bytes, "graph": {"tensors": 1, "nodes": nodes, "saved_tensors": 0, "saved_bytes": 0}})
            })
            .collect();
        serde_json::from_value(
            serde_json::json!({"schema": agent::SCHEMA, "pid": 1, "taken_at": 0.0,
            "seconds": 0.1, "complete": true, "stopped_early": null, "objects": 1000,
            "totals": totals, "holders": holders}),
        )
        .unwrap()
    }

    #[test]
    fn a_failure_says_verdict_axis_owner_mechanism_and_fix_first_and_a_pass_does_not() {
        // 2 kB a call kept in a module global, which the census names.
        let mut kept = request(
            vec![series("tensors (bytes)", SeriesKind::Exact, 2048.0, 330)],
            None,
        );
        kept.census_before = Some(census(&[("svc.KEPT", 0, 0, 0)]));
        kept.census_after = Some(census(&[("svc.KEPT", 300, 614_400, 0)]));
        let answer = judge_request(&kept);
        let lines: Vec<&str> = answer.message.lines().take(5).collect();
        assert_eq!(
            lines[..3],
            [
                "verdict:   FAIL: a leak is proven (tensors (bytes) leak, 2.05 kB a call)",
                "axis:      per call: tensors (bytes) leak at 2.05 kB a call over 300 calls of the same function, to the last: every call adds",
                "owner:     python: the census holds 2.05 kB of 2.05 kB a call: `svc.KEPT` (module global) grew most",
            ],
            "{}",
            answer.message
        );
        assert!(lines[3].starts_with(
            "mechanism: a Python holder reachable from a root keeps what each call leaves"
        ));
        assert!(lines[4].starts_with("fix:       stop keeping it in `svc.KEPT`"));
        assert_eq!(
            answer.owner.as_ref().unwrap().holder.as_deref(),
            Some("svc.KEPT")
        );
        // Growth no tensor holds: the census's share and the rest said, with a test's advice.
        let mut native = kept.clone();
        native.census_after = native.census_before.clone();
        let answer = judge_request(&native);
        assert_eq!(answer.owner.as_ref().unwrap().owner, Owner::Native);
        assert!(answer.message.contains("owner:     native: the census holds 0 B of 2.05 kB a call; the rest is not tensors reachable from Python"), "{}", answer.message);
        assert!(
            answer
                .message
                .contains("fix:       name the allocating lines: run the test under pytest-memray"),
            "{}",
            answer.message
        );
        // Only graph nodes grow: the holder whose graph grew.
        let mut nodes = request(
            vec![SeriesIn {
                name: "autograd graph nodes".into(),
                kind: SeriesKind::Exact,
                samples: (30..330).map(|i| (i, 7 * i as i64)).collect(),
                noise_floor: None,
                counts: Some("graph nodes".into()),
            }],
            None,
        );
        nodes.census_before = Some(census(&[("svc.Running.loss", 1, 4, 0)]));
        nodes.census_after = Some(census(&[("svc.Running.loss", 1, 4, 2100)]));
        let answer = judge_request(&nodes);
        assert!(answer.message.contains("owner:     python: `svc.Running.loss` (module global) grew most: 7 autograd graph nodes and 0 tensors a call"), "{}", answer.message);
        // A pass has no diagnosis.
        let flat = judge_request(&request(
            vec![series("tensors (bytes)", SeriesKind::Exact, 0.0, 330)],
            None,
        ));
        assert!(flat.axis.is_none() && flat.owner.is_none());
        assert!(flat.message.starts_with("no leak"), "{}", flat.message);
    }

    #[test]
    fn too_few_samples_cannot_be_judged() {
        let answer = judge_request(&request(
            vec![series("anonymous", SeriesKind::Noisy, 0.0, 40)],
            None,
        ));
        assert_eq!(answer.outcome, Outcome::CannotJudge);
        assert!(answer.message.contains("not judged"), "{}", answer.message);
    }
}
