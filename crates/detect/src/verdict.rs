//! flat, plateau or leak.
//!
//! - **leak**: the slope's lower bound is above zero, and so is the last half's, which still
//!   climbs at more than half the overall rate.
//! - **plateau**: it grew (a significant slope, or a level shift beyond the noise between the
//!   first and the last stretch) and the last half has stopped: a bounded cache must be full
//!   by the middle of the window to read as one, so size windows accordingly.
//! - **flat**: neither.
//!
//! Noise only widens the bound (see [`crate::slope`]), so a flat series with noise below the
//! configured amplitude can never come out as a leak.

use crate::slope::{median, theil_sen, Slope};
use crate::{Error, Result, Sample};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Flat,
    Plateau,
    Leak,
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Verdict::Flat => "flat",
            Verdict::Plateau => "plateau",
            Verdict::Leak => "leak",
        })
    }
}

/// A report's colour for the verdict: a leak is bad, a plateau a warning, flat good.
impl From<Verdict> for leaklab_report::Tone {
    fn from(verdict: Verdict) -> leaklab_report::Tone {
        match verdict {
            Verdict::Flat => leaklab_report::Tone::Good,
            Verdict::Plateau => leaklab_report::Tone::Warn,
            Verdict::Leak => leaklab_report::Tone::Bad,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DetectorConfig {
    /// Samples to skip at the start (allocator pools, lazy initialisation, first-touch pages).
    pub warmup: usize,
    /// Noise amplitude of the probe in bytes: 0 for the exact allocator, a few MB for RSS.
    pub noise_bytes: f64,
    /// Fewest samples after warm-up for a verdict.
    pub min_samples: usize,
}

impl DetectorConfig {
    /// The exact CPU allocator: no noise.
    pub fn exact(warmup: usize) -> DetectorConfig {
        DetectorConfig {
            warmup,
            noise_bytes: 0.0,
            min_samples: 8,
        }
    }

    /// A noisy probe such as RSS or the malloc heap.
    pub fn noisy(warmup: usize, noise_bytes: f64) -> DetectorConfig {
        DetectorConfig {
            warmup,
            noise_bytes,
            min_samples: 8,
        }
    }
}

/// A verdict with the figures that support it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Judgement {
    pub verdict: Verdict,
    /// Over all samples after warm-up.
    pub slope: Slope,
    /// Over the last half: what the series is doing now.
    pub tail_slope: Slope,
    /// Median level of the last stretch minus that of the first.
    pub rise_bytes: f64,
    pub samples: usize,
    pub first: Sample,
    pub last: Sample,
    pub noise_bytes: f64,
}

pub fn judge(samples: &[Sample], config: &DetectorConfig) -> Result<Judgement> {
    let series = samples.get(config.warmup..).unwrap_or(&[]);
    let needed = config.min_samples.max(4);
    if series.len() < needed {
        return Err(Error::TooFewSamples {
            got: series.len(),
            warmup: config.warmup,
            needed,
        });
    }
    let noise = config.noise_bytes.max(0.0);
    let slope = theil_sen(series, noise);
    let tail = &series[series.len() / 2..];
    let tail_slope = theil_sen(tail, noise);
    let stretch = (series.len() / 8).max(2);
    let level = |part: &[Sample]| median(&mut part.iter().map(|s| s.1 as f64).collect::<Vec<_>>());
    let rise_bytes = level(&series[series.len() - stretch..]) - level(&series[..stretch]);

    let climbing = slope.low > 0.0;
    // Still climbing: the last half rises beyond its own noise bound, at over half the overall rate.
    let still_climbing =
        tail_slope.low > 0.0 && tail_slope.bytes_per_request > 0.5 * slope.bytes_per_request;
    // Each level is a median of samples within ±noise of the truth, so a shift beyond 2·noise is real.
    let shifted = rise_bytes > 2.0 * noise && rise_bytes > 0.0;
    let verdict = if climbing && still_climbing {
        Verdict::Leak
    } else if climbing || shifted {
        Verdict::Plateau
    } else {
        Verdict::Flat
    };
    Ok(Judgement {
        verdict,
        slope,
        tail_slope,
        rise_bytes,
        samples: series.len(),
        first: series[0],
        last: series[series.len() - 1],
        noise_bytes: noise,
    })
}
