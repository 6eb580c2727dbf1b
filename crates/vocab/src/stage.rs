//! The four stages of a request, and the live bytes born in each.

use serde::{Deserialize, Serialize};

/// preprocess → forward → postprocess → telemetry: where a request's memory is born.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    Preprocess,
    Forward,
    Postprocess,
    Telemetry,
}

impl Stage {
    pub const ALL: [Stage; 4] = [
        Stage::Preprocess,
        Stage::Forward,
        Stage::Postprocess,
        Stage::Telemetry,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Stage::Preprocess => "preprocess",
            Stage::Forward => "forward",
            Stage::Postprocess => "postprocess",
            Stage::Telemetry => "telemetry",
        }
    }
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Live bytes by the stage that allocated them, each stage by name (in JSON too), so no
/// reader has to know an order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageBytes {
    pub preprocess: i64,
    pub forward: i64,
    pub postprocess: i64,
    pub telemetry: i64,
}

impl StageBytes {
    /// Reads each stage's bytes from `bytes_of`.
    pub fn from_fn(mut bytes_of: impl FnMut(Stage) -> i64) -> StageBytes {
        StageBytes {
            preprocess: bytes_of(Stage::Preprocess),
            forward: bytes_of(Stage::Forward),
            postprocess: bytes_of(Stage::Postprocess),
            telemetry: bytes_of(Stage::Telemetry),
        }
    }

    pub fn get(&self, stage: Stage) -> i64 {
        match stage {
            Stage::Preprocess => self.preprocess,
            Stage::Forward => self.forward,
            Stage::Postprocess => self.postprocess,
            Stage::Telemetry => self.telemetry,
        }
    }

    /// `(stage, bytes)` for every stage, in pipeline order.
    pub fn iter(&self) -> impl Iterator<Item = (Stage, i64)> + '_ {
        Stage::ALL.into_iter().map(|s| (s, self.get(s)))
    }
}
