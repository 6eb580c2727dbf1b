//! `leaklab judge`: the verdict on series a caller measured itself, by the same detector as
//! `scan`. The pytest plugin (`leaklab.pytest_plugin`) calls a function N times, samples its
//! signals, takes a tensor census after the warm-up and after the last call, and hands them here
//! as one JSON document ([`JudgeRequest`]); the answer ([`JudgeAnswer`]) carries the outcome,
//! each series' verdict with its bound, the holders that grew and the message a failing test
//! prints. One detector for every tool: a leak the scan calls a leak, the test calls a leak.
//!
//! Exact series (the census's bytes, `torch.cuda.memory_allocated()`) are judged with no noise
//! ([`leaklab_detect::judge`]); noisy ones (the process's anonymous memory) on their floor with
//! the noise estimated from the series ([`leaklab_detect::judge_noisy`]), as `scan` judges them.
//! A series fails when it is a leak, still climbing at the end, with a slope whose lower bound
//! is above the budget (zero without one): a growth proven, not a growth suspected.

use crate::agent::{self, Census, CensusDiff};
use leaklab_detect::{human_bytes, judge, judge_noisy, DetectorConfig, NoisyConfig, Sample, Slope, Verdict};
use serde::{Deserialize, Serialize};

/// How a series' noise is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SeriesKind {
    /// Counts with no noise: a census's bytes, the CUDA allocator's allocated bytes.
    Exact,
    /// Pages and arenas: judged on the floor, noise estimated from the series.
    Noisy,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SeriesIn {
    pub name: String,
    pub kind: SeriesKind,
    /// `(call index, bytes)`, call indices counted from the first warm-up call.
    pub samples: Vec<Sample>,
}

/// What the caller measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JudgeRequest {
    /// Calls made first and not judged: samples before this index are left out.
    pub warmup: u64,
    /// Judged calls after the warm-up.
    pub calls: u64,
    /// Bytes per call a series may grow by and pass (`None`: any proven growth fails).
    #[serde(default)]
    pub max_per_call: Option<f64>,
    /// What one step is, in messages ("call", "request").
    #[serde(default = "default_unit")]
    pub unit: String,
    pub series: Vec<SeriesIn>,
    /// Censuses after the warm-up and after the last call, for who holds it.
    #[serde(default)]
    pub census_before: Option<Census>,
    #[serde(default)]
    pub census_after: Option<Census>,
}

fn default_unit() -> String {
    "call".into()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Pass,
    Fail,
    CannotJudge,
}

impl Outcome {
    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Pass => 0,
            Outcome::Fail => 1,
            Outcome::CannotJudge => 2,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SeriesOut {
    pub name: String,
    pub kind: SeriesKind,
    pub samples: usize,
    pub verdict: Option<Verdict>,
    pub slope: Option<Slope>,
    pub noise_bytes: Option<f64>,
    pub fails: bool,
    pub why_not_judged: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JudgeAnswer {
    pub outcome: Outcome,
    pub series: Vec<SeriesOut>,
    pub census: Option<CensusDiff>,
    /// What a failing test prints: the verdict, bytes per call with its bound, which signal, and
    /// the holders that grew.
    pub message: String,
}

fn one(series: &SeriesIn, warmup: u64, budget: f64) -> SeriesOut {
    let judged: Vec<Sample> = series.samples.iter().copied().filter(|s| s.0 >= warmup).collect();
    let found = match series.kind {
        SeriesKind::Exact => judge(&judged, &DetectorConfig::exact(0)).map(|j| (j.verdict, j.slope, j.noise_bytes)),
        SeriesKind::Noisy => judge_noisy(&judged, &NoisyConfig::new(0)).map(|j| (j.verdict, j.slope, j.noise_bytes)),
    };
    match found {
        Ok((verdict, slope, noise)) => SeriesOut { name: series.name.clone(), kind: series.kind, samples: judged.len(), verdict: Some(verdict), fails: verdict == Verdict::Leak && slope.low > budget, slope: Some(slope), noise_bytes: Some(noise), why_not_judged: None },
        Err(e) => SeriesOut { name: series.name.clone(), kind: series.kind, samples: judged.len(), verdict: None, slope: None, noise_bytes: None, fails: false, why_not_judged: Some(e.to_string()) },
    }
}

/// Judges every series of `request`, and diffs its censuses.
pub fn judge_request(request: &JudgeRequest) -> JudgeAnswer {
    let budget = request.max_per_call.unwrap_or(0.0).max(0.0);
    let series: Vec<SeriesOut> = request.series.iter().map(|s| one(s, request.warmup, budget)).collect();
    let outcome = if series.iter().any(|s| s.fails) {
        Outcome::Fail
    } else if series.iter().any(|s| s.verdict.is_some()) {
        Outcome::Pass
    } else {
        Outcome::CannotJudge
    };
    let census = match (&request.census_before, &request.census_after) {
        (Some(b), Some(a)) => Some(agent::diff(b, a, request.calls)),
        _ => None,
    };
    let message = message(request, outcome, &series, census.as_ref());
    JudgeAnswer { outcome, series, census, message }
}

fn message(request: &JudgeRequest, outcome: Outcome, series: &[SeriesOut], census: Option<&CensusDiff>) -> String {
    let unit = &request.unit;
    let budget = match request.max_per_call {
        Some(b) => format!("a budget of {} per {unit}", human_bytes(b)),
        None => "no budget: any growth proven is a leak".into(),
    };
    let head = match outcome {
        Outcome::Fail => "memory leak",
        Outcome::Pass => "no leak",
        Outcome::CannotJudge => "cannot judge",
    };
    let mut lines = vec![format!("{head}: {} {unit}s judged after {} warm-up {unit}s, {budget}", request.calls, request.warmup)];
    for s in series {
        let line = match (&s.verdict, &s.slope) {
            (Some(v), Some(slope)) => {
                let noise = match s.kind {
                    SeriesKind::Exact => "exact".to_string(),
                    SeriesKind::Noisy => format!("noise {} estimated from the series", human_bytes(s.noise_bytes.unwrap_or(0.0))),
                };
                format!("{} {}: {v} at {} per {unit} ({}; {} samples)", if s.fails { "FAIL" } else { "ok  " }, s.name, slope.with_bounds(), noise, s.samples)
            }
            _ => format!("  -  {}: not judged ({})", s.name, s.why_not_judged.as_deref().unwrap_or("no samples")),
        };
        lines.push(format!("  {line}"));
    }
    if let Some(c) = census {
        lines.push(format!("who holds it (tensor census after the warm-up and after the last {unit}):"));
        lines.push(c.text(8, unit));
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(name: &str, kind: SeriesKind, per_call: f64, calls: u64) -> SeriesIn {
        // A cache filling during the warm-up (30 calls), then `per_call` bytes a call.
        let samples = (0..calls).map(|i| (i, if i < 30 { (i * 100_000) as i64 } else { 3_000_000 + ((i - 30) as f64 * per_call) as i64 })).collect();
        SeriesIn { name: name.into(), kind, samples }
    }

    fn request(series: Vec<SeriesIn>, max_per_call: Option<f64>) -> JudgeRequest {
        JudgeRequest { warmup: 30, calls: 300, max_per_call, unit: "call".into(), series, census_before: None, census_after: None }
    }

    #[test]
    fn a_proven_growth_fails_whatever_its_size_and_the_warmup_is_not_judged() {
        let answer = judge_request(&request(vec![series("tensors", SeriesKind::Exact, 1024.0, 330)], None));
        assert_eq!(answer.outcome, Outcome::Fail, "{}", answer.message);
        assert_eq!(answer.series[0].slope.unwrap().bytes_per_request, 1024.0);
        assert!(answer.message.contains("FAIL tensors: leak at 1.02 kB"), "{}", answer.message);
        // Filling during the warm-up, flat after: a pass.
        let answer = judge_request(&request(vec![series("tensors", SeriesKind::Exact, 0.0, 330)], None));
        assert_eq!(answer.outcome, Outcome::Pass, "{}", answer.message);
        assert_eq!(answer.series[0].verdict, Some(Verdict::Flat));
    }

    #[test]
    fn a_budget_lets_a_slower_growth_pass_and_a_faster_one_fail() {
        let slow = judge_request(&request(vec![series("tensors", SeriesKind::Exact, 1024.0, 330)], Some(2048.0)));
        assert_eq!(slow.outcome, Outcome::Pass, "{}", slow.message);
        let fast = judge_request(&request(vec![series("tensors", SeriesKind::Exact, 4096.0, 330)], Some(2048.0)));
        assert_eq!(fast.outcome, Outcome::Fail, "{}", fast.message);
    }

    #[test]
    fn too_few_samples_cannot_be_judged() {
        let answer = judge_request(&request(vec![series("anonymous", SeriesKind::Noisy, 0.0, 40)], None));
        assert_eq!(answer.outcome, Outcome::CannotJudge);
        assert!(answer.message.contains("not judged"), "{}", answer.message);
    }
}
