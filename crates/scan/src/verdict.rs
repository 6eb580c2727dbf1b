//! From each series' noisy judgement to the answer an operator acts on: how long until the
//! memory runs out at the expected request rate, against a budget, and which memory it is.

use crate::signals::Kind;
use leaklab_detect::{NoisyJudgement, Verdict};
use serde::{Deserialize, Serialize};

/// The ops question: at `rate` requests per second, does `capacity` run out within `budget`?
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Budget {
    pub requests_per_second: f64,
    pub seconds: f64,
}

/// How a series fares against the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ops {
    /// Runs out within the budget, even at the slope's lower bound.
    Fail,
    /// Runs out within the budget at the estimated slope, not at its lower bound.
    LikelyFail,
    /// Lasts past the budget at the estimate, not at the upper bound: more requests would tell.
    LikelyPass,
    /// Lasts past the budget even at the slope's upper bound (or does not grow).
    Pass,
    /// No capacity known for this series: no time to OOM.
    NoCapacity,
}

impl Ops {
    pub fn fails(self) -> bool {
        matches!(self, Ops::Fail | Ops::LikelyFail)
    }

    /// Whether more requests could change the answer.
    pub fn confident(self) -> bool {
        matches!(self, Ops::Fail | Ops::Pass | Ops::NoCapacity)
    }
}

/// Seconds until `capacity` is reached from `level` at `slope` bytes per request.
pub fn seconds_to_oom(capacity: f64, level: f64, slope: f64, rate: f64) -> Option<f64> {
    (slope > 0.0 && rate > 0.0).then(|| ((capacity - level).max(0.0) / slope) / rate)
}

/// Only a leak (still climbing) can fail: a plateau or a flat series lasts, whatever its slope.
pub fn ops(j: &NoisyJudgement, capacity: Option<u64>, budget: Budget) -> (Ops, Option<f64>) {
    let Some(capacity) = capacity else { return (Ops::NoCapacity, None) };
    let at = |slope: f64| seconds_to_oom(capacity as f64, j.floor_now as f64, slope, budget.requests_per_second);
    let estimate = at(j.slope.bytes_per_request);
    if j.verdict != Verdict::Leak {
        return (Ops::Pass, estimate);
    }
    let within = |s: Option<f64>| s.is_some_and(|t| t < budget.seconds);
    let ops = if within(at(j.slope.low)) {
        Ops::Fail
    } else if within(estimate) {
        Ops::LikelyFail
    } else if within(at(j.slope.high)) {
        Ops::LikelyPass
    } else {
        Ops::Pass
    };
    (ops, estimate)
}

/// Which memory grows, in one sentence, with the runbook step that fixes it.
pub fn diagnose(growing: &[(Kind, Verdict)]) -> String {
    let grows = |k: Kind| growing.iter().any(|&(kind, v)| kind == k && v == Verdict::Leak);
    let seen = |k: Kind| growing.iter().any(|&(kind, _)| kind == k);
    if grows(Kind::TorchAllocated) {
        "Tensors are being kept alive: torch's allocated bytes grow with every request. Look for outputs kept in histories, graphs kept by running statistics, unbounded caches (docs/runbook.md steps 1 to 3; `leaklab snapshot diff` names the line)."
    } else if grows(Kind::TorchReserved) {
        "The caching allocator holds more and more while allocated memory stays flat: cache or fragmentation, not a reference leak. Bucket input shapes, set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, or call torch.cuda.empty_cache() at a watermark (docs/runbook.md step 3)."
    } else if grows(Kind::Gpu) && (seen(Kind::TorchReserved) || seen(Kind::TorchAllocated)) {
        "GPU memory grows outside PyTorch's allocator (NVML grows, reserved is flat): NCCL, cuBLAS workspaces, another library or process. Check what else the process loads (docs/runbook.md step 4)."
    } else if grows(Kind::Gpu) {
        "GPU memory grows with every request (NVML). Export torch.cuda.memory_allocated() and memory_reserved() as gauges and scan with --metrics to tell kept tensors from allocator cache (docs/runbook.md step 4)."
    } else if grows(Kind::Host) {
        "Host memory grows while the GPU does not (or is not watched): tensors kept on the CPU, Python objects or caches kept per request. Take a snapshot or a heap profile of the process (docs/runbook.md steps 2 to 4)."
    } else if grows(Kind::Other) {
        "A gauge the service exports grows with every request (docs/runbook.md step 0)."
    } else {
        "No memory series keeps climbing."
    }
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use leaklab_detect::slope::Slope;

    fn judgement(verdict: Verdict, est: f64, low: f64, high: f64) -> NoisyJudgement {
        NoisyJudgement {
            verdict,
            slope: Slope { bytes_per_request: est, low, high },
            tail_slope: Slope { bytes_per_request: est, low, high },
            noise_bytes: 4096.0,
            rise_bytes: 0.0,
            samples: 100,
            window: 2,
            first: (0, 0),
            last: (0, 0),
            floor_now: 12_000_000_000,
            sensitivity_bytes: 0.0,
            floor: Vec::new(),
        }
    }

    #[test]
    fn the_reference_scenario_fails_a_week_and_slow_growth_passes() {
        // 80 GB card, 12 GB used, 50 MiB per request, one request every 32 s: OOM in about 12 h.
        let budget = Budget { requests_per_second: 1.0 / 32.0, seconds: 7.0 * 86400.0 };
        let mib = 1024.0 * 1024.0;
        let (ops, t) = ops(&judgement(Verdict::Leak, 50.0 * mib, 49.0 * mib, 51.0 * mib), Some(80_000_000_000), budget);
        assert_eq!(ops, Ops::Fail);
        assert!((t.unwrap() / 3600.0 - 11.5).abs() < 0.5, "{t:?}");
        // 2.6 kB per request (a bounded buffer filling): years.
        assert_eq!(super::ops(&judgement(Verdict::Leak, 2600.0, 2000.0, 3000.0), Some(80_000_000_000), budget).0, Ops::Pass);
        // A plateau never fails, however steep its slope was.
        assert_eq!(super::ops(&judgement(Verdict::Plateau, 50.0 * mib, 0.0, 60.0 * mib), Some(80_000_000_000), budget).0, Ops::Pass);
        assert_eq!(super::ops(&judgement(Verdict::Leak, 1e6, 1e6, 1e6), None, budget).0, Ops::NoCapacity);
    }

    #[test]
    fn each_kind_of_growth_gets_its_sentence() {
        assert!(diagnose(&[(Kind::TorchAllocated, Verdict::Leak), (Kind::Gpu, Verdict::Leak)]).starts_with("Tensors are being kept alive"));
        assert!(diagnose(&[(Kind::TorchAllocated, Verdict::Flat), (Kind::TorchReserved, Verdict::Leak)]).contains("fragmentation"));
        assert!(diagnose(&[(Kind::TorchReserved, Verdict::Flat), (Kind::Gpu, Verdict::Leak)]).contains("outside PyTorch"));
        assert!(diagnose(&[(Kind::Host, Verdict::Leak), (Kind::Gpu, Verdict::Flat)]).starts_with("Host memory grows"));
        assert_eq!(diagnose(&[(Kind::Host, Verdict::Plateau)]), "No memory series keeps climbing.");
    }
}
