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
    #[error(
        "{got} samples after a warm-up of {warmup}; at least {needed} are needed for a verdict"
    )]
    TooFewSamples {
        got: usize,
        warmup: usize,
        needed: usize,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

/// One probe reading: the request (or iteration) index and the bytes the probe saw.
pub type Sample = (u64, i64);
