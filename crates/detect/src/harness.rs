//! A leak check for users' own tests: run a closure for a warm-up plus N iterations, sample the
//! probes after each, and fail with a readable report when growth exceeds a budget.
//!
//! ```
//! use leaklab_detect::LeakCheck;
//! let mut kept: Vec<Vec<u8>> = Vec::new();
//! let bytes = std::cell::Cell::new(0i64);
//! let report = LeakCheck::new(5, 50)
//!     .probe("my counter", 0.0, 0.0, || bytes.get())
//!     .run(|_| { kept.push(vec![0; 1024]); bytes.set(bytes.get() + 1024); });
//! assert!(!report.passed());
//! assert!(report.to_string().contains("leak"));
//! ```
//!
//! The probes are plain closures returning bytes, so this crate stays free of libtorch;
//! `leaklab_probe::guard::TorchLeakCheck` wires in the exact CPU allocator, RSS and the CUDA
//! allocator.

use crate::projection::{Projection, Scenario};
use crate::stages::{attribute, StageFinding};
use crate::verdict::{judge, DetectorConfig, Judgement, Verdict};
use crate::Sample;
use leaklab_report::human_bytes;
use serde::{Deserialize, Serialize};
use std::fmt;

type Sampler<'a> = Box<dyn FnMut() -> i64 + 'a>;

struct ProbeSpec<'a> {
    name: String,
    budget: f64,
    noise: f64,
    sampler: Sampler<'a>,
    samples: Vec<Sample>,
}

pub struct LeakCheck<'a> {
    warmup: usize,
    iterations: usize,
    probes: Vec<ProbeSpec<'a>>,
    stages: Vec<(String, Sampler<'a>, Vec<Sample>)>,
    scenario: Scenario,
}

impl<'a> LeakCheck<'a> {
    /// `warmup` iterations whose samples are ignored, then `iterations` judged ones.
    pub fn new(warmup: usize, iterations: usize) -> LeakCheck<'a> {
        LeakCheck {
            warmup,
            iterations,
            probes: Vec::new(),
            stages: Vec::new(),
            scenario: Scenario::REFERENCE,
        }
    }

    /// A probe with its budget (bytes per iteration a leak may grow by and still pass) and its
    /// noise amplitude (0 for the exact allocator).
    pub fn probe(
        mut self,
        name: &str,
        budget_bytes: f64,
        noise_bytes: f64,
        sampler: impl FnMut() -> i64 + 'a,
    ) -> Self {
        self.probes.push(ProbeSpec {
            name: name.into(),
            budget: budget_bytes,
            noise: noise_bytes,
            sampler: Box::new(sampler),
            samples: Vec::new(),
        });
        self
    }

    /// A stage series, used only to say where growth was born.
    pub fn stage(mut self, name: &str, sampler: impl FnMut() -> i64 + 'a) -> Self {
        self.stages
            .push((name.into(), Box::new(sampler), Vec::new()));
        self
    }

    /// The scenario for the time-to-OOM line (default: [`Scenario::REFERENCE`]).
    pub fn scenario(mut self, scenario: Scenario) -> Self {
        self.scenario = scenario;
        self
    }

    pub fn run(mut self, mut body: impl FnMut(usize)) -> LeakReport {
        for i in 0..self.warmup + self.iterations {
            body(i);
            for p in &mut self.probes {
                p.samples.push((i as u64, (p.sampler)()));
            }
            for (_, sampler, samples) in &mut self.stages {
                samples.push((i as u64, sampler()));
            }
        }
        let stage_series: Vec<(String, Vec<Sample>)> =
            self.stages.into_iter().map(|(n, _, s)| (n, s)).collect();
        let stages =
            attribute(&stage_series, &DetectorConfig::exact(self.warmup)).unwrap_or_default();
        let probes = self
            .probes
            .into_iter()
            .map(|p| {
                let judgement = judge(&p.samples, &DetectorConfig::noisy(self.warmup, p.noise))
                    .map_err(|e| e.to_string());
                let passed = match &judgement {
                    Ok(j) => !(j.verdict == Verdict::Leak && j.slope.bytes_per_request > p.budget),
                    Err(_) => false,
                };
                let projection = judgement
                    .as_ref()
                    .ok()
                    .and_then(|j| self.scenario.project(j.slope.bytes_per_request));
                let tail = p.samples.len().saturating_sub(3);
                ProbeReport {
                    name: p.name,
                    budget_bytes: p.budget,
                    passed,
                    judgement,
                    projection,
                    first_samples: p
                        .samples
                        .iter()
                        .skip(self.warmup)
                        .take(3)
                        .copied()
                        .collect(),
                    last_samples: p.samples[tail..].to_vec(),
                }
            })
            .collect();
        LeakReport {
            warmup: self.warmup,
            iterations: self.iterations,
            probes,
            stages,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProbeReport {
    pub name: String,
    pub budget_bytes: f64,
    pub passed: bool,
    pub judgement: Result<Judgement, String>,
    pub projection: Option<Projection>,
    pub first_samples: Vec<Sample>,
    pub last_samples: Vec<Sample>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LeakReport {
    pub warmup: usize,
    pub iterations: usize,
    pub probes: Vec<ProbeReport>,
    pub stages: Vec<StageFinding<String>>,
}

impl LeakReport {
    pub fn passed(&self) -> bool {
        self.probes.iter().all(|p| p.passed)
    }

    /// Panics with the whole report when any probe is over its budget.
    #[track_caller]
    pub fn assert_no_leak(&self) {
        if !self.passed() {
            panic!("memory leak detected\n{self}");
        }
    }
}

impl fmt::Display for LeakReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "leak check: {} warm-up + {} iterations",
            self.warmup, self.iterations
        )?;
        for p in &self.probes {
            let status = if p.passed { "ok  " } else { "FAIL" };
            match &p.judgement {
                Ok(j) => {
                    writeln!(
                        f,
                        "  {status} {}: {} at {} per iteration, budget {}/iteration",
                        p.name,
                        j.verdict,
                        j.slope.with_bounds(),
                        human_bytes(p.budget_bytes)
                    )?;
                    writeln!(
                        f,
                        "       first samples {:?}, last samples {:?}",
                        p.first_samples, p.last_samples
                    )?;
                    if let (Some(proj), Verdict::Leak) = (p.projection, j.verdict) {
                        writeln!(
                            f,
                            "       at this rate {} of headroom is gone after {} iterations ({:.1} h at one per {:.0} s)",
                            human_bytes(proj.headroom_bytes),
                            proj.requests,
                            proj.hours(),
                            proj.seconds / proj.requests.max(1) as f64
                        )?;
                    }
                }
                Err(e) => writeln!(f, "  {status} {}: no verdict: {e}", p.name)?,
            }
        }
        if let Some(top) = self.stages.first() {
            writeln!(
                f,
                "  growing memory was born in stage `{}` ({}/iteration)",
                top.stage,
                human_bytes(top.judgement.slope.bytes_per_request)
            )?;
        }
        Ok(())
    }
}
