//! A series' history over the range, before anything is judged: where it was reset (an
//! OOM-killed container coming back low, a restart, a cache emptied), and so which stretch of
//! it says what the memory is doing now.
//!
//! - **A reset** is a drop to well below where the memory had been: the median of the next three
//!   samples under the minimum of the stretch before (eight samples, five minutes or a tenth of
//!   the life so far, whichever is longest) by more than the noise (twelve robust σ of
//!   the series' steps, a hundredth of its level) *and* by half of what this life had climbed. A
//!   burst that comes back down returns to the floor, not below it, so it is never a reset; a
//!   small release inside a climbing life is less than half its climb.
//! - **Kinds.** A reset from within a tenth of the capacity is an OOM kill. Two or more other
//!   drops make a sawtooth (a cache emptied on a timer): the series is then judged on its
//!   troughs (the floor over windows as long as the longest tooth), which stay flat however steep each
//!   tooth is: windows a tooth long each hold one trough.
//! - **Otherwise the current life** is judged, after a warm-up for lives that began in the
//!   range (start-up, load ramping back, caches warming), or the previous life while the
//!   current one is still warming up.

use leaklab_detect::slope::median;
use leaklab_detect::{judge_noisy, NoisyConfig, NoisyJudgement, Sample};
use serde::{Deserialize, Serialize};

/// The fewest samples before a reset compared with the three after it.
const BEFORE: usize = 8;
const AFTER: usize = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResetKind {
    /// Dropped from within a tenth of the capacity: the container ran out and came back.
    OutOfMemory,
    /// Dropped from lower: a restart, a release, a cache emptied.
    Drop,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Reset {
    /// Unix seconds of the first sample after the drop.
    pub at: f64,
    /// The life's peak before the drop, and the level after it, in bytes.
    pub peak_bytes: f64,
    pub after_bytes: f64,
    pub kind: ResetKind,
}

/// Which stretch of the series the verdict is about.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "basis")]
pub enum Basis {
    /// The life that is running now, from `since` (after its warm-up).
    CurrentLife { since: f64 },
    /// The life before, `from`..`to`, while the current one is still warming up.
    PreviousLife { from: f64, to: f64 },
    /// The troughs of a sawtooth of `teeth` drops, the longest tooth `period_s` long.
    Troughs { teeth: usize, period_s: f64 },
}

/// What the history says, judged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Judged {
    pub basis: Basis,
    pub judgement: NoisyJudgement,
    /// Where the memory stands now for a projection: the current floor, plus a sawtooth's
    /// tallest tooth (the teeth are what reach the capacity).
    pub level_now: f64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HistoryConfig {
    /// The signal's smallest step in bytes (a page; a MiB for DCGM's MiB gauges).
    pub quantum_bytes: f64,
    /// Seconds of each life that began inside the range left unjudged.
    pub warmup_s: f64,
    /// The range's first timestamp: a life starting there was running before it.
    pub range_start: f64,
    /// Samples a judged stretch needs.
    pub min_samples: usize,
}

/// The robust σ of a series' steps: neither a steady trend nor a few large steps inflate it.
fn step_sigma(values: &[f64]) -> f64 {
    if values.len() < 3 {
        return 0.0;
    }
    let mut diffs: Vec<f64> = values.windows(2).map(|w| w[1] - w[0]).collect();
    let mid = median(&mut diffs.clone());
    let mut dev: Vec<f64> = diffs.iter_mut().map(|d| (*d - mid).abs()).collect();
    median(&mut dev) / 0.6745 / std::f64::consts::SQRT_2
}

/// Indices where a new life begins (after the first), with each reset.
pub fn resets(points: &[(f64, f64)], capacity: Option<f64>, quantum: f64) -> Vec<(usize, Reset)> {
    let values: Vec<f64> = points.iter().map(|p| p.1).collect();
    if values.len() < BEFORE + AFTER {
        return Vec::new();
    }
    let noise = (12.0 * step_sigma(&values))
        .max(0.01 * median(&mut values.clone()).abs())
        .max(8.0 * quantum);
    // The stretch before a drop: at least eight samples and five minutes, and a tenth of the
    // life so far, so that a burst (however tall, up to minutes long) is never a level the
    // memory fell from; a life needs that stretch before a drop can end it.
    let step = (points[points.len() - 1].0 - points[0].0) / (points.len() - 1) as f64;
    let five_minutes = (300.0 / step.max(1e-9)).ceil() as usize;
    let mut found = Vec::new();
    let mut life_start = 0;
    // Running minima, so a series costs O(n): the life's so far, and the stretch's, whose start
    // only moves forward (a monotone deque of candidate minima).
    let mut life_min = f64::INFINITY;
    let mut window: std::collections::VecDeque<usize> = std::collections::VecDeque::new();
    let mut pushed = life_start;
    let mut i = BEFORE;
    while i + AFTER <= values.len() {
        let stretch = BEFORE.max(five_minutes).max((i - life_start) / 10);
        while pushed < i {
            life_min = life_min.min(values[pushed]);
            while window.back().is_some_and(|&j| values[j] >= values[pushed]) {
                window.pop_back();
            }
            window.push_back(pushed);
            pushed += 1;
        }
        if i - life_start < stretch {
            i += 1;
            continue;
        }
        while window.front().is_some_and(|&j| j < i - stretch) {
            window.pop_front();
        }
        let prev_min = values[window[0]];
        let after = median(&mut values[i..i + AFTER].to_vec());
        if after < prev_min - noise.max(0.5 * (prev_min - life_min)) {
            let peak = values[life_start..i]
                .iter()
                .copied()
                .fold(f64::NEG_INFINITY, f64::max);
            let kind = if capacity.is_some_and(|c| peak >= 0.9 * c) {
                ResetKind::OutOfMemory
            } else {
                ResetKind::Drop
            };
            found.push((
                i,
                Reset {
                    at: points[i].0,
                    peak_bytes: peak,
                    after_bytes: after,
                    kind,
                },
            ));
            life_start = i;
            life_min = f64::INFINITY;
            window.clear();
            pushed = life_start;
            i += AFTER;
        } else {
            i += 1;
        }
    }
    found
}

fn samples(points: &[(f64, f64)], origin: f64) -> Vec<Sample> {
    points
        .iter()
        .map(|&(t, v)| ((t - origin).max(0.0).round() as u64, v.round() as i64))
        .collect()
}

fn noisy_config(config: &HistoryConfig) -> NoisyConfig {
    NoisyConfig {
        min_samples: config.min_samples,
        quantum_bytes: config.quantum_bytes,
        ..NoisyConfig::new(0)
    }
}

/// Judges `points` (finite, in time order, bytes) as the module docs say. `Err` says why not.
pub fn judge(
    points: &[(f64, f64)],
    resets: &[(usize, Reset)],
    config: &HistoryConfig,
) -> Result<Judged, String> {
    let origin = config.range_start;
    let drops: Vec<usize> = resets
        .iter()
        .filter(|r| r.1.kind == ResetKind::Drop)
        .map(|r| r.0)
        .collect();
    if drops.len() >= 2 {
        let mut cuts: Vec<usize> = resets.iter().map(|r| r.0).collect();
        cuts.push(points.len());
        let tooth = cuts.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(1);
        let height = cuts
            .windows(2)
            .map(|w| {
                let life = &points[w[0]..w[1]];
                let hi = life.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
                let lo = life.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
                hi - lo
            })
            .fold(0.0, f64::max);
        let teeth = &points[resets[0].0..];
        if teeth.len() < 4 * tooth {
            return Err(format!("a sawtooth of {} drops whose teeth ({} samples) are too long to judge its troughs: widen the range", drops.len(), tooth));
        }
        let period_s = cuts
            .windows(2)
            .map(|w| points[w[1] - 1].0 - points[w[0]].0)
            .fold(0.0, f64::max);
        // Windows a tooth long each hold a trough, so the detector's floor is the troughs.
        let trough_config = NoisyConfig {
            min_window: tooth,
            ..noisy_config(config)
        };
        let judgement = judge_noisy(&samples(teeth, origin), &trough_config).map_err(|e| {
            format!(
                "a sawtooth of {} drops, its troughs too few to judge: {e}",
                drops.len()
            )
        })?;
        let level_now = judgement.floor_now as f64 + height;
        return Ok(Judged {
            basis: Basis::Troughs {
                teeth: drops.len(),
                period_s,
            },
            judgement,
            level_now,
        });
    }
    // The lives, as index ranges; each one's judged part starts after its warm-up unless it was
    // already running when the range began.
    let mut starts: Vec<usize> = vec![0];
    starts.extend(resets.iter().map(|r| r.0));
    let mut ends: Vec<usize> = starts[1..].to_vec();
    ends.push(points.len());
    let judged_part = |k: usize| {
        let (s, e) = (starts[k], ends[k]);
        let began_in_range = k > 0 || points[s].0 > origin + config.warmup_s.min(60.0);
        let from = if began_in_range {
            points[s].0 + config.warmup_s
        } else {
            f64::NEG_INFINITY
        };
        &points[s..e][points[s..e].partition_point(|p| p.0 < from)..]
    };
    let current = judged_part(starts.len() - 1);
    let config_noisy = noisy_config(config);
    match judge_noisy(&samples(current, origin), &config_noisy) {
        Ok(judgement) => {
            let level_now = judgement.floor_now as f64;
            Ok(Judged {
                basis: Basis::CurrentLife {
                    since: current[0].0,
                },
                judgement,
                level_now,
            })
        }
        Err(e) if starts.len() >= 2 => {
            let previous = judged_part(starts.len() - 2);
            let judgement =
                judge_noisy(&samples(previous, origin), &config_noisy).map_err(|e2| {
                    format!("the current life is too short ({e}) and so is the one before ({e2})")
                })?;
            // The previous life's slope, from where the memory is now.
            let level_now = points.last().map_or(0.0, |p| p.1);
            Ok(Judged {
                basis: Basis::PreviousLife {
                    from: previous[0].0,
                    to: previous[previous.len() - 1].0,
                },
                judgement,
                level_now,
            })
        }
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leaklab_detect::Verdict;
    use proptest::prelude::*;

    const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

    fn config() -> HistoryConfig {
        HistoryConfig {
            quantum_bytes: 1024.0 * 1024.0,
            warmup_s: 1800.0,
            range_start: 0.0,
            min_samples: 30,
        }
    }

    fn jitter(i: usize) -> f64 {
        ((i * 2_654_435_761) % 64) as f64 * 1024.0 * 1024.0
    }

    #[test]
    fn an_oom_killed_leak_is_cut_at_each_kill_and_judged_on_its_current_life() {
        // 12 GiB climbing 8 GiB an hour on an 80 GiB card, a sample a minute: killed at 80 GiB.
        let cap = 80.0 * GIB;
        let mut level = 12.0 * GIB;
        let points: Vec<(f64, f64)> = (0..720)
            .map(|i| {
                level += 8.0 * GIB / 60.0;
                if level > cap {
                    level = 12.0 * GIB;
                }
                (i as f64 * 60.0, level + jitter(i))
            })
            .collect();
        let r = resets(&points, Some(cap), 1024.0 * 1024.0);
        assert!(
            !r.is_empty() && r.iter().all(|x| x.1.kind == ResetKind::OutOfMemory),
            "{r:?}"
        );
        let j = judge(&points, &r, &config()).unwrap();
        assert!(
            matches!(j.basis, Basis::CurrentLife { .. }),
            "{:?}",
            j.basis
        );
        assert_eq!(j.judgement.verdict, Verdict::Leak);
        let per_hour = j.judgement.slope.bytes_per_request * 3600.0 / GIB;
        assert!((per_hour - 8.0).abs() < 0.3, "{per_hour}");
    }

    #[test]
    fn a_cache_emptied_every_half_hour_is_a_flat_sawtooth_and_a_leak_under_it_is_not() {
        for (creep, expected) in [(0.0, Verdict::Flat), (1.0, Verdict::Leak)] {
            let points: Vec<(f64, f64)> = (0..720)
                .map(|i| {
                    let tooth = (i % 30) as f64 * 0.3 * GIB;
                    (
                        i as f64 * 60.0,
                        20.0 * GIB + creep * GIB * i as f64 / 60.0 + tooth + jitter(i),
                    )
                })
                .collect();
            let r = resets(&points, Some(80.0 * GIB), 1024.0 * 1024.0);
            assert!(r.len() >= 20, "{}", r.len());
            let j = judge(&points, &r, &config()).unwrap();
            assert!(matches!(j.basis, Basis::Troughs { .. }));
            assert_eq!(
                j.judgement.verdict, expected,
                "creep {creep}: {:?}",
                j.judgement
            );
        }
    }

    #[test]
    fn a_restart_moments_ago_is_judged_on_the_life_before() {
        // Flat at 30 GiB, restarted ten minutes before the end, ramping back up.
        let points: Vec<(f64, f64)> = (0..720)
            .map(|i| {
                (
                    i as f64 * 60.0,
                    if i < 710 {
                        30.0 * GIB
                    } else {
                        (2.0 + (i - 710) as f64) * GIB
                    } + jitter(i),
                )
            })
            .collect();
        let r = resets(&points, Some(80.0 * GIB), 1024.0 * 1024.0);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].1.kind, ResetKind::Drop);
        let j = judge(&points, &r, &config()).unwrap();
        assert!(matches!(j.basis, Basis::PreviousLife { .. }));
        assert_eq!(j.judgement.verdict, Verdict::Flat);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Bursts above a flat floor (a request's activations, a GC not yet run, a batch of
        /// long prompts) never reset a series and never make it a leak, whatever their height,
        /// spacing and length up to three minutes (a 60 s scrape seen at a 15 s step repeats
        /// each burst four times).
        #[test]
        fn bursts_are_neither_resets_nor_leaks(height in 0.1f64..20.0, every in 2usize..60, long in 1usize..=12, seed in 0usize..1000) {
            let long = long.min(every - 1);
            let points: Vec<(f64, f64)> = (0..2880).map(|i| (i as f64 * 15.0, 16.0 * GIB + if (i + seed) % every < long { height * GIB } else { 0.0 } + jitter(i + seed))).collect();
            let r = resets(&points, Some(80.0 * GIB), 1024.0 * 1024.0);
            prop_assert!(r.is_empty(), "{:?}", r);
            let j = judge(&points, &r, &config()).unwrap();
            prop_assert_ne!(j.judgement.verdict, Verdict::Leak);
        }
    }
}
