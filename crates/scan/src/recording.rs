//! A scan's recording: the [`Evidence`] its judgement reads, and what the report says of the
//! run beside it (the URL, the requests, the errors, the snapshot difference, the notes). The
//! live scan and `leaklab judge --evidence FILE` both turn one into a [`ScanReport`] here, so
//! a recording re-judged reads exactly as the scan that made it.

use crate::verdict::Budget;
use crate::{Explained, ScanReport};
use leaklab_judge::evidence::{self, Evidence};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Recording {
    pub evidence: Evidence,
    pub url: String,
    pub requests_sent: usize,
    /// Requests sent between the two looks inside, not judged.
    pub looked_requests: usize,
    pub errors: usize,
    pub error_kinds: BTreeMap<String, usize>,
    pub seconds: f64,
    /// The budget the scan was given (`None`: any leak proven fails).
    pub budget: Option<Budget>,
    /// With a snapshot endpoint: what the judged requests left live, by allocating stack.
    #[serde(default)]
    pub who_holds: Option<leaklab_snapshot::Difference>,
    /// What the measuring said: why it stopped early, what it could not read.
    pub notes: Vec<String>,
}

impl Recording {
    /// Reads `evidence.json` (or any file of its schema).
    pub fn read(path: &Path) -> anyhow::Result<Recording> {
        let bytes = std::fs::read(path)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
        let read = || -> anyhow::Result<Recording> {
            let value: serde_json::Value = serde_json::from_slice(&bytes)
                .map_err(|e| anyhow::anyhow!("not a JSON document ({e})"))?;
            evidence::check_schema(value.pointer("/evidence/schema"))?;
            serde_json::from_value(value).map_err(|e| anyhow::anyhow!("a malformed recording: {e}"))
        };
        read().map_err(|e| anyhow::anyhow!("{}: {e:#}", path.display()))
    }

    /// The report of this recording, judged under its own budget.
    pub fn judged(self) -> ScanReport {
        let budget = self.budget;
        let judgement = leaklab_judge::judge(&self.evidence, budget);
        let e = &self.evidence;
        ScanReport {
            url: self.url.clone(),
            outcome: judgement.outcome,
            diagnosis: judgement.diagnosis,
            requests_sent: self.requests_sent,
            warmup: e.warmup,
            looked_requests: self.looked_requests,
            errors: self.errors,
            error_kinds: self.error_kinds.clone(),
            seconds: self.seconds,
            requests_per_second_measured: e.requests_per_second,
            budget,
            series: judgement.series,
            who_holds: self.who_holds.clone(),
            census: e.census.clone(),
            notes: self.notes.iter().cloned().chain(judgement.notes).collect(),
            failing_from: e.failing_from,
            explained: Explained {
                axis: judgement.axis,
                owner: judgement.owner,
                collector: e.collector.clone(),
                trim: e.trim.clone(),
                native: e.native.clone(),
            },
            recording: Some(self),
        }
    }
}
