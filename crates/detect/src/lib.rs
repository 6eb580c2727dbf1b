//! From memory samples to a verdict a user can trust.
//!
//! Samples are `(request index, bytes)` per probe. After a warm-up, a Theil–Sen slope gives
//! bytes per request with a bound, and the series is judged [`Verdict::Flat`],
//! [`Verdict::Plateau`] (grew, then stopped: a bounded cache) or [`Verdict::Leak`] (keeps
//! growing). [`projection`] turns a slope into requests and hours until a capacity is reached,
//! [`stages`] says which stage's memory does not come back, and [`harness`] is the leak check
//! for users' own tests.
//!
//! This crate knows nothing about libtorch or HTTP: it reads numbers.

pub mod budget;
pub mod harness;
pub mod noisy;
pub mod projection;
pub mod slope;
pub mod stages;
mod verdict;

pub use harness::{LeakCheck, LeakReport, ProbeReport};
pub use noisy::{judge_noisy, NoisyConfig, NoisyJudgement};
pub use projection::{Projection, Scenario};
pub use slope::Slope;
pub use stages::{attribute, StageFinding};
pub use verdict::{judge, DetectorConfig, Judgement, Verdict};

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum Error {
    #[error("{got} samples after a warm-up of {warmup}; at least {needed} are needed for a verdict")]
    TooFewSamples { got: usize, warmup: usize, needed: usize },
}

pub type Result<T> = std::result::Result<T, Error>;

/// One probe reading: the request (or iteration) index and the bytes the probe saw.
pub type Sample = (u64, i64);

/// Bytes in decimal units (kB, MB, GB), as the reference scenario is stated.
pub fn human_bytes(bytes: f64) -> String {
    let abs = bytes.abs();
    let (value, unit) = match abs {
        a if a >= 1e9 => (bytes / 1e9, "GB"),
        a if a >= 1e6 => (bytes / 1e6, "MB"),
        a if a >= 1e3 => (bytes / 1e3, "kB"),
        _ => (bytes, "B"),
    };
    if unit == "B" {
        format!("{value:.0} B")
    } else {
        format!("{value:.2} {unit}")
    }
}

/// A duration as an operator reads it: days past two days, hours past two hours, then minutes.
pub fn human_duration(seconds: f64) -> String {
    match seconds {
        s if s >= 2.0 * 86400.0 => format!("{:.1} days", s / 86400.0),
        s if s >= 7200.0 => format!("{:.1} h", s / 3600.0),
        s if s >= 120.0 => format!("{:.0} min", s / 60.0),
        s => format!("{s:.0} s"),
    }
}
