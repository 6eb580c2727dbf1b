//! What a judgement reads, as one serialisable, versioned document: each series' samples, the
//! repeat phase, the process tree look by look, the agent's census difference, collector state,
//! trim probe and native trace, and the settings they were measured under. A front end (the
//! scan) measures and writes it (`evidence.json` beside its report); [`crate::judge`] reads it
//! and nothing else, so re-judging a recording is deterministic.
//!
//! New signals are new fields with a default, so older recordings stay readable; a change of
//! meaning is a new schema.

use crate::agent::{CensusDiff, Collector, Native, PyTrace, Trim};
use crate::diagnosis::Inputs;
use crate::tree::TreeLook;
use leaklab_detect::Sample;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The schema this judge reads.
pub const SCHEMA: &str = "leaklab.evidence/1";

/// What kind of memory a series measures: decides its capacity, its noise floor and the
/// diagnosis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Host memory of the process tree or container.
    Host,
    /// GPU memory as the driver sees it (NVML).
    Gpu,
    /// Bytes held by live tensors (`torch.cuda.memory_allocated()`).
    TorchAllocated,
    /// Bytes held by live CPU tensors, counted exactly (leaklab's `cpu_allocator_live` probe):
    /// tensors kept alive, in host memory.
    CpuTensors,
    /// Bytes the caching allocator holds (`torch.cuda.memory_reserved()`).
    TorchReserved,
    /// Any other gauge the user named.
    Other,
}

/// One memory series as measured: (request index, bytes) after each answer, the warm-up's
/// included (the judgement skips them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Series {
    pub name: String,
    pub kind: Kind,
    pub samples: Vec<Sample>,
    /// The memory it may use (a cgroup's limit, the GPU's total, the machine's memory, or the
    /// user's `--capacity`): what a time to OOM is counted against.
    pub capacity_bytes: Option<u64>,
}

/// The process tree look by look over the judged requests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tree {
    /// The process the front end was given (`--pid`).
    pub root: u32,
    pub looks: Vec<(u64, TreeLook)>,
    /// Each process's command line, as read at the end.
    pub commands: BTreeMap<u32, String>,
}

/// Everything one judgement reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    pub schema: String,
    /// Requests before the judged ones, not judged (caches warming).
    pub warmup: usize,
    /// Requests a second the front end drove: the rate of a time to OOM without a budget.
    pub requests_per_second: f64,
    /// What the judged requests sent, and how many distinct inputs that was.
    pub inputs: Inputs,
    pub distinct_inputs: usize,
    /// The bodies' shapes, where they are JSON and more than one (absent before it was kept).
    #[serde(default)]
    pub shapes: Option<Shapes>,
    /// The shared libraries the scanned process has mapped (their file names), where it was
    /// read: they name a native mechanism as likely.
    #[serde(default)]
    pub libraries: Vec<String>,
    pub series: Vec<Series>,
    /// The repeat phase (inputs already seen, sent again), by series; empty where it did not run.
    #[serde(default)]
    pub repeats: BTreeMap<String, Vec<Sample>>,
    #[serde(default)]
    pub tree: Option<Tree>,
    /// The request at which the target began to fail, where the front end stopped for its
    /// failures: the series are judged on the requests answered before it.
    #[serde(default)]
    pub failing_from: Option<u64>,
    /// The agent's census difference over the requests between its two looks.
    #[serde(default)]
    pub census: Option<CensusDiff>,
    #[serde(default)]
    pub collector: Option<Collector>,
    #[serde(default)]
    pub trim: Option<Trim>,
    #[serde(default)]
    pub native: Option<Native>,
    /// The agent's Python trace (tracemalloc) over a window of requests after the looks inside.
    #[serde(default)]
    pub python_trace: Option<PyTrace>,
    /// Each series' level right after a full collection and `malloc_trim(0)` (the agent's trim
    /// probe), before the warm-up and after the judged requests.
    #[serde(default)]
    pub collected: Option<Collected>,
    /// The agents the service's workers serve of their own (`leaklab.serve_agent()`), by PID,
    /// as the agent's `stats` listed them: where to look inside a process that grows.
    #[serde(default)]
    pub agents: BTreeMap<u32, String>,
    /// The census difference of each of those workers over the same requests as `census`, by
    /// PID: who holds a growth the tree finds in that process.
    #[serde(default)]
    pub worker_censuses: BTreeMap<u32, CensusDiff>,
}

/// The shapes of the request bodies: every JSON array of numbers' dimensions, by its path
/// (`inputs: 1×3×97×131`), a body's shape being all of them in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Shapes {
    pub bodies: usize,
    pub distinct: usize,
    /// The first few distinct shapes, as said.
    pub examples: Vec<String>,
}

/// Each series' level right after the trim probe's full collection and `malloc_trim(0)`, before the
/// warm-up (request `from`) and after the judged requests (request `to`): what the requests between
/// them kept once the collector's garbage and the allocator's free memory are gone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Collected {
    pub from: u64,
    pub to: u64,
    pub start: BTreeMap<String, i64>,
    pub end: BTreeMap<String, i64>,
}

impl Collected {
    /// What `series` kept from `from` to `to` after full collections at both ends, and the
    /// requests between them.
    pub fn kept(&self, series: &str) -> Option<(i64, u64)> {
        let (a, b) = (self.start.get(series)?, self.end.get(series)?);
        Some((b - a, self.to.saturating_sub(self.from)))
    }
}

/// Says whether a recording's schema (the `schema` field of its evidence) is the one this
/// judge reads, plainly where it is not.
pub fn check_schema(schema: Option<&serde_json::Value>) -> anyhow::Result<()> {
    match schema.and_then(|s| s.as_str()) {
        Some(SCHEMA) => Ok(()),
        Some(other) => {
            anyhow::bail!("an evidence document of schema {other}, where this judge reads {SCHEMA}")
        }
        None => anyhow::bail!("not an evidence document (no \"schema\": \"{SCHEMA}\")"),
    }
}
