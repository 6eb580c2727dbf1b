//! The eight variants of the service.
//!
//! `<cause>-leaky` runs one cause's code path with its leak, `<cause>-fixed` the same path with
//! its fix; both leave the other causes' features out (no history, no cache), so each pair
//! differs in exactly one place. `baseline` runs every feature, fixed; `seed` every feature,
//! leaky: the container of the reference scenario.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Leaky,
    Fixed,
}

/// The three causes of the reference scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Cause {
    /// Autograd graphs kept alive: inference without inference mode, output folded into a tensor statistic.
    Graph,
    /// Dangling references: output tensors stored in a metrics history.
    Refs,
    /// Uncollected caches: an unbounded per-request tensor cache.
    Cache,
}

impl Cause {
    pub const ALL: [Cause; 3] = [Cause::Graph, Cause::Refs, Cause::Cache];

    pub fn name(self) -> &'static str {
        match self {
            Cause::Graph => "graph",
            Cause::Refs => "refs",
            Cause::Cache => "cache",
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
    Baseline,
    Seed,
}

impl Variant {
    /// In the order the lab runs them.
    pub const ALL: [Variant; 8] = [
        Variant::GraphLeaky,
        Variant::GraphFixed,
        Variant::RefsLeaky,
        Variant::RefsFixed,
        Variant::CacheLeaky,
        Variant::CacheFixed,
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
            Variant::Baseline => "baseline",
            Variant::Seed => "seed",
        }
    }

    /// The cause this variant is about; `None` for baseline and seed (all of them).
    pub fn cause(self) -> Option<Cause> {
        match self {
            Variant::GraphLeaky | Variant::GraphFixed => Some(Cause::Graph),
            Variant::RefsLeaky | Variant::RefsFixed => Some(Cause::Refs),
            Variant::CacheLeaky | Variant::CacheFixed => Some(Cause::Cache),
            Variant::Baseline | Variant::Seed => None,
        }
    }

    /// Whether any of its code paths leaks.
    pub fn is_leaky(self) -> bool {
        matches!(
            self,
            Variant::GraphLeaky | Variant::RefsLeaky | Variant::CacheLeaky | Variant::Seed
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

    fn mode_of(self, cause: Cause) -> Option<Mode> {
        match self {
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
    }
}
