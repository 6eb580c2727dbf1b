//! A scan's recording: the [`Evidence`] its judgement reads, and what the report says of the
//! run beside it (the URL, the requests, the errors, the snapshot difference, the notes). The
//! live scan and `leaklab judge --evidence FILE` both turn one into a [`ScanReport`] here, so
//! a recording re-judged reads exactly as the scan that made it.

use crate::verdict::Budget;
use crate::{Explained, ScanReport};
use leaklab_judge::evidence::{self, Evidence};
use leaklab_report::Attachment;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;

/// A recording's name in the report's folder; [`EVIDENCE_GZ`] where it is large.
pub const EVIDENCE_FILE: &str = "evidence.json";
pub const EVIDENCE_GZ: &str = "evidence.json.gz";
/// A recording larger than this is written gzipped: a day's watch looking every 2 s is 43,200
/// looks, some 10 MB of JSON, which gzip cuts about tenfold; a scan's is 50 to 300 kB.
const GZIP_ABOVE: usize = 1 << 20;

/// A recording as the report's folder keeps it: `evidence.json`, or gzipped where large.
pub fn attachment(json: Vec<u8>) -> Attachment {
    if json.len() <= GZIP_ABOVE {
        return Attachment::new(EVIDENCE_FILE, json);
    }
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&json).expect("writing to memory");
    Attachment::new(EVIDENCE_GZ, gz.finish().expect("writing to memory"))
}

/// Reads a recording's JSON from `path`, gzipped or not (told by its first bytes).
pub fn read_document(path: &Path) -> anyhow::Result<serde_json::Value> {
    let mut bytes =
        std::fs::read(path).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
    if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut plain = Vec::new();
        flate2::read::GzDecoder::new(&bytes[..])
            .read_to_end(&mut plain)
            .map_err(|e| anyhow::anyhow!("{}: a damaged gzip file ({e})", path.display()))?;
        bytes = plain;
    }
    serde_json::from_slice(&bytes)
        .map_err(|e| anyhow::anyhow!("{}: not a JSON document ({e})", path.display()))
}

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
    /// Reads `evidence.json` (or any file of its schema, gzipped or not).
    pub fn read(path: &Path) -> anyhow::Result<Recording> {
        Recording::from_value(read_document(path)?)
            .map_err(|e| anyhow::anyhow!("{}: {e:#}", path.display()))
    }

    /// A scan's recording from its JSON.
    pub fn from_value(value: serde_json::Value) -> anyhow::Result<Recording> {
        evidence::check_schema(value.pointer("/evidence/schema"))?;
        serde_json::from_value(value).map_err(|e| anyhow::anyhow!("a malformed recording: {e}"))
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
                python_trace: e.python_trace.clone(),
                collected: e.collected.clone(),
            },
            recording: Some(self),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_recording_is_kept_gzipped_and_read_back_either_way() {
        let dir = tempfile::tempdir().unwrap();
        let small = serde_json::json!({"evidence": {"schema": "x"}, "looks": [1, 2, 3]});
        let large = serde_json::json!({"looks": vec![123_456_789u64; 200_000]});
        for value in [&small, &large] {
            let file = attachment(serde_json::to_vec(value).unwrap());
            let gzipped = file.name == EVIDENCE_GZ;
            assert_eq!(gzipped, std::ptr::eq(value, &large), "{}", file.name);
            if gzipped {
                assert!(file.bytes.len() < GZIP_ABOVE / 10, "{} B", file.bytes.len());
            }
            let path = dir.path().join(&file.name);
            std::fs::write(&path, &file.bytes).unwrap();
            assert_eq!(&read_document(&path).unwrap(), value);
        }
        // A damaged one is said as such, with its path.
        let bad = dir.path().join("bad.json.gz");
        std::fs::write(&bad, [0x1f, 0x8b, 8, 0, 1, 2, 3]).unwrap();
        let e = format!("{:#}", read_document(&bad).unwrap_err());
        assert!(
            e.contains("bad.json.gz") && e.contains("damaged gzip"),
            "{e}"
        );
        assert!(Recording::read(&dir.path().join("none.json")).is_err());
    }
}
