//! How often the watch looks: often enough for a verdict within the duration, where the traffic
//! allows one. A run is judged on its looks after its warm-up, one sample a look where the
//! request count moved, and the detector needs [`needed`] of them: a 2-minute watch looking
//! every 5 s (24 looks) could never give one, whatever it saw.

use leaklab_detect::NoisyConfig;
use std::time::Duration;

/// The shortest interval chosen: a look is a walk of `/proc` and the agent's stats, a few
/// milliseconds, so at 100 ms it costs the machine a few per cent of a core at the most.
pub const SHORTEST: Duration = Duration::from_millis(100);
/// The longest interval chosen (the default of old): looks more often than this in a long
/// watch cost little and add nothing the verdict needs.
pub const LONGEST: Duration = Duration::from_secs(5);
/// The looks aimed for, as a multiple of those needed: half of the duration may then go to the
/// warm-up, to idle stretches or to failed looks and a verdict still comes.
const AIM: f64 = 2.0;

/// Judged looks a verdict needs: the detector's fewest samples.
pub fn needed() -> usize {
    NoisyConfig::new(0).min_samples
}

/// The interval between looks: given by the user, or chosen by the watch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Cadence {
    Given(Duration),
    Chosen(Duration),
}

/// What the looks so far say of the current run: its requests and seconds since its first
/// look, and its looks past the warm-up at a new request count (the samples it will judge).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Seen {
    pub requests: u64,
    pub seconds: f64,
    pub judged_looks: usize,
}

impl Cadence {
    /// The first interval: the one given, or the duration over the looks aimed for, within
    /// [`SHORTEST`] and [`LONGEST`].
    pub fn plan(given: Option<Duration>, duration: Duration) -> Cadence {
        match given {
            Some(interval) => Cadence::Given(interval),
            None => Cadence::Chosen(clamp(duration.div_f64(AIM * needed() as f64))),
        }
    }

    pub fn interval(self) -> Duration {
        match self {
            Cadence::Given(i) | Cadence::Chosen(i) => i,
        }
    }

    /// Where a given interval cannot give a verdict within the duration, whatever the traffic:
    /// the sentence that says so, and what would.
    pub fn cannot_judge(self, duration: Duration) -> Option<String> {
        let Cadence::Given(interval) = self else {
            return None;
        };
        let looks = (duration.as_secs_f64() / interval.as_secs_f64()).floor() as usize;
        (looks < needed()).then(|| {
            let most = duration.div_f64(needed() as f64);
            format!(
                "--duration {} at --interval {} gives {looks} looks, and a verdict needs {} after the warm-up: no verdict can come from this watch. Give --interval {} or less, or leave it out (the watch then chooses one from the duration and the traffic)",
                humantime::format_duration(round(duration)),
                humantime::format_duration(round(interval)),
                needed(),
                humantime::format_duration(round(most)),
            )
        })
    }

    /// After a look: the next interval. A chosen one spreads the looks a verdict still needs
    /// (twice over) across the time left, less the time the warm-up still takes at the
    /// traffic seen; a given one stays.
    pub fn next(self, left: Duration, warmup: u64, seen: Seen) -> Cadence {
        let Cadence::Chosen(_) = self else {
            return self;
        };
        let rate = if seen.seconds > 0.0 {
            seen.requests as f64 / seen.seconds
        } else {
            0.0
        };
        let warming = match warmup.saturating_sub(seen.requests) {
            0 => 0.0,
            _ if rate <= 0.0 => return self,
            w => w as f64 / rate,
        };
        let wanted = (AIM * needed() as f64 - seen.judged_looks as f64).max(1.0);
        let span = (left.as_secs_f64() - warming).max(0.0);
        Cadence::Chosen(clamp(Duration::from_secs_f64(span / wanted)))
    }
}

fn clamp(interval: Duration) -> Duration {
    interval.clamp(SHORTEST, LONGEST)
}

/// To the millisecond, as it is said.
fn round(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn a_two_minute_watch_chooses_enough_looks_and_a_long_one_keeps_five_seconds() {
        // The watch: 2 minutes at the old default of 5 s gave 25 looks where 30 are
        // needed; chosen, 60 looks of 2 s.
        let short = Cadence::plan(None, 120 * SECOND);
        assert_eq!(short, Cadence::Chosen(2 * SECOND));
        assert_eq!(short.cannot_judge(120 * SECOND), None);
        assert_eq!(Cadence::plan(None, 7200 * SECOND), Cadence::Chosen(LONGEST));
        assert_eq!(Cadence::plan(None, SECOND), Cadence::Chosen(SHORTEST));
    }

    #[test]
    fn a_given_interval_that_cannot_give_a_verdict_is_said_at_once_with_what_would() {
        let given = Cadence::plan(Some(5 * SECOND), 120 * SECOND);
        let said = given.cannot_judge(120 * SECOND).expect("24 looks");
        assert!(
            said.starts_with(
                "--duration 2m at --interval 5s gives 24 looks, and a verdict needs 30"
            ) && said.contains("Give --interval 4s or less"),
            "{said}"
        );
        assert_eq!(given.cannot_judge(150 * SECOND), None, "30 looks");
        // A given interval is kept whatever the traffic.
        let seen = Seen {
            requests: 10,
            seconds: 10.0,
            judged_looks: 0,
        };
        assert_eq!(given.next(100 * SECOND, 50, seen), given);
    }

    #[test]
    fn a_chosen_interval_leaves_the_warm_up_its_time_at_the_traffic_seen() {
        let plan = Cadence::plan(None, 120 * SECOND);
        // 1 request a second, 10 seen of a 50-request warm-up: 40 s of warm-up left out of
        // 110 s, so the 60 looks aimed for share 70 s.
        let slow = Seen {
            requests: 10,
            seconds: 10.0,
            judged_looks: 0,
        };
        let next = plan.next(110 * SECOND, 50, slow).interval().as_secs_f64();
        assert!((next - 70.0 / 60.0).abs() < 1e-6, "{next}");
        // Past the warm-up with 50 of the 60 looks taken: the last 10 share the 20 s left.
        let late = Seen {
            requests: 500,
            seconds: 100.0,
            judged_looks: 50,
        };
        assert_eq!(
            plan.next(20 * SECOND, 50, late),
            Cadence::Chosen(2 * SECOND)
        );
        // No traffic yet: the rate is unknown, the interval stays.
        let none = Seen {
            requests: 0,
            seconds: 3.0,
            judged_looks: 0,
        };
        assert_eq!(plan.next(117 * SECOND, 50, none), plan);
        // Past its aim and out of time: never below the shortest interval.
        assert_eq!(plan.next(Duration::ZERO, 50, late).interval(), SHORTEST);
    }
}
