//! A watch's recording: the [`WatchEvidence`] its judgement reads, and what the report says of
//! the watch beside it (the target, why it stopped, the looks missed, the notes). The live watch
//! and `leaklab judge --evidence FILE` both turn one into a [`WatchReport`] here, so a
//! recording re-judged reads exactly as the watch that made it.

use crate::{Stop, WatchReport};
use leaklab_detect::budget::Budget;
use leaklab_judge::watch::{judge_watch, WatchEvidence, SCHEMA};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WatchRecording {
    pub evidence: WatchEvidence,
    /// The agent's base, or the metrics endpoint.
    pub target: String,
    pub stop: Stop,
    pub seconds: f64,
    pub interval_seconds: f64,
    pub missed_looks: usize,
    /// The budget the watch was given (`None`: any leak proven fails).
    pub budget: Option<Budget>,
    /// What the measuring said: looks that failed, a process followed, no census.
    pub notes: Vec<String>,
    /// The CUDA snapshot written beside the report, where one was taken.
    pub snapshot_file: Option<String>,
}

impl WatchRecording {
    /// Reads a watch's recording from the JSON of `evidence.json`.
    pub fn from_value(value: serde_json::Value) -> anyhow::Result<WatchRecording> {
        if !leaklab_judge::watch::is_watch(value.pointer("/evidence/schema")) {
            anyhow::bail!("not a watch's recording (no \"schema\": \"{SCHEMA}\")");
        }
        serde_json::from_value(value)
            .map_err(|e| anyhow::anyhow!("a malformed watch recording: {e}"))
    }

    /// The report of this recording, judged under its own budget.
    pub fn judged(self) -> WatchReport {
        let j = judge_watch(&self.evidence, self.budget);
        let e = &self.evidence;
        WatchReport {
            target: self.target.clone(),
            outcome: j.outcome,
            diagnosis: j.diagnosis,
            stop: self.stop,
            seconds: self.seconds,
            interval_seconds: self.interval_seconds,
            missed_looks: self.missed_looks,
            warmup: e.warmup,
            budget: self.budget,
            runs: j.runs,
            deciding: j.deciding,
            axis: j.axis,
            owner: j.owner,
            census: e.census.clone(),
            census_at_end: e.census_at_end.clone(),
            snapshot_file: self.snapshot_file.clone(),
            snapshot: None,
            notes: self.notes.clone(),
            points: e.points.clone(),
            recording: Some(self),
        }
    }
}
