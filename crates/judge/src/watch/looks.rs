//! From the watch's looks to verdicts: the looks cut into runs at each restart, each run's memory
//! judged per request by the detector (on the looks where the count moved), and the memory that
//! moved while no request arrived judged apart, per hour.
//!
//! Idle is not a leak: looks that saw no new request add nothing to the per-request series.
//! Memory that grows while idle (a background thread, a timer's cache) is its own finding; where
//! that growth is proven, the clock grows the memory while requests arrive too, so its rate times
//! the time since the run's first look is taken out of the per-request series: a leak by the
//! clock is not billed to the requests.

use super::WatchEvidence;
use crate::tree::TreeLook;
use crate::{noisy_config, Kind, SeriesResult, Thresholds};
use leaklab_detect::budget::{ops, proven, seconds_to_oom, unbudgeted, Budget, Ops};
use leaklab_detect::{judge_noisy, NoisyJudgement, Sample};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What one look saw.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// Seconds since the watch started.
    pub t: f64,
    /// Requests answered since the serving processes started (summed over the workers).
    pub answered: u64,
    /// Requests started, where the count knows them (the agent's): started minus answered are in
    /// flight, so the service is not idle.
    pub started: Option<u64>,
    /// The serving processes (the agent's workers, the PID watched, or the cgroup's processes),
    /// sorted: a change is a restart.
    pub pids: Vec<u32>,
    /// Series name → bytes.
    pub memory: BTreeMap<String, i64>,
}

/// Steps a second of the idle series: its x is milliseconds of idle time.
const IDLE_STEPS_PER_SECOND: f64 = 1000.0;

/// Why a new run began.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Restart {
    /// The serving processes changed (a PID, or a worker's, replaced).
    Processes { before: Vec<u32>, after: Vec<u32> },
    /// The request count went back: the counter restarted from zero.
    CounterReset { before: u64, after: u64 },
}

impl std::fmt::Display for Restart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = |p: &[u32]| p.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
        match self {
            Restart::Processes { before, after } => write!(
                f,
                "the serving processes changed: PID {} replaced by {}",
                list(before),
                list(after)
            ),
            Restart::CounterReset { before, after } => write!(
                f,
                "the request count went back from {before} to {after}: the service restarted"
            ),
        }
    }
}

/// A stretch of looks at the same processes.
#[derive(Debug, Clone, PartialEq)]
pub struct Run<'a> {
    pub restart: Option<Restart>,
    /// The index of its first look among all the looks.
    pub start: usize,
    pub points: &'a [Point],
}

/// Why `b` is not the same run as `a`, if it is not.
fn restart(a: &Point, b: &Point) -> Option<Restart> {
    if !a.pids.is_empty() && !b.pids.is_empty() && a.pids != b.pids {
        return Some(Restart::Processes {
            before: a.pids.clone(),
            after: b.pids.clone(),
        });
    }
    (b.answered < a.answered).then_some(Restart::CounterReset {
        before: a.answered,
        after: b.answered,
    })
}

/// The looks cut at each restart.
pub fn runs(points: &[Point]) -> Vec<Run<'_>> {
    let mut runs = Vec::new();
    let (mut start, mut why) = (0, None);
    for i in 1..=points.len() {
        let cut = (i < points.len())
            .then(|| restart(&points[i - 1], &points[i]))
            .flatten();
        if i == points.len() || cut.is_some() {
            runs.push(Run {
                restart: why.take(),
                start,
                points: &points[start..i],
            });
            (start, why) = (i, cut);
        }
    }
    runs
}

/// Nothing arrived and nothing was in flight between two looks.
fn idle(a: &Point, b: &Point) -> bool {
    a.answered == b.answered && a.started == b.started && b.started.is_none_or(|s| s == b.answered)
}

/// `series` over idle time: each idle interval between two looks adds its duration (x, in
/// milliseconds) and its change of memory (y), so the stretches join into one series of what
/// the memory did while no request arrived. Also the idle seconds.
pub fn idle_series(points: &[Point], series: &str) -> (Vec<Sample>, f64) {
    let (mut x, mut y, mut seconds) = (0.0f64, None::<i64>, 0.0);
    let mut out = Vec::new();
    for w in points.windows(2) {
        let (Some(&a), Some(&b)) = (w[0].memory.get(series), w[1].memory.get(series)) else {
            continue;
        };
        if !idle(&w[0], &w[1]) {
            continue;
        }
        let level = y.get_or_insert(a);
        if out.is_empty() {
            out.push((0, *level));
        }
        *level += b - a;
        x += (w[1].t - w[0].t) * 1000.0;
        seconds += w[1].t - w[0].t;
        out.push((x.round() as u64, *level));
    }
    out.dedup_by_key(|s| s.0);
    (out, seconds)
}

/// `series` per request, on an even grid of request counts ([`even`]): the first look at each
/// request count, from `warmup` requests into the run on, less `clock_rate` bytes a second of the
/// time since the run's first look (a growth by the clock, proven while idle). x: requests since
/// the run's first look.
pub fn per_request(
    points: &[Point],
    series: &str,
    warmup: u64,
    clock_rate: Option<f64>,
) -> Vec<Sample> {
    even(&looks_per_request(points, series, warmup, clock_rate))
}

/// A look's value at a request count between two looks: on the line through them.
pub trait Between: Clone {
    /// `a` moved a share `f` (0 to 1) of the way to `b`.
    fn between(a: &Self, b: &Self, f: f64) -> Self;
}

impl Between for i64 {
    fn between(a: &i64, b: &i64, f: f64) -> i64 {
        a + ((b - a) as f64 * f).round() as i64
    }
}

impl Between for TreeLook {
    /// Each process's anonymous bytes where both looks saw it; the rest as `a` saw it.
    fn between(a: &TreeLook, b: &TreeLook, f: f64) -> TreeLook {
        let anonymous = a
            .anonymous
            .iter()
            .map(
                |&(pid, va)| match b.anonymous.iter().find(|(p, _)| *p == pid) {
                    Some(&(_, vb)) => (pid, i64::between(&(va as i64), &(vb as i64), f) as u64),
                    None => (pid, va),
                },
            )
            .collect();
        TreeLook {
            anonymous,
            ..a.clone()
        }
    }
}

/// The looks put on an even grid of request counts, as many points as looks, each the line
/// between the looks on either side of it (the look itself where one falls on it). Production's
/// rate varies, so the looks fall 4 requests apart in a quiet minute and 20 in a busy one; the
/// detector's noise estimate compares the steps between its floor points, which must then span
/// equal numbers of requests (measured: a leak of 32 kB a request at 20 to 100 requests a second
/// read as a plateau with 3.2 MB of noise on the looks as they fell, see
/// crates/cli/tests/watch.rs). A grid point that held the last look at or before it instead was
/// that look's requests behind, up to a whole look's worth where requests come fast (20 at 100 a
/// second every 200 ms, 655 kB of this leak), and differently so in each phase: the noise of
/// the same looks read 507 and 550 kB held, 14 and 94 kB on the line (two watches beside two
/// busy cores), and once, on a loaded machine, 1.3 MB held, which read a plateau.
pub fn even<T: Between>(samples: &[(u64, T)]) -> Vec<(u64, T)> {
    let (Some(first), Some(last)) = (samples.first(), samples.last()) else {
        return Vec::new();
    };
    let step = ((last.0 - first.0) as f64 / (samples.len().max(2) - 1) as f64).max(1.0);
    let mut out: Vec<(u64, T)> = Vec::with_capacity(samples.len());
    let mut i = 0;
    for k in 0.. {
        let x = first.0 + (k as f64 * step).round() as u64;
        if x > last.0 {
            break;
        }
        while i + 1 < samples.len() && samples[i + 1].0 <= x {
            i += 1;
        }
        if out.last().is_some_and(|s| s.0 == x) {
            continue;
        }
        let (a, b) = (&samples[i], samples.get(i + 1));
        let value = match b {
            Some(b) if a.0 < x => T::between(&a.1, &b.1, (x - a.0) as f64 / (b.0 - a.0) as f64),
            _ => a.1.clone(),
        };
        out.push((x, value));
    }
    out
}

/// The first look at each request count, as [`per_request`] takes them, before the grid.
pub fn looks_per_request(
    points: &[Point],
    series: &str,
    warmup: u64,
    clock_rate: Option<f64>,
) -> Vec<Sample> {
    let Some(base) = points.first().map(|p| p.answered) else {
        return Vec::new();
    };
    let mut out = Vec::<Sample>::new();
    for p in points {
        let x = p.answered - base;
        let Some(&bytes) = p.memory.get(series) else {
            continue;
        };
        if x < warmup || out.last().is_some_and(|s| s.0 == x) {
            continue;
        }
        let clock = clock_rate.map_or(0.0, |r| r * (p.t - points[0].t));
        out.push((x, bytes - clock.round() as i64));
    }
    out
}

/// The process tree per request over a run, as [`per_request`] takes the summed series: the
/// first look at each request count (x: requests since the run's first look), on the even grid.
/// `trees`: each look's tree reading and its root, aligned with `points`.
pub fn tree_per_request(
    points: &[Point],
    trees: &[Option<(u32, TreeLook)>],
) -> Option<(u32, Vec<(u64, TreeLook)>)> {
    let base = points.first()?.answered;
    let root = trees.iter().flatten().last()?.0;
    let mut out = Vec::<(u64, TreeLook)>::new();
    for (p, tree) in points.iter().zip(trees) {
        let Some((r, reading)) = tree else { continue };
        let x = p.answered - base;
        if *r != root || out.last().is_some_and(|s| s.0 == x) {
            continue;
        }
        out.push((x, reading.clone()));
    }
    Some((root, even(&out)))
}

/// Memory that moved while no request arrived.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IdleFinding {
    pub series: String,
    pub idle_seconds: f64,
    /// The idle series (x: milliseconds of idle time).
    pub samples: Vec<Sample>,
    pub judgement: Option<NoisyJudgement>,
    pub why_not_judged: Option<String>,
    /// The slope and its bounds in bytes an hour.
    pub bytes_per_hour: Option<(f64, f64, f64)>,
    /// Were the service idle from now on: when it would run out.
    pub seconds_to_oom: Option<f64>,
    pub ops: Option<Ops>,
}

impl IdleFinding {
    /// A growth while idle that the detector proves (and, with a budget, that runs out within it).
    pub fn fails(&self) -> bool {
        self.ops.is_some_and(Ops::fails)
    }
}

/// One run judged.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunResult {
    /// 1, 2, ...
    pub index: usize,
    pub restart: Option<Restart>,
    pub pids: Vec<u32>,
    pub from_seconds: f64,
    pub to_seconds: f64,
    pub looks: usize,
    /// Requests answered during the run (the count's rise from its first look).
    pub requests: u64,
    /// Requests a second over the run: production's own rate.
    pub requests_per_second: f64,
    pub series: Vec<SeriesResult>,
    pub idle: Vec<IdleFinding>,
}

impl RunResult {
    pub fn fails(&self) -> bool {
        self.series.iter().any(|s| s.ops.is_some_and(Ops::fails))
            || self.idle.iter().any(IdleFinding::fails)
    }

    pub fn judged(&self) -> bool {
        self.series.iter().any(|s| s.judgement.is_some())
    }

    /// Every verdict is one more looks cannot change.
    pub fn confident(&self) -> bool {
        self.judged() && self.series.iter().all(|s| s.ops.is_none_or(Ops::confident))
    }
}

/// What judging reads besides the looks: the watch's evidence and the budget.
#[derive(Clone, Copy)]
pub struct Judging<'a> {
    pub evidence: &'a WatchEvidence,
    pub budget: Option<Budget>,
}

fn judge_idle(points: &[Point], series: &str, kind: Kind, j: &Judging) -> IdleFinding {
    let (samples, idle_seconds) = idle_series(points, series);
    let capacity = j.evidence.capacity.get(series).copied();
    let mut finding = IdleFinding {
        series: series.to_string(),
        idle_seconds,
        samples,
        judgement: None,
        why_not_judged: None,
        bytes_per_hour: None,
        seconds_to_oom: None,
        ops: None,
    };
    match judge_noisy(
        &finding.samples,
        &noisy_config(kind, 0, &Thresholds::default()),
    ) {
        Ok(judgement) => {
            let hour = 3600.0 * IDLE_STEPS_PER_SECOND;
            let s = judgement.slope;
            finding.bytes_per_hour =
                Some((s.bytes_per_request * hour, s.low * hour, s.high * hour));
            let (o, seconds) = match j.budget {
                Some(b) => ops(
                    &judgement,
                    capacity,
                    Budget {
                        steps_per_second: IDLE_STEPS_PER_SECOND,
                        seconds: b.seconds,
                    },
                ),
                None => unbudgeted(&judgement, capacity, IDLE_STEPS_PER_SECOND),
            };
            finding.ops = Some(o);
            finding.seconds_to_oom = seconds;
            finding.judgement = Some(judgement);
        }
        Err(e) => {
            finding.why_not_judged = Some(format!(
                "{e} (a sample: an interval between two looks with no request in it)"
            ));
        }
    }
    finding
}

/// Judges one run: each series per request (its growth by the clock, where proven while idle,
/// taken out first).
pub fn judge_run(index: usize, run: &Run, j: &Judging) -> RunResult {
    let points = run.points;
    let (first, last) = (&points[0], &points[points.len() - 1]);
    let seconds = (last.t - first.t).max(1e-9);
    let requests = last.answered - first.answered;
    let rate = requests as f64 / seconds;
    let names: Vec<&String> = j
        .evidence
        .kinds
        .keys()
        .filter(|n| points.iter().any(|p| p.memory.contains_key(*n)))
        .collect();
    let (mut series, mut idle) = (Vec::new(), Vec::new());
    for name in names {
        let kind = j.evidence.kinds[name];
        let finding = judge_idle(points, name, kind, j);
        let clock_rate = finding
            .judgement
            .as_ref()
            .filter(|g| proven(g.verdict, &g.slope, 0.0))
            .map(|g| g.slope.bytes_per_request * IDLE_STEPS_PER_SECOND);
        idle.push(finding);
        let samples = per_request(points, name, j.evidence.warmup, clock_rate);
        let capacity = j.evidence.capacity.get(name).copied();
        let result = match judge_noisy(&samples, &noisy_config(kind, 0, &Thresholds::default())) {
            Ok(judgement) => {
                let (o, oom) = match j.budget {
                    Some(b) => ops(&judgement, capacity, b),
                    None => unbudgeted(&judgement, capacity, rate),
                };
                SeriesResult {
                    series: name.clone(),
                    kind,
                    samples,
                    judgement: Some(judgement),
                    why_not_judged: None,
                    capacity_bytes: capacity,
                    seconds_to_oom: oom,
                    ops: Some(o),
                }
            }
            Err(e) => SeriesResult {
                series: name.clone(),
                kind,
                samples,
                judgement: None,
                why_not_judged: Some(format!(
                    "{e} (looks at distinct request counts, after the warm-up of {} requests)",
                    j.evidence.warmup
                )),
                capacity_bytes: capacity,
                seconds_to_oom: None,
                ops: None,
            },
        };
        series.push(result);
    }
    RunResult {
        index,
        restart: run.restart.clone(),
        pids: first.pids.clone(),
        from_seconds: first.t,
        to_seconds: last.t,
        looks: points.len(),
        requests,
        requests_per_second: rate,
        series,
        idle,
    }
}

/// The time to OOM of an idle growth at its estimate, from the floor now (for the live line).
pub fn idle_hours_to_oom(f: &IdleFinding, capacity: Option<u64>) -> Option<f64> {
    let j = f.judgement.as_ref()?;
    seconds_to_oom(
        capacity? as f64,
        j.floor_now as f64,
        j.slope.bytes_per_request,
        IDLE_STEPS_PER_SECOND,
    )
    .map(|s| s / 3600.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(t: f64, answered: u64, pid: u32, bytes: i64) -> Point {
        Point {
            t,
            answered,
            started: Some(answered),
            pids: vec![pid],
            memory: BTreeMap::from([("anon".to_string(), bytes)]),
        }
    }

    #[test]
    fn a_restart_cuts_the_looks_into_runs_and_says_why() {
        let points = vec![
            point(0.0, 5, 1, 0),
            point(1.0, 9, 1, 0),
            point(2.0, 1, 2, 0),
            point(3.0, 4, 2, 0),
            point(4.0, 0, 2, 0),
        ];
        let r = runs(&points);
        assert_eq!(r.len(), 3);
        assert_eq!(r[0].points.len(), 2);
        assert_eq!(
            r[1].restart,
            Some(Restart::Processes {
                before: vec![1],
                after: vec![2]
            })
        );
        assert_eq!(
            r[2].restart,
            Some(Restart::CounterReset {
                before: 4,
                after: 0
            })
        );
        assert!(r[2]
            .restart
            .as_ref()
            .unwrap()
            .to_string()
            .contains("went back from 4 to 0"));
    }

    #[test]
    fn idle_looks_add_nothing_per_request_and_their_growth_joins_into_one_series() {
        // Two busy looks, three idle ones growing 100 B each, one busy one.
        let points = vec![
            point(0.0, 0, 1, 1000),
            point(1.0, 10, 1, 2000),
            point(2.0, 10, 1, 2100),
            point(3.0, 10, 1, 2200),
            point(4.0, 20, 1, 3200),
            point(5.0, 20, 1, 3300),
        ];
        assert_eq!(
            looks_per_request(&points, "anon", 0, None),
            vec![(0, 1000), (10, 2000), (20, 3200)]
        );
        // Less 100 B a second since the first look.
        assert_eq!(
            looks_per_request(&points, "anon", 0, Some(100.0)),
            vec![(0, 1000), (10, 1900), (20, 2800)]
        );
        assert_eq!(
            looks_per_request(&points, "anon", 10, None),
            vec![(10, 2000), (20, 3200)]
        );
        let (idle, seconds) = idle_series(&points, "anon");
        assert_eq!(
            idle,
            vec![(0, 2000), (1000, 2100), (2000, 2200), (3000, 2300)]
        );
        assert_eq!(seconds, 3.0);
    }

    #[test]
    fn looks_at_uneven_counts_are_put_on_an_even_grid_on_the_lines_between_them() {
        // Four requests a look, then twenty: five looks, five grid points 12.5 requests apart,
        // each on the line between the looks beside it (10 B a request: exactly 10 x).
        let looks = vec![(0, 0), (4, 40), (8, 80), (28, 280), (50, 500)];
        assert_eq!(
            even(&looks),
            vec![(0, 0), (13, 130), (25, 250), (38, 380), (50, 500)]
        );
        assert_eq!(even(&[(7, 1)]), vec![(7, 1)]);
        assert!(even::<i64>(&[]).is_empty());
    }

    #[test]
    fn the_tree_per_request_keeps_the_first_look_at_each_count_under_the_last_root() {
        let tree = |bytes: u64| TreeLook {
            threads: 3,
            anonymous: vec![(1, bytes)],
            ..TreeLook::default()
        };
        let points = vec![
            point(0.0, 0, 1, 0),
            point(1.0, 0, 1, 0),
            point(2.0, 5, 1, 0),
            point(3.0, 10, 1, 0),
            point(4.0, 10, 1, 0),
        ];
        let trees = vec![
            Some((1, tree(100))),
            Some((1, tree(110))),
            None,
            Some((1, tree(300))),
            Some((7, tree(900))),
        ];
        let (root, readings) = tree_per_request(&points, &trees).unwrap();
        assert_eq!(root, 7, "the root of the last look");
        assert_eq!(readings.len(), 1, "root 7's look alone: {readings:?}");
        let (root, readings) = tree_per_request(&points[..4], &trees[..4]).unwrap();
        let seen: Vec<(u64, u64)> = readings
            .iter()
            .map(|(x, r)| (*x, r.anonymous[0].1))
            .collect();
        assert_eq!((root, seen), (1, vec![(0, 100), (10, 300)]));
        assert!(tree_per_request(&points, &[None, None, None, None, None]).is_none());
    }

    #[test]
    fn a_request_in_flight_is_not_idle() {
        let mut a = point(0.0, 3, 1, 0);
        let mut b = point(1.0, 3, 1, 0);
        a.started = Some(4);
        b.started = Some(4);
        assert!(!idle(&a, &b));
        assert!(idle(&point(0.0, 3, 1, 0), &point(1.0, 3, 1, 0)));
    }
}
