//! Judging a signal whose noise nobody declared: RSS, anonymous memory, a cgroup's usage, a
//! caching allocator's reserved bytes, a service's own gauges.
//!
//! Such signals move in pages, malloc arena steps, garbage-collector and caching-allocator
//! bursts. Three choices make the verdict stable:
//! - **The floor, not the peaks.** The series is cut into windows and each window keeps its
//!   minimum: what the memory returns to. Transient bursts (a request's activations, a GC
//!   cycle not yet run) lift single samples, never a window's minimum for long.
//! - **The noise from the series itself.** The amplitude is the larger of four robust standard
//!   deviations of the floor's steps (from the median absolute deviation of its differences,
//!   which neither a steady trend nor a few large steps inflate), the signal's quantum (a
//!   page) and half the floor's largest fall (memory held never comes back). Theil–Sen's
//!   slope then gets the deterministic bound of [`crate::slope`]: with every point within that
//!   amplitude of a flat line, no bound can clear zero, whatever the noise looks like.
//! - **Leak versus plateau on the tail.** A leak still climbs in the last half of the floor; a
//!   bounded cache (or fragmentation settling) climbs and then stops.

use crate::slope::{median, theil_sen_deterministic, Slope};
use crate::verdict::Verdict;
use crate::{Error, Result, Sample};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct NoisyConfig {
    /// Samples to skip at the start (start-up, first-touch pages, caches warming).
    pub warmup: usize,
    /// Fewest samples after the warm-up for a verdict.
    pub min_samples: usize,
    /// The smallest step the signal moves in (4096 for pages): the noise is never below it.
    pub quantum_bytes: f64,
    /// Floor points the series is reduced to (each the minimum of a window of samples).
    pub floor_points: usize,
    /// The shortest window: allocators step in patterns a few requests long (glibc's arenas,
    /// a page every few requests), and a window shorter than the pattern reads it as noise.
    pub min_window: usize,
}

impl NoisyConfig {
    pub fn new(warmup: usize) -> NoisyConfig {
        NoisyConfig {
            warmup,
            min_samples: 30,
            quantum_bytes: 4096.0,
            floor_points: 25,
            min_window: 8,
        }
    }
}

/// A verdict on a noisy signal with the evidence behind it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NoisyJudgement {
    pub verdict: Verdict,
    /// Bytes per step (request, or second) of the floor, with its bound.
    pub slope: Slope,
    /// The same over the last half of the floor: what the memory is doing now.
    pub tail_slope: Slope,
    /// The estimated noise amplitude of the floor, in bytes.
    pub noise_bytes: f64,
    /// How far the floor rose from its first stretch to its last.
    pub rise_bytes: f64,
    /// Samples judged (after the warm-up), and the window each floor point is the minimum of.
    pub samples: usize,
    pub window: usize,
    pub first: Sample,
    pub last: Sample,
    /// The floor's last point: the level the memory returns to now.
    pub floor_now: i64,
    /// The smallest slope this evidence is sure to call a leak, were the floor's noise within
    /// `noise_bytes`: the overall and the tail estimates each move by at most their bound, so
    /// a true slope above `2·tail bound + bound` clears every test of the verdict.
    pub sensitivity_bytes: f64,
    /// The floor itself, for plots and reports.
    pub floor: Vec<Sample>,
}

/// Reduces `series` to the minimum of each window of `window` samples, placed at the window's
/// middle sample. A last window of less than half the others is left out: its minimum is over
/// too few samples to compare.
pub fn floor(series: &[Sample], window: usize) -> Vec<Sample> {
    let window = window.max(1);
    series
        .chunks(window)
        .filter(|chunk| chunk.len() * 2 >= window)
        .map(|chunk| {
            let low = chunk.iter().map(|s| s.1).min().unwrap_or(0);
            (chunk[chunk.len() / 2].0, low)
        })
        .collect()
}

/// The noise amplitude of `floor` (see the module docs).
fn noise(floor: &[Sample], quantum: f64) -> f64 {
    let diffs: Vec<f64> = floor.windows(2).map(|w| (w[1].1 - w[0].1) as f64).collect();
    let spread = if diffs.len() >= 2 {
        let mut d = diffs.clone();
        let mid = median(&mut d);
        let mut dev: Vec<f64> = diffs.iter().map(|x| (x - mid).abs()).collect();
        // MAD → σ for differences of i.i.d. noise (×√2), and four σ as the amplitude.
        4.0 * median(&mut dev) / 0.6745 / std::f64::consts::SQRT_2
    } else {
        0.0
    };
    spread.max(quantum).max(largest_fall(floor) / 2.0)
}

/// The most the floor fell from an earlier point of it. Memory a leak holds does not come
/// back: where every point is within the amplitude of a line that does not fall, no point is
/// more than twice the amplitude below an earlier one, so half the largest fall is an amplitude
/// the series itself shows (an allocator's heap given back in steps of megabytes, a collector's
/// sweep), however rare the falls that the steps' median absolute deviation reads as none.
fn largest_fall(floor: &[Sample]) -> f64 {
    let mut peak = i64::MIN;
    floor.iter().fold(0.0, |fall: f64, s| {
        peak = peak.max(s.1);
        fall.max((peak - s.1) as f64)
    })
}

impl NoisyJudgement {
    /// The most the floor can climb a step, read from its first and last quarters: where every
    /// floor point is within `noise_bytes` of a line, each quarter's median level is within it
    /// of the line at that quarter's middle, so the slope is at most (rise + 2·noise) / span.
    /// Theil–Sen's bound needs only half the pairs within the noise and spans a third of the
    /// floor; this one spans three quarters, so where the floor wanders a few MB either way
    /// around a flat level it says "little growth" about three times tighter. Infinite where
    /// the floor is too short to read quarters.
    pub fn rise_high(&self) -> f64 {
        let quarter = self.floor.len() / 4;
        if quarter < 2 {
            return f64::INFINITY;
        }
        let middle = |part: &[Sample], at: fn(&Sample) -> f64| {
            median(&mut part.iter().map(at).collect::<Vec<_>>())
        };
        let (first, last) = (
            &self.floor[..quarter],
            &self.floor[self.floor.len() - quarter..],
        );
        let span = middle(last, |s| s.0 as f64) - middle(first, |s| s.0 as f64);
        let rise = middle(last, |s| s.1 as f64) - middle(first, |s| s.1 as f64);
        if span <= 0.0 {
            return f64::INFINITY;
        }
        (rise + 2.0 * self.noise_bytes) / span
    }
}

pub fn judge_noisy(samples: &[Sample], config: &NoisyConfig) -> Result<NoisyJudgement> {
    let series = samples.get(config.warmup..).unwrap_or(&[]);
    let needed = config.min_samples.max(8);
    if series.len() < needed {
        return Err(Error::TooFewSamples {
            got: series.len(),
            warmup: config.warmup,
            needed,
        });
    }
    let window = series
        .len()
        .div_ceil(config.floor_points.max(8))
        .max(config.min_window)
        .min(series.len() / 4)
        .max(1);
    let floor = floor(series, window);
    let noise = noise(&floor, config.quantum_bytes);
    let slope = theil_sen_deterministic(&floor, noise);
    let tail_slope = theil_sen_deterministic(&floor[floor.len() / 2..], noise);
    let stretch = (floor.len() / 8).max(2);
    let level = |part: &[Sample]| median(&mut part.iter().map(|s| s.1 as f64).collect::<Vec<_>>());
    let rise_bytes = level(&floor[floor.len() - stretch..]) - level(&floor[..stretch]);
    let climbing = slope.low > 0.0;
    let still_climbing =
        tail_slope.low > 0.0 && tail_slope.bytes_per_request > 0.5 * slope.bytes_per_request;
    let verdict = if climbing && still_climbing {
        Verdict::Leak
    } else if climbing || rise_bytes > 2.0 * noise {
        Verdict::Plateau
    } else {
        Verdict::Flat
    };
    Ok(NoisyJudgement {
        verdict,
        slope,
        tail_slope,
        noise_bytes: noise,
        rise_bytes,
        samples: series.len(),
        window,
        first: series[0],
        last: series[series.len() - 1],
        floor_now: floor.last().map_or(0, |f| f.1),
        sensitivity_bytes: 2.0 * tail_slope.half_width() + slope.half_width(),
        floor,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts_above_a_flat_floor_are_not_a_leak() {
        // A flat 500 MB with a 40 MB burst on every third sample and page-sized jitter.
        let s: Vec<Sample> = (0..600)
            .map(|i| {
                (
                    i,
                    500_000_000
                        + if i % 3 == 0 { 40_000_000 } else { 0 }
                        + 4096 * (i as i64 * 7 % 5),
                )
            })
            .collect();
        let j = judge_noisy(&s, &NoisyConfig::new(20)).unwrap();
        assert_eq!(j.verdict, Verdict::Flat, "{j:?}");
    }

    #[test]
    fn a_leak_under_noise_is_found_and_a_filled_cache_is_a_plateau() {
        let noise = |i: u64| ((i * 2_654_435_761) % 180_000) as i64;
        let leak: Vec<Sample> = (0..1000)
            .map(|i| (i, 300_000_000 + 8192 * i as i64 + noise(i)))
            .collect();
        let j = judge_noisy(&leak, &NoisyConfig::new(20)).unwrap();
        assert_eq!(j.verdict, Verdict::Leak, "{j:?}");
        assert!((j.slope.bytes_per_request - 8192.0).abs() < 1500.0, "{j:?}");
        let cache: Vec<Sample> = (0..1000)
            .map(|i| (i, 300_000_000 + 65_536 * (i.min(300)) as i64 + noise(i)))
            .collect();
        assert_eq!(
            judge_noisy(&cache, &NoisyConfig::new(20)).unwrap().verdict,
            Verdict::Plateau
        );
    }

    #[test]
    fn a_staircase_leak_seen_for_two_hundred_requests_is_a_leak() {
        // What anonymous memory did for a service keeping 16 kB a request: steps of 64 kB and
        // 32 kB in a pattern five requests long (measured; see crates/cli/tests/scan.rs).
        let steps = [0i64, 4096, 32768, 65536, 0];
        let mut level = 208_703_488i64;
        let s: Vec<Sample> = (0..200)
            .map(|i| {
                level += steps[i as usize % 5];
                (i, level)
            })
            .collect();
        let j = judge_noisy(&s, &NoisyConfig::new(0)).unwrap();
        assert_eq!(j.verdict, Verdict::Leak, "{j:?}");
    }

    #[test]
    fn a_cache_falling_back_inside_its_band_is_a_plateau_and_a_climb_kept_a_leak() {
        // The steps of anonymous memory over a scan of the zoo's capped per-shape cache (240
        // shapes cycled, 20 warm-up and 500 judged requests; crates/cli/tests/scan.rs's churn
        // test, a local run read as a leak before this rule): filled by request 111, then the
        // heap gave 5.45 MB back and took 5.75 MB again in the window's last quarter.
        let steps = |fall: bool, tail: i64| {
            let mut level = 305_848_320i64;
            (0..520u64)
                .map(move |i| {
                    level += match i {
                        1..=111 if i % 3 == 0 => 1_490_000,
                        164 if fall => -560_000,
                        267 if fall => -4_890_000,
                        348 => 750_000 * tail,
                        445 => 870_000 * tail,
                        448 => 1_010_000 * tail,
                        451 => 1_050_000 * tail,
                        463 => 2_070_000 * tail,
                        _ => 0,
                    };
                    (i, level + 4096 * (i as i64 * 7 % 3))
                })
                .collect::<Vec<Sample>>()
        };
        let fell = judge_noisy(&steps(true, 1), &NoisyConfig::new(20)).unwrap();
        assert_eq!(fell.verdict, Verdict::Plateau, "{fell:?}");
        // Half the largest fall, where the steps' median absolute deviation reads a page.
        assert!((fell.noise_bytes - 2_725_000.0).abs() < 5_000.0, "{fell:?}");
        // Without the falls, the last quarter climbing twice as far (11.5 MB, new highs above
        // a band nothing showed): still climbing.
        let kept = judge_noisy(&steps(false, 2), &NoisyConfig::new(20)).unwrap();
        assert_eq!(kept.verdict, Verdict::Leak, "{kept:?}");
    }

    #[test]
    fn the_rise_bounds_a_wandering_flat_floor_tighter_than_theil_sen_and_never_below_a_climb() {
        // A flat level whose floor wanders 0-4 MB from window to window (what a CI run's repeat
        // phase read: slope 0, Theil–Sen's bound ±228.6 kB, a rise of 1.14 MB over 180).
        let wander = |i: u64| {
            let mut k = (i / 8 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            k ^= k >> 29;
            (k.wrapping_mul(0xBF58_476D_1CE4_E5B9) >> 32) as i64 % 4_000_000
        };
        let flat: Vec<Sample> = (0..180).map(|i| (i, 500_000_000 + wander(i))).collect();
        let j = judge_noisy(&flat, &NoisyConfig::new(0)).unwrap();
        // Here: Theil–Sen's bound ±178-182 kB around -3.8 kB, the rise's 49.3 kB.
        assert!(
            j.rise_high() < j.slope.high / 2.0,
            "{} {j:?}",
            j.rise_high()
        );
        // The same wander on a climb of 150 kB a request: the bound stays above the climb.
        let climb: Vec<Sample> = (0..180)
            .map(|i| (i, 500_000_000 + 150_000 * i as i64 + wander(i)))
            .collect();
        let c = judge_noisy(&climb, &NoisyConfig::new(0)).unwrap();
        // Here: 202 kB.
        assert!(c.rise_high() > 150_000.0, "{} {c:?}", c.rise_high());
        // Too short a floor for quarters (four points): no bound.
        let short: Vec<Sample> = (0..30).map(|i| (i, 0)).collect();
        let four = judge_noisy(&short, &NoisyConfig::new(0)).unwrap();
        assert!(four.rise_high().is_infinite(), "{four:?}");
    }

    #[test]
    fn too_few_samples_is_an_error_that_says_how_many() {
        let s: Vec<Sample> = (0..20).map(|i| (i, 0)).collect();
        assert_eq!(
            judge_noisy(&s, &NoisyConfig::new(5)).unwrap_err(),
            Error::TooFewSamples {
                got: 15,
                warmup: 5,
                needed: 30
            }
        );
    }
}
