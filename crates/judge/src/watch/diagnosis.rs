//! The watch's diagnosis, in the scan's vocabulary ([`crate::diagnosis`]): the axis memory
//! grows along in production and who owns it. The watch drives no phases, so its axes are what
//! production shows: per request (the per-request series fails), by the clock (memory grows
//! while no request arrives) or in another process (with `--pid`, a process of the tree that is
//! not a serving one grows while the serving ones do not). The owner is read from the agent's
//! censuses at the watch's start and its end: the holders that grew between them
//! ([`crate::agent::diff`]), weighed against what the memory grew meanwhile by the scan's own
//! rule ([`census_owner`]).

use super::looks::RunResult;
use crate::agent::{CensusDiff, Collector};
use crate::diagnosis::{
    census_owner, kebab, other_process, Elsewhere, Owner, OwnerReading, Weighed,
};
use crate::tree::{ProcessGrowth, ThreadCount};
use leaklab_detect::budget::Ops;
use leaklab_detect::Verdict;
use leaklab_report::{human_bytes, signed_bytes};
use serde::{Deserialize, Serialize};

/// The axis memory grows along in production (the scan's names where they mean the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Axis {
    /// The per-request series fails: every request adds.
    PerRequest,
    /// Memory grows while no request arrives (a background thread, a timer).
    ByTheClock,
    /// A process of the tree beside the serving ones grows while they do not.
    OtherProcess,
    /// Nothing grows.
    None,
}

impl Axis {
    pub fn words(self) -> &'static str {
        match self {
            Axis::PerRequest => "per request",
            Axis::ByTheClock => "by the clock",
            Axis::OtherProcess => "in another process",
            Axis::None => "none",
        }
    }
}

/// The axis of the deciding run, with the figures it was read from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AxisReading {
    pub axis: Axis,
    /// The series it is read from.
    pub series: String,
    /// The deciding series' slope a request, where it is judged per request.
    pub bytes_per_request: Option<f64>,
    /// The growth while idle, an hour, where it is proven.
    pub bytes_per_hour: Option<f64>,
    /// With `--pid`: each process of the tree over the run's requests, the root first.
    pub processes: Vec<ProcessGrowth>,
    pub threads: Option<ThreadCount>,
    /// The axis in a sentence, with its figures.
    pub words: String,
}

/// The axis of `run` (the deciding one); `processes`: its tree judged per request, where
/// `--pid` was given (`leaklab_scan::tree::judge`).
pub fn axis(
    run: &RunResult,
    processes: Vec<ProcessGrowth>,
    threads: Option<ThreadCount>,
) -> AxisReading {
    let failing = run.series.iter().find(|s| s.ops.is_some_and(Ops::fails));
    let clock = run.idle.iter().find(|f| f.fails());
    let per_hour = clock.and_then(|f| f.bytes_per_hour);
    let leaks = |p: &&ProcessGrowth| p.verdict == Some(Verdict::Leak);
    let serving = |p: &&ProcessGrowth| run.pids.contains(&p.pid);
    let other = processes.iter().filter(leaks).find(|p| !serving(p));
    let serving_grows = processes.iter().filter(leaks).any(|p| serving(&p));
    let clock_words = |series: &str, (rate, low, high): (f64, f64, f64), idle: f64| {
        format!(
            "{series} {}/hour (bound {} .. {}) while no request arrived, over {} idle: a background thread, a timer or a cache filled by the clock",
            signed_bytes(rate),
            human_bytes(low),
            human_bytes(high),
            leaklab_report::human_duration(idle)
        )
    };
    let (axis, series, per_request, words) = match (failing, clock) {
        (Some(s), _) => {
            let j = s.judgement.as_ref().expect("a failing series is judged");
            let per = j.slope.bytes_per_request;
            match (other, serving_grows) {
                (Some(c), false) => {
                    let lines: Vec<String> = std::iter::once(c.line())
                        .chain(
                            processes
                                .iter()
                                .filter(|p| serving(p))
                                .map(ProcessGrowth::line),
                        )
                        .collect();
                    (
                        Axis::OtherProcess,
                        s.series.clone(),
                        Some(per),
                        format!(
                            "{}: the growth is in a process beside the serving ones",
                            lines.join(", ")
                        ),
                    )
                }
                _ => {
                    let mut words = format!(
                        "{} {} a request (bound {} .. {}) over {} requests of production's own traffic",
                        s.series,
                        signed_bytes(per),
                        human_bytes(j.slope.low),
                        human_bytes(j.slope.high),
                        run.requests
                    );
                    if let (Some(f), Some(rate)) = (clock, per_hour) {
                        words.push_str(&format!(
                            "; besides, {}",
                            clock_words(&f.series, rate, f.idle_seconds)
                        ));
                    }
                    (Axis::PerRequest, s.series.clone(), Some(per), words)
                }
            }
        }
        (None, Some(f)) => {
            let words = per_hour.map_or_else(
                || format!("{} grows while no request arrives", f.series),
                |rate| clock_words(&f.series, rate, f.idle_seconds),
            );
            (Axis::ByTheClock, f.series.clone(), None, words)
        }
        (None, None) => (
            Axis::None,
            String::new(),
            None,
            "no series grows per request, and none while idle".to_string(),
        ),
    };
    AxisReading {
        axis,
        series,
        bytes_per_request: per_request,
        bytes_per_hour: per_hour.map(|r| r.0),
        processes,
        threads,
        words,
    }
}

/// Who owns the growth. `census`: the holders that grew between the censuses at the watch's
/// start and its end; `seconds`: the time between them; `collector`: the collector's state at
/// the last look. The census is weighed against what the memory grew meanwhile by the axis's own
/// rate (a request's bytes, or the clock's bytes a second), by the scan's rule
/// ([`census_owner`]).
pub fn owner(
    axis: &AxisReading,
    census: Option<&CensusDiff>,
    collector: Option<&Collector>,
    seconds: f64,
    elsewhere: &Elsewhere,
) -> OwnerReading {
    let clock = axis.axis == Axis::ByTheClock;
    // Each worker's census counts, where the service's workers serve agents of their own.
    let own_pid = census.and_then(|c| c.pid);
    let merged = crate::agent::merged(census, elsewhere.censuses);
    let census = merged.as_ref();
    let weighed = census_owner(
        &Weighed {
            per_step: if clock {
                axis.bytes_per_hour.unwrap_or(0.0) / 3600.0
            } else {
                axis.bytes_per_request.unwrap_or(0.0)
            },
            step: if clock { "second" } else { "request" },
            steps: clock.then_some(seconds),
            kept: None,
            python_mechanism: if clock {
                "a Python holder reachable from a root is filled by the clock (a background thread, a timer)"
            } else {
                "a Python holder reachable from a root keeps what each request leaves"
            }
            .into(),
            native: if clock {
                ("memory kept by the clock (a background thread, a timer, a cache filled by time), reachable from no Python tensor", "`leaklab scan --agent … --native` against a copy of the service names the allocating stacks")
            } else {
                ("memory kept per request, reachable from no Python tensor", "`leaklab scan --agent … --native` against a copy of the service names the allocating stacks")
            },
            without: (
                "Python or native: not told apart without the agent's censuses at the watch's start and end (--agent)",
                "watch again with --agent to name the owner",
            ),
        },
        census,
        collector,
    );
    match axis.axis {
        Axis::None => weighed.instead(
            Owner::None,
            "nothing grows".into(),
            "none",
            "none needed".into(),
        ),
        Axis::OtherProcess => {
            let grew: Vec<_> = axis
                .processes
                .iter()
                .filter(|p| p.verdict == Some(Verdict::Leak))
                .collect();
            other_process(weighed, &grew, "watch", elsewhere)
        }
        Axis::PerRequest | Axis::ByTheClock => {
            crate::diagnosis::held_in(weighed, elsewhere, own_pid)
        }
    }
}

/// The report's first lines, as the scan's: verdict, axis, owner, mechanism, fix.
pub fn first_lines(
    verdict: &str,
    axis: Option<&AxisReading>,
    owner: Option<&OwnerReading>,
) -> Vec<String> {
    let mut lines = vec![format!("verdict:   {verdict}")];
    if let Some(a) = axis {
        lines.push(format!("axis:      {}: {}", a.axis.words(), a.words));
    }
    if let Some(o) = owner {
        lines.push(format!("owner:     {}: {}", kebab(o.owner), o.words));
        if axis.is_some_and(|a| a.axis != Axis::None) {
            lines.push(format!("mechanism: {}", o.mechanism));
            lines.push(format!("fix:       {}", o.fix));
        }
        lines.extend(o.findings.iter().map(|f| format!("finding:   {f}")));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::Growth;
    use crate::watch::looks::IdleFinding;
    use crate::{Kind, SeriesResult};
    use leaklab_detect::{judge_noisy, NoisyConfig};

    /// A run whose `anonymous` series grows `per` bytes a request over 300 requests, judged
    /// failing where `fails`; `idle`: an idle finding that fails, at `per_hour`.
    fn run(per: i64, fails: bool, per_hour: Option<f64>) -> RunResult {
        let samples: Vec<(u64, i64)> = (0..300)
            .map(|i| {
                (
                    i,
                    300_000_000 + per * i as i64 + ((i * 2_654_435_761) % 30_000) as i64,
                )
            })
            .collect();
        let judgement = judge_noisy(&samples, &NoisyConfig::new(0)).unwrap();
        let ops = if fails { Ops::Fail } else { Ops::Pass };
        RunResult {
            index: 1,
            restart: None,
            pids: vec![10],
            from_seconds: 0.0,
            to_seconds: 60.0,
            looks: 300,
            requests: 300,
            requests_per_second: 5.0,
            series: vec![SeriesResult {
                series: "anonymous".into(),
                kind: Kind::Host,
                samples,
                judgement: Some(judgement),
                why_not_judged: None,
                capacity_bytes: None,
                seconds_to_oom: None,
                ops: Some(ops),
            }],
            idle: per_hour
                .map(|rate| IdleFinding {
                    series: "anonymous".into(),
                    idle_seconds: 30.0,
                    samples: Vec::new(),
                    judgement: None,
                    why_not_judged: None,
                    bytes_per_hour: Some((rate, 0.9 * rate, 1.1 * rate)),
                    seconds_to_oom: None,
                    ops: Some(Ops::Fail),
                })
                .into_iter()
                .collect(),
        }
    }

    fn process(pid: u32, root: bool, verdict: Verdict) -> ProcessGrowth {
        ProcessGrowth {
            pid,
            command: "python worker.py".into(),
            root,
            verdict: Some(verdict),
            measure: "anonymous".into(),
            bytes_per_request: if verdict == Verdict::Leak {
                32_768.0
            } else {
                3.0
            },
            bound: 100.0,
            rise_bytes: 0.0,
        }
    }

    fn census(holder: &str, kind: &str, bytes: i64, steps: u64) -> CensusDiff {
        CensusDiff {
            pid: None,
            steps,
            grown: vec![Growth {
                holder: holder.into(),
                kind: kind.into(),
                bytes,
                bytes_per_step: bytes as f64 / steps as f64,
                tensors: steps as i64,
                graph_nodes: 0,
                bytes_after: bytes as u64,
                shapes: vec![],
                entries: None,
            }],
            total_bytes: bytes,
            total_tensors: steps as i64,
            total_graph_nodes: 0,
            census_seconds: (0.4, 0.4),
            notes: vec![],
            heap: None,
        }
    }

    #[test]
    fn a_failing_series_is_per_request_and_a_census_that_holds_it_names_the_python_owner() {
        let a = axis(
            &run(32_768, true, None),
            vec![process(10, true, Verdict::Leak)],
            None,
        );
        assert_eq!((a.axis, a.series.as_str()), (Axis::PerRequest, "anonymous"));
        assert!(
            a.words.contains("+32.7") && a.words.contains("300 requests"),
            "{}",
            a.words
        );
        // 300 requests of 32.77 kB: the census holds all of it.
        let held = census("service.KEPT", "module global", 300 * 32_768, 300);
        let o = owner(&a, Some(&held), None, 60.0, &Elsewhere::nothing());
        assert_eq!(
            (o.owner, o.holder.as_deref()),
            (Owner::Python, Some("service.KEPT"))
        );
        assert!(
            o.census_share.is_some_and(|s| (s - 1.0).abs() < 0.02),
            "{o:?}"
        );
        // A tenth of it: not Python's; none at all: unknown.
        let little = census("service.KEPT", "module global", 30 * 32_768, 300);
        assert_eq!(
            owner(&a, Some(&little), None, 60.0, &Elsewhere::nothing()).owner,
            Owner::Native
        );
        // The scan's rule, said once: a disabled collector is a finding and the mechanism.
        let off = Collector {
            enabled: false,
            ..Collector::default()
        };
        let o = owner(&a, Some(&held), Some(&off), 60.0, &Elsewhere::nothing());
        assert!(
            o.mechanism.contains("collector is disabled")
                && o.findings.iter().any(|f| f.contains("gc.disable()")),
            "{o:?}"
        );
        assert!(
            first_lines("FAIL", Some(&a), Some(&o))
                .iter()
                .any(|l| l.starts_with("finding:   gc is disabled")),
            "the watch's report says it"
        );
        assert_eq!(
            owner(&a, None, None, 60.0, &Elsewhere::nothing()).owner,
            Owner::Unknown
        );
        let lines = first_lines(
            "FAIL",
            Some(&a),
            Some(&owner(&a, Some(&held), None, 60.0, &Elsewhere::nothing())),
        );
        assert!(
            lines[1].starts_with("axis:      per request: anonymous"),
            "{lines:?}"
        );
        assert!(
            lines[2].starts_with("owner:     python: the census holds"),
            "{lines:?}"
        );
        assert!(lines[4].contains("`service.KEPT`"), "{lines:?}");
    }

    #[test]
    fn growth_while_idle_alone_is_by_the_clock_and_weighed_by_the_time() {
        let a = axis(&run(0, false, Some(3.6e9)), Vec::new(), None);
        assert_eq!(a.axis, Axis::ByTheClock, "{}", a.words);
        assert_eq!(a.bytes_per_hour, Some(3.6e9));
        // 1 MB a second for 20 s: a holder that grew 20 MB owns it, whatever the requests.
        let held = census("service.TICKS", "module global", 20_000_000, 3);
        let o = owner(&a, Some(&held), None, 20.0, &Elsewhere::nothing());
        assert_eq!(o.owner, Owner::Python, "{}", o.words);
        assert!(o.mechanism.contains("clock"), "{}", o.mechanism);
        // Both: per request, the clock said beside it.
        let both = axis(&run(32_768, true, Some(3.6e9)), Vec::new(), None);
        assert_eq!(both.axis, Axis::PerRequest);
        assert!(both.words.contains("besides"), "{}", both.words);
        // Neither: none, and no mechanism line.
        let none = axis(&run(0, false, None), Vec::new(), None);
        assert_eq!(none.axis, Axis::None);
        let o = owner(&none, None, None, 0.0, &Elsewhere::nothing());
        assert_eq!(first_lines("PASS", Some(&none), Some(&o)).len(), 3);
    }

    #[test]
    fn a_process_beside_the_serving_ones_that_grows_alone_is_another_process() {
        let r = run(32_768, true, None);
        // The serving process 10 flat, its child 11 growing.
        let a = axis(
            &r,
            vec![
                process(10, true, Verdict::Flat),
                process(11, false, Verdict::Leak),
            ],
            None,
        );
        assert_eq!(a.axis, Axis::OtherProcess, "{}", a.words);
        assert!(
            a.words.starts_with("child process 11 (python worker.py)"),
            "{}",
            a.words
        );
        let o = owner(&a, None, None, 60.0, &Elsewhere::nothing());
        assert_eq!(o.owner, Owner::OtherProcess);
        assert!(o.fix.contains("--pid 11"), "{}", o.fix);
        // Workers that serve (the agent's PIDs) growing under a flat parent: per request.
        let mut workers = r.clone();
        workers.pids = vec![11, 12];
        let w = axis(
            &workers,
            vec![
                process(10, true, Verdict::Flat),
                process(11, false, Verdict::Leak),
                process(12, false, Verdict::Leak),
            ],
            None,
        );
        assert_eq!(w.axis, Axis::PerRequest, "{}", w.words);
    }
}
