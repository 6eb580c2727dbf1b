//! The ten variants of the service.
//!
//! `<cause>-leaky` runs one cause's code path with its leak, `<cause>-fixed` the same path with
//! its fix; both leave the other causes' features out (no history, no cache, no conv), so each
//! pair differs in exactly one place. `baseline` runs the reference scenario's three features,
//! fixed; `seed` the same three, leaky: the container of the reference scenario. The conv
//! cause is the zoo's, below c10's allocator, and in neither.

use crate::scale::Scale;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Leaky,
    Fixed,
}

/// The three causes of the reference scenario, and the conv cause beside them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Cause {
    /// Autograd graphs kept alive: inference without inference mode, output folded into a tensor statistic.
    Graph,
    /// Dangling references: output tensors stored in a metrics history.
    Refs,
    /// Uncollected caches: an unbounded per-request tensor cache.
    Cache,
    /// A native per-shape cache: oneDNN's conv primitives, one set per new input shape, in
    /// memory that c10's allocator never sees (pytorch/pytorch#27971, #98688).
    Conv,
}

impl Cause {
    pub const ALL: [Cause; 4] = [Cause::Graph, Cause::Refs, Cause::Cache, Cause::Conv];
    /// The causes of the reference scenario: what `baseline` and `seed` run.
    pub const SEED: [Cause; 3] = [Cause::Graph, Cause::Refs, Cause::Cache];

    pub fn name(self) -> &'static str {
        match self {
            Cause::Graph => "graph",
            Cause::Refs => "refs",
            Cause::Cache => "cache",
            Cause::Conv => "conv",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Variant {
    GraphLeaky,
    GraphFixed,
    RefsLeaky,
    RefsFixed,
    CacheLeaky,
    CacheFixed,
    ConvLeaky,
    ConvFixed,
    Baseline,
    Seed,
}

/// Lengths of the conv cause's requests: spectrograms of 1 to this many frames.
pub const CONV_LENGTHS: u64 = 128;

impl Variant {
    /// In the order the lab runs them.
    pub const ALL: [Variant; 10] = [
        Variant::GraphLeaky,
        Variant::GraphFixed,
        Variant::RefsLeaky,
        Variant::RefsFixed,
        Variant::CacheLeaky,
        Variant::CacheFixed,
        Variant::ConvLeaky,
        Variant::ConvFixed,
        Variant::Baseline,
        Variant::Seed,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Variant::GraphLeaky => "graph-leaky",
            Variant::GraphFixed => "graph-fixed",
            Variant::RefsLeaky => "refs-leaky",
            Variant::RefsFixed => "refs-fixed",
            Variant::CacheLeaky => "cache-leaky",
            Variant::CacheFixed => "cache-fixed",
            Variant::ConvLeaky => "conv-leaky",
            Variant::ConvFixed => "conv-fixed",
            Variant::Baseline => "baseline",
            Variant::Seed => "seed",
        }
    }

    /// The cause this variant is about; `None` for baseline and seed (the reference scenario's
    /// three).
    pub fn cause(self) -> Option<Cause> {
        match self {
            Variant::GraphLeaky | Variant::GraphFixed => Some(Cause::Graph),
            Variant::RefsLeaky | Variant::RefsFixed => Some(Cause::Refs),
            Variant::CacheLeaky | Variant::CacheFixed => Some(Cause::Cache),
            Variant::ConvLeaky | Variant::ConvFixed => Some(Cause::Conv),
            Variant::Baseline | Variant::Seed => None,
        }
    }

    /// Whether any of its code paths leaks.
    pub fn is_leaky(self) -> bool {
        matches!(
            self,
            Variant::GraphLeaky
                | Variant::RefsLeaky
                | Variant::CacheLeaky
                | Variant::ConvLeaky
                | Variant::Seed
        )
    }

    /// How the forward pass and its running statistic run (every variant does a forward).
    pub fn graph(self) -> Mode {
        self.mode_of(Cause::Graph).unwrap_or(Mode::Fixed)
    }

    /// How the metrics history is kept; `None` when this variant keeps none.
    pub fn refs(self) -> Option<Mode> {
        self.mode_of(Cause::Refs)
    }

    /// How the feature cache is kept; `None` when this variant has none.
    pub fn cache(self) -> Option<Mode> {
        self.mode_of(Cause::Cache)
    }

    /// How the conv front-end meets its input shapes; `None` when this variant has no conv.
    pub fn conv(self) -> Option<Mode> {
        self.mode_of(Cause::Conv)
    }

    /// The rows of request `index` at `scale`: the scale's batch, except for the conv cause,
    /// whose request is one spectrogram of 1 to [`CONV_LENGTHS`] frames (a row a frame), in a
    /// fixed shuffled order: every one of the first 128 requests a length not seen before, the
    /// longest first (so the heap meets its largest activations in the warm-up), and every
    /// 32-row bucket among the first five.
    pub fn rows(self, scale: Scale, index: u64) -> usize {
        match self.conv() {
            // 77 is odd, so `77 i mod 128` visits every residue once per 128 requests.
            Some(_) => (CONV_LENGTHS - index.wrapping_mul(77) % CONV_LENGTHS) as usize,
            None => scale.batch() as usize,
        }
    }

    /// The most rows any of this variant's requests has: the service's `--max-batch`.
    pub fn max_rows(self, scale: Scale) -> usize {
        match self.conv() {
            Some(_) => CONV_LENGTHS as usize,
            None => scale.batch() as usize,
        }
    }

    fn mode_of(self, cause: Cause) -> Option<Mode> {
        match self {
            Variant::Baseline | Variant::Seed if !Cause::SEED.contains(&cause) => None,
            Variant::Baseline => Some(Mode::Fixed),
            Variant::Seed => Some(Mode::Leaky),
            v if v.cause() == Some(cause) => Some(if v.is_leaky() {
                Mode::Leaky
            } else {
                Mode::Fixed
            }),
            _ => None,
        }
    }
}

impl std::fmt::Display for Variant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Variant {
    type Err = String;

    fn from_str(s: &str) -> Result<Variant, String> {
        Variant::ALL
            .into_iter()
            .find(|v| v.name() == s)
            .ok_or_else(|| {
                let known: Vec<_> = Variant::ALL.iter().map(|v| v.name()).collect();
                format!("unknown variant `{s}`; known: {}", known.join(", "))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_list_the_known_ones() {
        for v in Variant::ALL {
            assert_eq!(v.name().parse::<Variant>().unwrap(), v);
        }
        assert!("graph-broken"
            .parse::<Variant>()
            .unwrap_err()
            .contains("known: graph-leaky, graph-fixed"));
    }

    #[test]
    fn each_pair_differs_in_one_place() {
        assert_eq!(
            (
                Variant::GraphLeaky.graph(),
                Variant::GraphLeaky.refs(),
                Variant::GraphLeaky.cache()
            ),
            (Mode::Leaky, None, None)
        );
        assert_eq!(
            (
                Variant::GraphFixed.graph(),
                Variant::GraphFixed.refs(),
                Variant::GraphFixed.cache()
            ),
            (Mode::Fixed, None, None)
        );
        assert_eq!(Variant::RefsLeaky.refs(), Some(Mode::Leaky));
        assert_eq!(Variant::CacheFixed.cache(), Some(Mode::Fixed));
        assert_eq!(
            (
                Variant::Seed.graph(),
                Variant::Seed.refs(),
                Variant::Seed.cache()
            ),
            (Mode::Leaky, Some(Mode::Leaky), Some(Mode::Leaky))
        );
        assert_eq!(
            (
                Variant::Baseline.graph(),
                Variant::Baseline.refs(),
                Variant::Baseline.cache()
            ),
            (Mode::Fixed, Some(Mode::Fixed), Some(Mode::Fixed))
        );
        assert_eq!(
            (
                Variant::ConvLeaky.graph(),
                Variant::ConvLeaky.refs(),
                Variant::ConvLeaky.cache(),
                Variant::ConvLeaky.conv()
            ),
            (Mode::Fixed, None, None, Some(Mode::Leaky))
        );
        assert_eq!(Variant::ConvFixed.conv(), Some(Mode::Fixed));
        assert_eq!(
            (Variant::Seed.conv(), Variant::Baseline.conv()),
            (None, None)
        );
    }

    #[test]
    fn conv_requests_are_every_length_once_and_every_bucket_early() {
        let rows = |n: u64| (0..n).map(|i| Variant::ConvLeaky.rows(Scale::Default, i));
        let mut first: Vec<usize> = rows(CONV_LENGTHS).collect();
        first.sort_unstable();
        assert_eq!(first, (1..=CONV_LENGTHS as usize).collect::<Vec<_>>());
        assert_eq!(rows(1).next(), Some(128));
        let mut buckets: Vec<usize> = rows(5).map(|r| r.div_ceil(32)).collect();
        buckets.sort_unstable();
        buckets.dedup();
        assert_eq!(buckets, [1, 2, 3, 4]);
        assert_eq!(Variant::ConvFixed.max_rows(Scale::Default), 128);
        assert_eq!(
            (
                Variant::Seed.rows(Scale::Seed, 3),
                Variant::RefsLeaky.max_rows(Scale::Default)
            ),
            (512, 8)
        );
    }
}
