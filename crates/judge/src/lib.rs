//! The judgement: one pure function, [`judge`], from recorded [`Evidence`] and a budget to a
//! [`Judgement`] (the outcome, each series' verdict and time to OOM, the axis memory grows
//! along, its owner, mechanism and fix). No I/O: the front ends (`leaklab scan`, `leaklab
//! watch`: [`watch::judge_watch`] over its looks) measure, hand over evidence and render the
//! judgement, and `leaklab judge --evidence FILE` re-judges a recording exactly as the live run
//! did.
//!
//! Every threshold lives in [`thresholds`]; the noise floor of host memory is said there once.

pub mod agent;
pub mod calls;
pub mod diagnosis;
pub mod evidence;
pub mod thresholds;
pub mod tree;
pub mod verdict;
pub mod watch;

pub use evidence::{Evidence, Kind};
use leaklab_detect::{judge_noisy, NoisyConfig, NoisyJudgement, Sample, Verdict};
pub use leaklab_report::Outcome;
use serde::{Deserialize, Serialize};
use verdict::{Budget, Ops};

/// One series: its samples, its judgement and its ops verdict.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SeriesResult {
    pub series: String,
    pub kind: Kind,
    pub samples: Vec<Sample>,
    /// `None` when it could not be judged (too few samples), with the reason.
    pub judgement: Option<NoisyJudgement>,
    pub why_not_judged: Option<String>,
    pub capacity_bytes: Option<u64>,
    pub seconds_to_oom: Option<f64>,
    pub ops: Option<Ops>,
}

/// What the judge concludes from one [`Evidence`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Judgement {
    pub outcome: Outcome,
    /// The one sentence: which memory grows, and the runbook step.
    pub diagnosis: String,
    pub series: Vec<SeriesResult>,
    pub axis: Option<diagnosis::AxisReading>,
    pub owner: Option<diagnosis::OwnerReading>,
    /// What the judge says of the evidence itself (a target that failed).
    pub notes: Vec<String>,
}

/// The thresholds a judgement applies that its calibration varies: each the constant of
/// [`thresholds`] unless a calibration re-derives it ([`judge_with`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    /// The least noise host memory is judged against ([`thresholds::HOST_NOISE_FLOOR`]).
    pub host_noise_floor: f64,
}

impl Default for Thresholds {
    fn default() -> Thresholds {
        Thresholds {
            host_noise_floor: thresholds::HOST_NOISE_FLOOR,
        }
    }
}

/// The noise configuration of a series of `kind`, its first `warmup` samples skipped: host
/// memory moves in allocator steps, so its noise is at least the host noise floor.
pub fn noisy_config(kind: Kind, warmup: usize, t: &Thresholds) -> NoisyConfig {
    let mut config = NoisyConfig::new(warmup);
    if kind == Kind::Host {
        config.quantum_bytes = config.quantum_bytes.max(t.host_noise_floor);
    }
    config
}

/// Every series judged on its samples before request `before` (all of them where `None`),
/// each keeping every sample it read; a time to OOM at the budget's rate, or without one at the
/// rate the evidence was driven at.
pub fn judge_series(
    evidence: &Evidence,
    budget: Option<Budget>,
    before: Option<u64>,
) -> Vec<SeriesResult> {
    judge_series_with(evidence, budget, before, &Thresholds::default())
}

fn judge_series_with(
    evidence: &Evidence,
    budget: Option<Budget>,
    before: Option<u64>,
    t: &Thresholds,
) -> Vec<SeriesResult> {
    evidence
        .series
        .iter()
        .map(|s| {
            let config = noisy_config(s.kind, evidence.warmup, t);
            // Answers arrive out of order under concurrency: keep the samples, not a prefix.
            let judged: Vec<Sample> = match before {
                Some(end) => s.samples.iter().filter(|x| x.0 < end).copied().collect(),
                None => s.samples.clone(),
            };
            let capacity = s.capacity_bytes;
            match judge_noisy(&judged, &config) {
                Ok(j) => {
                    let (ops, seconds) = match budget {
                        Some(budget) => verdict::ops(&j, capacity, budget),
                        None => verdict::unbudgeted(&j, capacity, evidence.requests_per_second),
                    };
                    SeriesResult {
                        series: s.name.clone(),
                        kind: s.kind,
                        samples: s.samples.clone(),
                        judgement: Some(j),
                        why_not_judged: None,
                        capacity_bytes: capacity,
                        seconds_to_oom: seconds,
                        ops: Some(ops),
                    }
                }
                Err(e) => SeriesResult {
                    series: s.name.clone(),
                    kind: s.kind,
                    samples: s.samples.clone(),
                    judgement: None,
                    why_not_judged: Some(e.to_string()),
                    capacity_bytes: capacity,
                    seconds_to_oom: None,
                    ops: None,
                },
            }
        })
        .collect()
}

/// The series the axis is read from: the first that fails, else the steepest that is not flat,
/// else the steepest (flat: its axis is none, unless a child process grows on its own).
pub fn axis_series(series: &[SeriesResult]) -> Option<(&SeriesResult, &NoisyJudgement)> {
    let judged = || {
        series
            .iter()
            .filter_map(|s| Some((s, s.judgement.as_ref()?)))
    };
    let steepest = |a: &(&SeriesResult, &NoisyJudgement), b: &(&SeriesResult, &NoisyJudgement)| {
        a.1.slope
            .bytes_per_request
            .total_cmp(&b.1.slope.bytes_per_request)
    };
    judged()
        .find(|(s, _)| s.ops.is_some_and(Ops::fails))
        .or_else(|| {
            judged()
                .filter(|(_, j)| j.verdict != Verdict::Flat)
                .max_by(steepest)
                .or_else(|| judged().max_by(steepest))
        })
}

/// The failing series whose growth full collections gave back: with the collector enabled, the
/// series' level right after the trim probe's full collection and `malloc_trim(0)` at the
/// judged requests' end is within its noise floor, or [`thresholds::GARBAGE_KEPT_SHARE`] of what
/// its slope adds over the requests between, of its level after the same before the warm-up.
/// A leak keeps what it keeps through any collection; the collector's garbage and the
/// allocator's free memory go. Where the collector is disabled, or its full collections put off
/// past CPython's cadence ([`thresholds::FULL_COLLECTION_THRESHOLD`]), a full collection run by
/// the probe proves nothing of production.
fn collected_garbage(
    evidence: &Evidence,
    series: &[SeriesResult],
    t: &Thresholds,
) -> Vec<diagnosis::Garbage> {
    let at_its_cadence = |c: &agent::Collector| {
        c.enabled
            && c.thresholds
                .get(2)
                .is_some_and(|t| *t <= thresholds::FULL_COLLECTION_THRESHOLD)
    };
    let (Some(collected), true) = (
        &evidence.collected,
        evidence.collector.as_ref().is_some_and(at_its_cadence),
    ) else {
        return Vec::new();
    };
    series
        .iter()
        .filter(|s| s.ops.is_some_and(Ops::fails))
        .filter_map(|s| {
            let (kept, requests) = collected.kept(&s.series)?;
            let slope = s.judgement.as_ref()?.slope.bytes_per_request;
            let allowance = noisy_config(s.kind, 0, t)
                .quantum_bytes
                .max(thresholds::GARBAGE_KEPT_SHARE * slope * requests as f64);
            (kept as f64 <= allowance).then(|| diagnosis::Garbage {
                series: s.series.clone(),
                kept,
                requests,
                allowance,
            })
        })
        .collect()
}

/// The host series that read a plateau (growth proven, then stopped) where the agent's census,
/// taken over requests after the judged ones, saw the tensors reachable from Python gain at least
/// [`thresholds::CENSUS_GROWTH`]. A leak's pages come in bursts: a service keeping 16 KiB a
/// request touched 64 KiB of new pages a request for 145 requests, then none for the last 108
/// of 400 while its cache kept growing (the twin's cache-leaky, 7 runs of 7 on 2026-12-07).
fn census_continued(evidence: &Evidence, series: &[SeriesResult]) -> Vec<diagnosis::Continued> {
    let Some(census) = evidence
        .census
        .as_ref()
        .filter(|c| c.steps > 0 && c.total_bytes as f64 >= thresholds::CENSUS_GROWTH)
    else {
        return Vec::new();
    };
    series
        .iter()
        // A plateau never fails on its own: it lasts, whatever its slope (`verdict::ops`).
        .filter(|s| {
            s.kind == Kind::Host
                && s.judgement
                    .as_ref()
                    .is_some_and(|j| j.verdict == Verdict::Plateau)
        })
        .map(|s| diagnosis::Continued {
            series: s.series.clone(),
            bytes: census.total_bytes,
            steps: census.steps,
        })
        .collect()
}

/// The judgement of `evidence` under `budget` (`None`: any leak proven fails).
pub fn judge(evidence: &Evidence, budget: Option<Budget>) -> Judgement {
    judge_with(evidence, budget, &Thresholds::default())
}

/// [`judge`] under other thresholds: what a calibration re-derives a threshold with.
pub fn judge_with(evidence: &Evidence, budget: Option<Budget>, t: &Thresholds) -> Judgement {
    let mut notes = Vec::new();
    // A failing target is judged on what it answered before its failures began: a leak proven
    // there fails (a service dying of its leak), and anything else cannot be judged, since the
    // memory of a service that answers errors says nothing of the one that serves.
    let failing_from = evidence.failing_from;
    let mut series = judge_series_with(evidence, budget, failing_from, t);
    // A failing growth that full collections at both ends gave back is the collector's garbage:
    // it passes, said as such (the axis, a note).
    let garbage = collected_garbage(evidence, &series, t);
    for g in &garbage {
        if let Some(s) = series.iter_mut().find(|s| s.series == g.series) {
            s.ops = Some(Ops::Pass);
        }
        notes.push(format!(
            "{} grew, and full collections gave it back: it kept {} over the {} requests between the trim probe's collections before the warm-up and after the judged requests, within the {} allowed; the collector's garbage passes",
            g.series,
            leaklab_report::signed_bytes(g.kept as f64),
            g.requests,
            leaklab_report::human_bytes(g.allowance)
        ));
    }
    // A host plateau the census shows went on is judged at the census's rate: what the census
    // counts is kept, whatever the pages did.
    let continued = if failing_from.is_none() {
        census_continued(evidence, &series)
    } else {
        Vec::new()
    };
    for c in &continued {
        let Some(s) = series.iter_mut().find(|s| s.series == c.series) else {
            continue;
        };
        let Some(judged) = &s.judgement else {
            continue;
        };
        // The series as the census reads it: still climbing, at the census's exact rate (its
        // bounds are itself), judged by the ops rule every series is judged by.
        let rate = c.bytes_per_request();
        let at_census_rate = NoisyJudgement {
            verdict: Verdict::Leak,
            slope: leaklab_detect::Slope {
                bytes_per_request: rate,
                low: rate,
                high: rate,
            },
            ..judged.clone()
        };
        let (ops, seconds) = match budget {
            Some(b) => verdict::ops(&at_census_rate, s.capacity_bytes, b),
            None => verdict::unbudgeted(
                &at_census_rate,
                s.capacity_bytes,
                evidence.requests_per_second,
            ),
        };
        let fails = ops.fails();
        if fails {
            s.ops = Some(ops);
            if budget.is_some() {
                s.seconds_to_oom = seconds.or(s.seconds_to_oom);
            }
        }
        notes.push(format!(
            "{} read a plateau, but the agent's census over the {} requests after the judged ones saw the tensors reachable from Python grow {} ({} a request): the growth went on in memory the allocator had free; judged at the census's rate, it {}",
            c.series,
            c.steps,
            leaklab_report::signed_bytes(c.bytes as f64),
            leaklab_report::signed_bytes(c.bytes_per_request()),
            if fails { "fails" } else { "lasts the budget" }
        ));
    }
    let outcome = if series.iter().any(|s| s.ops.is_some_and(Ops::fails)) {
        Outcome::Fail
    } else if failing_from.is_none() && series.iter().any(|s| s.judgement.is_some()) {
        Outcome::Pass
    } else {
        Outcome::CannotJudge
    };
    if let Some(from) = failing_from {
        // A series of a failing target that proved no leak passes nothing: its figures stay,
        // its ops verdict goes (the report's result column says it could not be judged).
        for s in series.iter_mut().filter(|s| !s.ops.is_some_and(Ops::fails)) {
            s.ops = None;
        }
        let judged = from.saturating_sub(evidence.warmup as u64);
        notes.push(match outcome {
            Outcome::Fail => format!("the target began failing at request {from}: the verdict is the leak proven on the {judged} judged requests answered before it; the failures may be that leak running out of memory"),
            _ => format!("the target began failing at request {from}: no verdict from a failing target (the {judged} judged requests answered before it proved no leak); make it answer, then scan again"),
        });
    }
    let census = evidence.census.as_ref();
    let mut sentence = verdict::diagnose(
        &series
            .iter()
            .filter_map(|s| {
                let went_on = continued.iter().any(|c| c.series == s.series);
                s.judgement
                    .as_ref()
                    .map(|j| (s.kind, if went_on { Verdict::Leak } else { j.verdict }))
            })
            .collect::<Vec<_>>(),
        census.is_some(),
    );
    if let Some(top) = census.and_then(|c| c.lines(1, "request").pop()) {
        sentence.push_str(&format!(
            " The agent's census names the holder that grew most: {top}."
        ));
    }
    let (axis, owner) = match axis_series(&series) {
        Some((deciding, judged)) => {
            let garbage = garbage.iter().find(|g| g.series == deciding.series);
            let (mut axis, owner) = explain(evidence, deciding, judged, garbage, t);
            if let Some(c) = continued.iter().find(|c| c.series == deciding.series) {
                diagnosis::continued(&mut axis, c);
            }
            (Some(axis), Some(owner))
        }
        None => (None, None),
    };
    Judgement {
        outcome,
        diagnosis: sentence,
        series,
        axis,
        owner,
        notes,
    }
}

/// The repeat phase of series `name` judged, where it ran. Its first tenth is not judged: what
/// the last new inputs left settles there (a repeat phase judged from its first request read
/// onnxruntime's arena at +5.09 kB a repeat, bound 3.04 to 7.14 kB, where it reads ±3.1 kB).
pub fn repeats(
    evidence: &Evidence,
    name: &str,
    kind: Kind,
    t: &Thresholds,
) -> Option<NoisyJudgement> {
    let samples = evidence.repeats.get(name)?;
    judge_noisy(samples, &noisy_config(kind, samples.len() / 10, t)).ok()
}

/// The axis and the owner of the deciding series' growth, from the phases, the process tree,
/// the census, the collector, the trim probe and the native trace.
fn explain(
    evidence: &Evidence,
    deciding: &SeriesResult,
    judged: &NoisyJudgement,
    garbage: Option<&diagnosis::Garbage>,
    t: &Thresholds,
) -> (diagnosis::AxisReading, diagnosis::OwnerReading) {
    let name = deciding.series.as_str();
    let repeats = repeats(evidence, name, deciding.kind, t);
    let (processes, threads) = match &evidence.tree {
        Some(looked) => tree::judge(
            looked.root,
            &looked.looks,
            &looked.commands,
            evidence.warmup as u64,
            t.host_noise_floor,
        ),
        None => (Vec::new(), None),
    };
    let mut axis = diagnosis::axis(
        name,
        judged,
        evidence.inputs,
        evidence.distinct_inputs,
        repeats.as_ref(),
        threads,
        processes,
    );
    if let (Some(r), Some(samples)) = (axis.repeats.as_mut(), evidence.repeats.get(name)) {
        r.requests = samples.len();
    }
    if let Some(s) = &evidence.shapes {
        diagnosis::shapes(&mut axis, s, judged);
    }
    diagnosis::settled(&mut axis, deciding.ops.is_some_and(Ops::fails));
    if let Some(t) = &evidence.trim {
        diagnosis::given_back(&mut axis, t);
    }
    if let Some(g) = garbage {
        diagnosis::garbage(&mut axis, g, evidence.collector.as_ref());
    }
    let kept = evidence
        .collected
        .as_ref()
        .and_then(|c| c.kept(name))
        .map(|(kept, requests)| kept as f64 / requests.max(1) as f64);
    let mut owner = diagnosis::owner_kept(
        &axis,
        evidence.census.as_ref(),
        evidence.collector.as_ref(),
        kept,
        &diagnosis::Elsewhere {
            agents: &evidence.agents,
            censuses: &evidence.worker_censuses,
        },
        &evidence.libraries,
    );
    if let Some(native) = &evidence.native {
        if let Some(h) = native.holders.first() {
            owner.mechanism = format!(
                "{} (the native trace: {} live under its frames)",
                h.title,
                leaklab_report::human_bytes(h.bytes as f64)
            );
            owner.fix = if h.knobs.is_empty() {
                h.fix.clone()
            } else {
                format!("{} ({})", h.fix, h.knobs.join(", "))
            };
        } else if let Some(line) = native.stack_lines(1).pop() {
            owner.mechanism = format!("an unknown native holder: {line}");
        }
    }
    // Memory the trim probe got back is the allocator's, held by nothing: a Python trace's
    // objects (a request in flight at a snapshot, the zoo's pyplot fixed twin in one CI run) do
    // not own it.
    if let Some(trace) = evidence
        .python_trace
        .as_ref()
        .filter(|_| axis.axis != diagnosis::Axis::GivenBack)
    {
        owner = diagnosis::python_objects(owner, axis.judged.slope.bytes_per_request, trace);
    }
    if let Some(t) = &evidence.trim {
        owner
            .findings
            .extend(t.findings.iter().map(|f| format!("trim probe: {f}")));
    }
    (axis, owner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use evidence::Series;

    /// A host series of `n` samples from 300 MB, `per_request` bytes a request, with a wobble
    /// of 32 kB (under the host floor) so the noise is not zero.
    fn evidence(per_request: i64, n: u64, failing_from: Option<u64>) -> Evidence {
        let samples = (0..n)
            .map(|x| {
                let wobble = if x % 3 == 0 { 32_768 } else { 0 };
                (x, 300_000_000 + per_request * x as i64 + wobble)
            })
            .collect();
        Evidence {
            schema: evidence::SCHEMA.to_string(),
            warmup: 20,
            requests_per_second: 50.0,
            inputs: diagnosis::Inputs::Same,
            distinct_inputs: 1,
            shapes: None,
            libraries: Vec::new(),
            series: vec![Series {
                name: "anonymous".into(),
                kind: Kind::Host,
                samples,
                capacity_bytes: Some(8 << 30),
            }],
            repeats: Default::default(),
            tree: None,
            failing_from,
            census: None,
            collector: None,
            trim: None,
            native: None,
            python_trace: None,
            collected: None,
            agents: Default::default(),
            worker_censuses: Default::default(),
        }
    }

    #[test]
    fn a_growth_full_collections_give_back_is_garbage_and_passes_and_one_they_keep_fails() {
        // 8 kB a request over 300 requests: a leak by its series.
        let with_thresholds = |kept: i64, enabled: Option<bool>, full: u64| {
            let mut e = evidence(8_000, 300, None);
            e.collector = enabled.map(|enabled| agent::Collector {
                enabled,
                thresholds: vec![700, 10, full],
                ..agent::Collector::default()
            });
            e.collected = Some(evidence::Collected {
                from: 20,
                to: 300,
                start: [("anonymous".to_string(), 290_000_000)].into(),
                end: [("anonymous".to_string(), 290_000_000 + kept)].into(),
            });
            judge(&e, None)
        };
        let with = |kept: i64, enabled: Option<bool>| with_thresholds(kept, enabled, 10);
        // Back to within the host floor after the collections at both ends: the collector's.
        let freed = with(40_000, Some(true));
        assert_eq!(freed.outcome, Outcome::Pass, "{:?}", freed.notes);
        let axis = freed.axis.as_ref().unwrap();
        assert_eq!(axis.axis, diagnosis::Axis::Garbage, "{}", axis.words);
        assert!(
            axis.words.contains("thresholds 700, 10, 10"),
            "{}",
            axis.words
        );
        assert_eq!(
            freed.owner.as_ref().unwrap().owner,
            diagnosis::Owner::Python
        );
        assert!(freed
            .notes
            .iter()
            .any(|n| n.contains("the collector's garbage passes")));
        // What a leak keeps through the collections fails: 280 requests of 8 kB.
        assert_eq!(with(280 * 8_000, Some(true)).outcome, Outcome::Fail);
        // A collector that is off frees nothing in production, and one not read proves nothing.
        assert_eq!(with(40_000, Some(false)).outcome, Outcome::Fail);
        assert_eq!(with(40_000, None).outcome, Outcome::Fail);
        // Nor one whose full collections were put off (gc.set_threshold(700, 10, 1000)).
        assert_eq!(
            with_thresholds(40_000, Some(true), 1_000).outcome,
            Outcome::Fail
        );
        // Three fifths of what the slope adds, kept through the collections (the least a leak
        // of the corpus's calibration split kept: 0.63): not garbage.
        assert_eq!(with(280 * 8_000 * 3 / 5, Some(true)).outcome, Outcome::Fail);
        // A third of it (the residue a collection leaves of its garbage's heap: cycles of 8 KiB
        // bytes kept 0.29): garbage.
        assert_eq!(with(280 * 8_000 / 3, Some(true)).outcome, Outcome::Pass);
    }

    #[test]
    fn a_failing_target_is_never_passed_and_a_leak_proven_before_its_failures_still_fails() {
        let flat = judge(&evidence(0, 300, None), None);
        assert_eq!(
            flat.outcome,
            Outcome::Pass,
            "{:?}",
            flat.series[0].judgement
        );
        assert!(flat.notes.is_empty());
        let failed = judge(&evidence(0, 300, Some(150)), None);
        assert_eq!(failed.outcome, Outcome::CannotJudge);
        assert!(
            failed.notes[0].starts_with("the target began failing at request 150: no verdict")
                && failed.notes[0].contains("the 130 judged requests"),
            "{:?}",
            failed.notes
        );
        // Judged on the samples before the failures, and every sample kept; no series passes.
        assert_eq!(failed.series[0].judgement.as_ref().unwrap().samples, 130);
        assert_eq!(failed.series[0].ops, None);
        assert_eq!(failed.series[0].samples.len(), 300);
        let leak = judge(&evidence(200_000, 300, Some(150)), None);
        assert_eq!(leak.outcome, Outcome::Fail);
        assert!(
            leak.notes[0].contains("the verdict is the leak proven"),
            "{:?}",
            leak.notes
        );
        // Failing from within the warm-up: nothing judged, nothing proven.
        let early = judge(&evidence(200_000, 300, Some(30)), None);
        assert_eq!(early.outcome, Outcome::CannotJudge);
        assert!(early.series[0].judgement.is_none());
    }

    #[test]
    fn a_recording_read_back_is_judged_exactly_as_it_was() {
        let mut recorded = evidence(3_000, 600, None);
        // Floats read back bit for bit (serde_json's float_roundtrip): a watch's look times
        // such as these read 1 ulp off without it, and its re-judged idle seconds with them.
        recorded.requests_per_second = 1.6022966589999998;
        let json = serde_json::to_string(&recorded).unwrap();
        let read: Evidence = serde_json::from_str(&json).unwrap();
        assert_eq!(read, recorded);
        for x in (1..2_000u64).map(|i| i as f64 * 0.200_301_7 + 1e-9 * i as f64) {
            let back: f64 = serde_json::from_str(&serde_json::to_string(&x).unwrap()).unwrap();
            assert_eq!(back.to_bits(), x.to_bits(), "{x}");
        }
        let (a, b) = (judge(&recorded, None), judge(&read, None));
        assert_eq!(
            serde_json::to_value(&a).unwrap(),
            serde_json::to_value(&b).unwrap()
        );
        assert!(
            evidence::check_schema(Some(&serde_json::json!("leaklab.evidence/9")))
                .unwrap_err()
                .to_string()
                .contains("where this judge reads leaklab.evidence/1")
        );
    }
}
