//! The watch's judgement: what `leaklab watch` saw of a service in production (its looks, the
//! process tree at each, the agent's censuses and collector), as one recorded document
//! ([`WatchEvidence`], `evidence.json` beside the watch's report), judged here by the same
//! detector, thresholds and owner rule as the scan's evidence. The watch measures; this judges;
//! `leaklab judge --evidence` re-judges a recording exactly as the watch did.

pub mod diagnosis;
pub mod looks;

use crate::agent::{Census, CensusDiff, Collector};
use crate::diagnosis::OwnerReading;
use crate::tree::TreeLook;
use crate::{Kind, Outcome};
use leaklab_detect::budget::Budget;
use leaklab_report::{human_bytes, human_duration};
use looks::{IdleFinding, Judging, Point, RunResult};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The schema of a watch's evidence.
pub const SCHEMA: &str = "leaklab.watch-evidence/1";

/// Everything the watch's judgement reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WatchEvidence {
    pub schema: String,
    /// Requests into each run not judged (caches warming).
    pub warmup: u64,
    /// Every look, in order.
    pub points: Vec<Point>,
    /// Each series' kind, as first seen.
    pub kinds: BTreeMap<String, Kind>,
    /// The memory each series may use, where known: what a time to OOM is counted against.
    pub capacity: BTreeMap<String, u64>,
    /// With `--pid`: the process tree at each look (aligned with `points`), with its root.
    #[serde(default)]
    pub trees: Vec<Option<(u32, TreeLook)>>,
    /// Each process's command line, as read at the end.
    #[serde(default)]
    pub commands: BTreeMap<u32, String>,
    /// With the agent, on a leak: the holders that grew between its censuses at the watch's
    /// start and its end, and the seconds between them.
    #[serde(default)]
    pub census: Option<CensusDiff>,
    #[serde(default)]
    pub census_seconds: f64,
    /// With the agent, on a leak where the two censuses cannot be compared: the end's.
    #[serde(default)]
    pub census_at_end: Option<Census>,
    /// The agent's collector state at the last look.
    #[serde(default)]
    pub collector: Option<Collector>,
    /// The agents the service's workers serve of their own (`leaklab.serve_agent()`), by PID.
    #[serde(default)]
    pub agents: BTreeMap<u32, String>,
    /// With the agent, on a leak: each registered worker's holders that grew between its own
    /// censuses at the watch's start and its end, through its own agent, by PID.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub worker_censuses: BTreeMap<u32, CensusDiff>,
}

/// The watch's judgement of its evidence.
#[derive(Debug, Clone)]
pub struct WatchJudgement {
    pub outcome: Outcome,
    /// Which memory grows, per request or while idle, in sentences.
    pub diagnosis: String,
    pub runs: Vec<RunResult>,
    /// The run that decides: the first that fails, else the last judged.
    pub deciding: Option<usize>,
    pub axis: Option<diagnosis::AxisReading>,
    /// Who owns the growth, on a leak.
    pub owner: Option<OwnerReading>,
}

impl WatchEvidence {
    /// Evidence of looks alone (no tree, no census yet).
    pub fn new(warmup: u64) -> WatchEvidence {
        WatchEvidence {
            schema: SCHEMA.to_string(),
            warmup,
            points: Vec::new(),
            kinds: BTreeMap::new(),
            capacity: BTreeMap::new(),
            trees: Vec::new(),
            commands: BTreeMap::new(),
            census: None,
            census_seconds: 0.0,
            census_at_end: None,
            collector: None,
            agents: BTreeMap::new(),
            worker_censuses: BTreeMap::new(),
        }
    }

    /// Every run judged (the live line's, each look).
    pub fn runs(&self, budget: Option<Budget>) -> Vec<RunResult> {
        let judging = Judging {
            evidence: self,
            budget,
        };
        looks::runs(&self.points)
            .iter()
            .enumerate()
            .map(|(i, r)| looks::judge_run(i + 1, r, &judging))
            .collect()
    }
}

/// The outcome of judged runs: a leak in any fails; else a pass where one was judged.
pub fn outcome(runs: &[RunResult]) -> Outcome {
    if runs.iter().any(RunResult::fails) {
        Outcome::Fail
    } else if runs.iter().any(RunResult::judged) {
        Outcome::Pass
    } else {
        Outcome::CannotJudge
    }
}

/// The judgement of a watch's evidence under `budget` (`None`: any leak proven fails).
pub fn judge_watch(evidence: &WatchEvidence, budget: Option<Budget>) -> WatchJudgement {
    let runs = evidence.runs(budget);
    let outcome = outcome(&runs);
    let deciding = runs
        .iter()
        .position(RunResult::fails)
        .or_else(|| runs.iter().rposition(RunResult::judged));
    let axis = deciding.map(|i| {
        let r = looks::runs(&evidence.points)
            .into_iter()
            .nth(i)
            .expect("the deciding run is one of the runs");
        let trees = evidence.trees.get(r.start..r.start + r.points.len());
        let (processes, threads) = match trees.and_then(|t| looks::tree_per_request(r.points, t)) {
            Some((root, readings)) => crate::tree::judge(
                root,
                &readings,
                &evidence.commands,
                evidence.warmup,
                crate::thresholds::HOST_NOISE_FLOOR,
            ),
            None => (Vec::new(), None),
        };
        diagnosis::axis(&runs[i], processes, threads)
    });
    let owner = axis.as_ref().filter(|_| outcome == Outcome::Fail).map(|a| {
        diagnosis::owner(
            a,
            evidence.census.as_ref(),
            evidence.collector.as_ref(),
            evidence.census_seconds,
            &crate::diagnosis::Elsewhere {
                agents: &evidence.agents,
                censuses: &evidence.worker_censuses,
            },
        )
    });
    let diagnosis = diagnose(
        &runs,
        deciding,
        evidence.census.as_ref(),
        evidence.census_at_end.as_ref(),
    );
    WatchJudgement {
        outcome,
        diagnosis,
        runs,
        deciding,
        axis,
        owner,
    }
}

fn diagnose(
    runs: &[RunResult],
    deciding: Option<usize>,
    census: Option<&CensusDiff>,
    at_end: Option<&Census>,
) -> String {
    let Some(run) = deciding.map(|i| &runs[i]) else {
        return "No run has enough looks at distinct request counts to judge yet.".into();
    };
    let growing: Vec<_> = run
        .series
        .iter()
        .filter_map(|s| s.judgement.as_ref().map(|j| (s.kind, j.verdict)))
        .collect();
    let mut text = crate::verdict::diagnose(&growing, census.is_some() || at_end.is_some());
    let idle: Vec<&IdleFinding> = runs
        .iter()
        .flat_map(|r| &r.idle)
        .filter(|f| f.fails())
        .collect();
    if let Some(f) = idle.first() {
        if let Some((rate, low, high)) = f.bytes_per_hour {
            let per_request = growing
                .iter()
                .any(|(_, v)| *v == leaklab_detect::Verdict::Leak);
            if !per_request {
                text = "No memory grows per request.".into();
            }
            text.push_str(&format!(
                " Memory grows while no request arrives: {} {}/hour (bound {} .. {}) over {} idle: a leak by the clock (a background thread, a timer, a cache filled by time), not by requests.",
                f.series,
                human_bytes(rate),
                human_bytes(low),
                human_bytes(high),
                human_duration(f.idle_seconds)
            ));
        }
    }
    if let Some(line) = census.and_then(|c| c.lines(1, "request").pop()) {
        text.push_str(&format!(
            " The agent's censuses at the watch's start and end name the holder that grew most: {line}."
        ));
    } else if let Some(top) = at_end.and_then(|c| c.holders.first()) {
        text.push_str(&format!(
            " The agent's census at the end: the largest holder is {} ({}, {} tensors, {}).",
            top.holder,
            top.kind,
            top.tensors,
            human_bytes(top.held_bytes() as f64)
        ));
    }
    if runs.len() > 1 {
        text.push_str(&format!(
            " The service restarted {} time(s) during the watch; each run is judged apart.",
            runs.len() - 1
        ));
    }
    text
}

/// Says whether a document's schema is a watch's evidence.
pub fn is_watch(schema: Option<&serde_json::Value>) -> bool {
    schema.and_then(|s| s.as_str()) == Some(SCHEMA)
}
