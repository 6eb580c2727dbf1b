//! The process tree process by process, as the judgement reads it: each process's anonymous
//! memory and every thread alive, from the same looks as the summed series, so the diagnosis
//! can say which process grew ("child process 1234 (`python … worker`) +8.9 kB a request, this
//! process +0") and whether memory follows the thread count.

use leaklab_detect::{judge_noisy, NoisyConfig, Sample, Verdict};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One look at the tree: its threads in all, each process's anonymous bytes, and, where read,
/// each child's private dirty bytes (a forked worker's copy-on-write shows only there).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TreeLook {
    pub threads: u64,
    pub anonymous: Vec<(u32, u64)>,
    #[serde(default)]
    pub private: Vec<(u32, u64)>,
}

/// One process of the tree over the judged requests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessGrowth {
    pub pid: u32,
    pub command: String,
    /// The process the scan was given (`--pid`); the others are its descendants.
    pub root: bool,
    /// `None` where it was alive for too few of the judged samples to judge.
    pub verdict: Option<Verdict>,
    /// What was judged: `anonymous` memory, or a child's `private dirty` memory where that
    /// grows and its anonymous memory does not (copy-on-write).
    #[serde(default)]
    pub measure: String,
    pub bytes_per_request: f64,
    /// Half the width of the slope's bound.
    pub bound: f64,
    pub rise_bytes: f64,
}

impl ProcessGrowth {
    /// A descendant of the scanned process whose own memory is a proven leak.
    pub fn child_leaking(&self) -> bool {
        !self.root && self.verdict == Some(Verdict::Leak)
    }

    /// A descendant of the scanned process whose memory rose, past its own noise or not.
    pub fn child_rising(&self) -> bool {
        !self.root && self.bytes_per_request > 0.0
    }

    /// `child process 1234 (python worker.py) +8.90 kB a request (leak)`.
    pub fn line(&self) -> String {
        let who = if self.root {
            format!("this process {}", self.pid)
        } else {
            format!("child process {} ({})", self.pid, self.command)
        };
        let growth = match self.verdict {
            None => "too briefly alive to judge".to_string(),
            Some(v) => format!(
                "{}{} ± {} {} a request ({v})",
                if self.bytes_per_request >= 0.0 {
                    "+"
                } else {
                    ""
                },
                leaklab_report::human_bytes(self.bytes_per_request),
                leaklab_report::human_bytes(self.bound),
                self.measure
            ),
        };
        format!("{who} {growth}")
    }
}

/// The threads of the tree over the judged requests.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ThreadCount {
    /// At the first judged sample, and at the last.
    pub first: u64,
    pub last: u64,
}

/// Each process judged over the looks at or past `warmup` (its anonymous memory, on the host
/// series' noise floor), the root first, then by pid; and the tree's threads at the ends.
pub fn judge(
    root: u32,
    looks: &[(u64, TreeLook)],
    commands: &BTreeMap<u32, String>,
    warmup: u64,
    floor: f64,
) -> (Vec<ProcessGrowth>, Option<ThreadCount>) {
    let judged: Vec<&(u64, TreeLook)> = looks.iter().filter(|(x, _)| *x >= warmup).collect();
    let threads = match (judged.first(), judged.last()) {
        (Some(a), Some(b)) => Some(ThreadCount {
            first: a.1.threads,
            last: b.1.threads,
        }),
        _ => None,
    };
    let mut series: BTreeMap<u32, Vec<Sample>> = BTreeMap::new();
    let mut private: BTreeMap<u32, Vec<Sample>> = BTreeMap::new();
    for (x, reading) in &judged {
        for &(pid, bytes) in &reading.anonymous {
            series.entry(pid).or_default().push((*x, bytes as i64));
        }
        for &(pid, bytes) in &reading.private {
            private.entry(pid).or_default().push((*x, bytes as i64));
        }
    }
    let mut config = NoisyConfig::new(0);
    config.quantum_bytes = config.quantum_bytes.max(floor);
    let mut processes: Vec<ProcessGrowth> = series
        .into_iter()
        .map(|(pid, samples)| {
            let anonymous = judge_noisy(&samples, &config).ok();
            let dirty = private.get(&pid).and_then(|p| judge_noisy(p, &config).ok());
            // The private dirty memory speaks where it leaks and the anonymous memory does not.
            let leaks = |j: &Option<leaklab_detect::NoisyJudgement>| {
                j.as_ref().is_some_and(|j| j.verdict == Verdict::Leak)
            };
            let (measure, judgement) = if !leaks(&anonymous) && leaks(&dirty) {
                ("private dirty", dirty)
            } else {
                ("anonymous", anonymous)
            };
            ProcessGrowth {
                pid,
                command: commands.get(&pid).cloned().unwrap_or_default(),
                root: pid == root,
                verdict: judgement.as_ref().map(|j| j.verdict),
                measure: measure.to_string(),
                bytes_per_request: judgement
                    .as_ref()
                    .map_or(0.0, |j| j.slope.bytes_per_request),
                bound: judgement.as_ref().map_or(0.0, |j| j.slope.half_width()),
                rise_bytes: judgement.as_ref().map_or(0.0, |j| j.rise_bytes),
            }
        })
        .collect();
    processes.sort_by_key(|p| (!p.root, p.pid));
    (processes, threads)
}
