//! Theil–Sen slope with two bounds: Sen's rank confidence interval, and a deterministic bound
//! for noise of a known amplitude.
//!
//! The median of pairwise slopes ignores up to ~29 % outliers. Sen's interval assumes i.i.d.
//! noise and would, at 95 %, call one flat series in twenty a leak. So the reported bound is the
//! union with a deterministic one: if every sample is within ±A of a line of slope s, more than
//! half of the pairs are at least G apart (G from the pair count), each of those slopes is within
//! 2A/G of s, so the median is too. A flat series with noise under A can therefore never show a
//! bound above zero, whatever the noise looks like.

use crate::Sample;
use serde::{Deserialize, Serialize};

/// Bytes per request with a lower and upper bound.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Slope {
    pub bytes_per_request: f64,
    pub low: f64,
    pub high: f64,
}

impl Slope {
    pub const ZERO: Slope = Slope {
        bytes_per_request: 0.0,
        low: 0.0,
        high: 0.0,
    };

    /// Half the width of the bound, for "slope ± bound" tables.
    pub fn half_width(&self) -> f64 {
        (self.high - self.low) / 2.0
    }

    /// `81.92 kB (bound 81.92 kB .. 81.92 kB)`, in decimal units.
    pub fn with_bounds(&self) -> String {
        use leaklab_report::human_bytes;
        format!(
            "{} (bound {} .. {})",
            human_bytes(self.bytes_per_request),
            human_bytes(self.low),
            human_bytes(self.high)
        )
    }
}

/// Most points used for the pairwise slopes; longer series are thinned evenly (the pair count
/// grows with the square of the length).
pub const MAX_POINTS: usize = 1500;

/// Two-sided normal quantile for Sen's interval: 99 %.
const Z: f64 = 2.576;

/// Theil–Sen over `samples` (x need not be evenly spaced but must not repeat) with noise
/// amplitude `noise` in bytes.
pub fn theil_sen(samples: &[Sample], noise: f64) -> Slope {
    let points = thin(samples);
    let n = points.len();
    if n < 2 {
        return Slope::ZERO;
    }
    let mut slopes = Vec::with_capacity(n * (n - 1) / 2);
    for i in 0..n {
        for j in i + 1..n {
            let dx = points[j].0 as f64 - points[i].0 as f64;
            if dx != 0.0 {
                slopes.push((points[j].1 as f64 - points[i].1 as f64) / dx);
            }
        }
    }
    if slopes.is_empty() {
        return Slope::ZERO;
    }
    let m = slopes.len();
    let estimate = median(&mut slopes);
    // Sen's interval: ranks (N ∓ C)/2 with C = z·sqrt(n(n-1)(2n+5)/18).
    let nf = n as f64;
    let c = Z * (nf * (nf - 1.0) * (2.0 * nf + 5.0) / 18.0).sqrt();
    let lo_rank = (((m as f64 - c) / 2.0).floor().max(0.0) as usize).min(m - 1);
    let hi_rank = (((m as f64 + c) / 2.0).ceil() as usize).min(m - 1);
    let sen_low = *slopes.select_nth_unstable_by(lo_rank, f64::total_cmp).1;
    let sen_high = *slopes.select_nth_unstable_by(hi_rank, f64::total_cmp).1;
    let noise_bound = noise_bound(&points, noise);
    Slope {
        bytes_per_request: estimate,
        low: sen_low.min(estimate - noise_bound),
        high: sen_high.max(estimate + noise_bound),
    }
}

/// Theil–Sen with the deterministic noise bound alone: what the noisy-signal detector uses,
/// where the noise amplitude comes from the series itself and Sen's rank interval (which
/// assumes i.i.d. noise) would only widen the bound on short series without making it safer.
pub fn theil_sen_deterministic(samples: &[Sample], noise: f64) -> Slope {
    let estimate = theil_sen(samples, 0.0).bytes_per_request;
    let bound = noise_bound(&thin(samples), noise);
    Slope {
        bytes_per_request: estimate,
        low: estimate - bound,
        high: estimate + bound,
    }
}

/// The most the median slope can move when every sample may be off by up to `noise`.
fn noise_bound(points: &[Sample], noise: f64) -> f64 {
    if noise <= 0.0 {
        return 0.0;
    }
    let n = points.len();
    let pairs = n * (n - 1) / 2;
    // Largest index gap g such that more than half of the pairs are at least g apart:
    // #pairs(gap ≥ g) = (n-g)(n-g+1)/2.
    let mut g = 1;
    while g + 1 < n && (n - g - 1) * (n - g) / 2 * 2 > pairs {
        g += 1;
    }
    let min_dx = points
        .windows(2)
        .map(|w| w[1].0.abs_diff(w[0].0))
        .min()
        .unwrap_or(1)
        .max(1);
    2.0 * noise / (g as f64 * min_dx as f64)
}

fn thin(samples: &[Sample]) -> Vec<Sample> {
    if samples.len() <= MAX_POINTS {
        return samples.to_vec();
    }
    let step = samples.len() as f64 / MAX_POINTS as f64;
    (0..MAX_POINTS)
        .map(|i| samples[(i as f64 * step) as usize])
        .collect()
}

/// Median (the mean of the two middle values for an even count); reorders `values`.
pub fn median(values: &mut [f64]) -> f64 {
    let n = values.len();
    let upper = *values.select_nth_unstable_by(n / 2, f64::total_cmp).1;
    if n % 2 == 1 {
        upper
    } else {
        let lower = values[..n / 2]
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max);
        (lower + upper) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_line_has_a_zero_width_bound() {
        let s: Vec<Sample> = (0..50).map(|i| (i, 1000 + 1024 * i as i64)).collect();
        let slope = theil_sen(&s, 0.0);
        assert_eq!(
            slope,
            Slope {
                bytes_per_request: 1024.0,
                low: 1024.0,
                high: 1024.0
            }
        );
    }

    #[test]
    fn outliers_do_not_move_the_median() {
        let mut s: Vec<Sample> = (0..100).map(|i| (i, 10 * i as i64)).collect();
        s[10].1 += 1_000_000;
        s[70].1 -= 1_000_000;
        assert_eq!(theil_sen(&s, 0.0).bytes_per_request, 10.0);
    }

    #[test]
    fn noise_bound_matches_the_pair_count() {
        // n = 100: more than half of the 4950 pairs are at least 30 apart (70·71/2 = 2485).
        let s: Vec<Sample> = (0..100).map(|i| (i, 0)).collect();
        assert_eq!(noise_bound(&s, 30.0), 2.0);
    }

    #[test]
    fn long_series_are_thinned() {
        let s: Vec<Sample> = (0..10_000).map(|i| (i, 3 * i as i64)).collect();
        assert_eq!(thin(&s).len(), MAX_POINTS);
        assert_eq!(theil_sen(&s, 0.0).bytes_per_request, 3.0);
    }
}
