//! One rule for what fails, for every tool: **a leak the detector proves fails, unless a budget
//! says it lasts.** Proven: still climbing at the end, the slope's lower bound above zero (or
//! above a per-call budget, [`proven`]). A budget is a capacity, a rate and a time: the memory
//! must not run out within `seconds` at `steps_per_second` ([`ops`]). `scan` has one only where
//! the user gives the production request rate (`--rate`, or `--budget seed`, [`Named`]), since
//! no other figure in the budget is theirs alone; without one any proven leak fails, and the
//! time to OOM is said at the rate the scan measured ([`unbudgeted`]). The fleet scan's series
//! run on production's own clock, so its budget always has its rate. A series with no capacity
//! known has no budget either. `leaklab judge` (the pytest plugin) holds its series to the same
//! [`proven`], with an optional budget in bytes per call.

use crate::{NoisyJudgement, Slope, Verdict};
use serde::{Deserialize, Serialize};

/// The ops question: at `steps_per_second` (requests per second when the slope is per request,
/// 1 when it is per second), does the capacity run out within `seconds`?
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Budget {
    pub steps_per_second: f64,
    pub seconds: f64,
}

impl Budget {
    /// The reference scenario of the lab's story: one request every 32 s, a week between restarts.
    pub const SEED: Budget = Budget {
        steps_per_second: 1.0 / 32.0,
        seconds: 7.0 * 86400.0,
    };
}

/// A budget by name (`--budget seed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Named {
    /// [`Budget::SEED`].
    Seed,
}

impl std::str::FromStr for Named {
    type Err = String;

    fn from_str(s: &str) -> Result<Named, String> {
        match s {
            "seed" => Ok(Named::Seed),
            _ => Err(format!("`{s}` is no budget's name: `seed` (the reference scenario: one request every 32 s, 7 days); or give --rate")),
        }
    }
}

impl Named {
    pub fn budget(self) -> Budget {
        match self {
            Named::Seed => Budget::SEED,
        }
    }
}

/// The rule's test of growth: a leak (still climbing) whose slope's lower bound is above
/// `limit` bytes a step (zero without a budget per step).
pub fn proven(verdict: Verdict, slope: &Slope, limit: f64) -> bool {
    verdict == Verdict::Leak && slope.low > limit
}

/// How a series fares against the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ops {
    /// Runs out within the budget, even at the slope's lower bound.
    Fail,
    /// Runs out within the budget at the estimated slope, not at its lower bound.
    LikelyFail,
    /// Lasts past the budget at the estimate, not at the upper bound: more requests would tell.
    LikelyPass,
    /// Lasts past the budget even at the slope's upper bound (or does not grow).
    Pass,
    /// No capacity known for this series: no time to OOM.
    NoCapacity,
}

impl Ops {
    pub fn fails(self) -> bool {
        matches!(self, Ops::Fail | Ops::LikelyFail)
    }

    /// The result column of a report.
    pub fn label(self) -> &'static str {
        match self {
            Ops::Fail => "FAIL",
            Ops::LikelyFail => "FAIL (likely)",
            Ops::LikelyPass => "pass (likely)",
            Ops::Pass => "pass",
            Ops::NoCapacity => "-",
        }
    }

    /// Whether more requests could change the answer.
    pub fn confident(self) -> bool {
        matches!(self, Ops::Fail | Ops::Pass | Ops::NoCapacity)
    }
}

/// Seconds until `capacity` is reached from `level` at `slope` bytes per step, `rate` steps a second.
pub fn seconds_to_oom(capacity: f64, level: f64, slope: f64, rate: f64) -> Option<f64> {
    (slope > 0.0 && rate > 0.0).then(|| ((capacity - level).max(0.0) / slope) / rate)
}

/// Only a leak (still climbing) can fail: a plateau or a flat series lasts, whatever its slope.
pub fn ops(j: &NoisyJudgement, capacity: Option<u64>, budget: Budget) -> (Ops, Option<f64>) {
    ops_at(j, j.floor_now as f64, capacity, budget)
}

/// With no budget: any proven leak fails; the time to OOM, where a capacity is known, is at
/// `measured` steps a second (the rate the scan drove), from the judged floor's last point.
pub fn unbudgeted(j: &NoisyJudgement, capacity: Option<u64>, measured: f64) -> (Ops, Option<f64>) {
    let seconds = capacity.and_then(|c| {
        seconds_to_oom(
            c as f64,
            j.floor_now as f64,
            j.slope.bytes_per_request,
            measured,
        )
    });
    let ops = match (proven(j.verdict, &j.slope, 0.0), capacity) {
        (true, _) => Ops::Fail,
        (false, Some(_)) => Ops::Pass,
        (false, None) => Ops::NoCapacity,
    };
    (ops, seconds)
}

/// [`ops`] from another level than the judged floor's last point: the fleet scan judges one
/// stretch of a series (a life before a restart, the troughs of a sawtooth) and projects from
/// where the memory is now.
pub fn ops_at(
    j: &NoisyJudgement,
    level: f64,
    capacity: Option<u64>,
    budget: Budget,
) -> (Ops, Option<f64>) {
    // No capacity, no budget: the rule without one.
    let Some(capacity) = capacity else {
        return (unbudgeted(j, None, budget.steps_per_second).0, None);
    };
    let at = |slope: f64| seconds_to_oom(capacity as f64, level, slope, budget.steps_per_second);
    let estimate = at(j.slope.bytes_per_request);
    if j.verdict != Verdict::Leak {
        return (Ops::Pass, estimate);
    }
    let within = |s: Option<f64>| s.is_some_and(|t| t < budget.seconds);
    let ops = if within(at(j.slope.low)) {
        Ops::Fail
    } else if within(estimate) {
        Ops::LikelyFail
    } else if within(at(j.slope.high)) {
        Ops::LikelyPass
    } else {
        Ops::Pass
    };
    (ops, estimate)
}

/// The result column's colour.
impl From<Ops> for leaklab_report::Tone {
    fn from(ops: Ops) -> leaklab_report::Tone {
        match ops {
            Ops::Fail | Ops::LikelyFail => leaklab_report::Tone::Bad,
            Ops::LikelyPass => leaklab_report::Tone::Warn,
            Ops::Pass => leaklab_report::Tone::Good,
            Ops::NoCapacity => leaklab_report::Tone::Plain,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slope::Slope;

    fn judgement(verdict: Verdict, est: f64, low: f64, high: f64) -> NoisyJudgement {
        NoisyJudgement {
            verdict,
            slope: Slope {
                bytes_per_request: est,
                low,
                high,
            },
            tail_slope: Slope {
                bytes_per_request: est,
                low,
                high,
            },
            noise_bytes: 4096.0,
            rise_bytes: 0.0,
            samples: 100,
            window: 2,
            first: (0, 0),
            last: (0, 0),
            floor_now: 12_000_000_000,
            sensitivity_bytes: 0.0,
            floor: Vec::new(),
        }
    }

    #[test]
    fn the_reference_scenario_fails_a_week_and_slow_growth_passes() {
        // 80 GB card, 12 GB used, 50 MiB per request, one request every 32 s: OOM in about 12 h.
        let budget = Budget {
            steps_per_second: 1.0 / 32.0,
            seconds: 7.0 * 86400.0,
        };
        let mib = 1024.0 * 1024.0;
        let (ops, t) = ops(
            &judgement(Verdict::Leak, 50.0 * mib, 49.0 * mib, 51.0 * mib),
            Some(80_000_000_000),
            budget,
        );
        assert_eq!(ops, Ops::Fail);
        assert!((t.unwrap() / 3600.0 - 11.5).abs() < 0.5, "{t:?}");
        // 2.6 kB per request (a bounded buffer filling): years.
        assert_eq!(
            super::ops(
                &judgement(Verdict::Leak, 2600.0, 2000.0, 3000.0),
                Some(80_000_000_000),
                budget
            )
            .0,
            Ops::Pass
        );
        // A plateau never fails, however steep its slope was.
        assert_eq!(
            super::ops(
                &judgement(Verdict::Plateau, 50.0 * mib, 0.0, 60.0 * mib),
                Some(80_000_000_000),
                budget
            )
            .0,
            Ops::Pass
        );
        // No capacity known: no budget, so a proven leak fails and anything else has no time.
        assert_eq!(
            super::ops(&judgement(Verdict::Leak, 1e6, 1e6, 1e6), None, budget).0,
            Ops::Fail
        );
        assert_eq!(
            super::ops(&judgement(Verdict::Plateau, 1e6, 1e6, 1e6), None, budget).0,
            Ops::NoCapacity
        );
    }

    #[test]
    fn without_a_budget_any_proven_leak_fails_with_its_time_at_the_measured_rate() {
        // The README's example: 7.13 kB a request, 0.3 GB of 2.15 GB used, driven at 100 a second.
        let slow = judgement(Verdict::Leak, 7130.0, 7090.0, 7170.0);
        let slow = NoisyJudgement {
            floor_now: 300_000_000,
            ..slow
        };
        let (ops, t) = unbudgeted(&slow, Some(2_147_483_648), 100.0);
        assert_eq!(ops, Ops::Fail);
        assert!(
            (t.unwrap() - (2_147_483_648.0 - 3e8) / 7130.0 / 100.0).abs() < 1.0,
            "{t:?}"
        );
        // The same leak against the seed's budget lasts past the week (years at 1/32 s): a pass.
        assert_eq!(
            ops_at(&slow, 3e8, Some(2_147_483_648), Budget::SEED).0,
            Ops::Pass
        );
        // Growth not proven passes, with or without a capacity.
        assert_eq!(
            unbudgeted(
                &judgement(Verdict::Plateau, 7130.0, 0.0, 9000.0),
                Some(1 << 31),
                100.0
            )
            .0,
            Ops::Pass
        );
        assert_eq!(
            unbudgeted(&judgement(Verdict::Flat, 0.0, -10.0, 10.0), None, 100.0),
            (Ops::NoCapacity, None)
        );
        assert_eq!(
            unbudgeted(
                &judgement(Verdict::Leak, 7130.0, 7090.0, 7170.0),
                None,
                100.0
            ),
            (Ops::Fail, None)
        );
        assert_eq!("seed".parse::<Named>().unwrap().budget(), Budget::SEED);
        assert!("week".parse::<Named>().unwrap_err().contains("--rate"));
    }
}
