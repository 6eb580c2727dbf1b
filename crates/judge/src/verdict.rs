//! From each series' noisy judgement to the answer an operator acts on: how long until the
//! memory runs out at the expected request rate, against a budget, and which memory it is.

use crate::evidence::Kind;
pub use leaklab_detect::budget::{ops, seconds_to_oom, unbudgeted, Budget, Named, Ops};
use leaklab_detect::Verdict;

/// Which memory grows, in one sentence, with the runbook step that fixes it.
/// `census`: the agent's census is in the report, so the host sentence points at it rather
/// than at mounting the agent.
pub fn diagnose(growing: &[(Kind, Verdict)], census: bool) -> String {
    let grows = |k: Kind| {
        growing
            .iter()
            .any(|&(kind, v)| kind == k && v == Verdict::Leak)
    };
    let seen = |k: Kind| growing.iter().any(|&(kind, _)| kind == k);
    if grows(Kind::TorchAllocated) || grows(Kind::CpuTensors) {
        "Tensors are being kept alive: torch's allocated bytes grow with every request. Look for outputs kept in histories, graphs kept by running statistics, unbounded caches (docs/runbook.md steps 1 to 3; `leaklab snapshot diff` names the line)."
    } else if grows(Kind::TorchReserved) {
        "The caching allocator holds more and more while allocated memory stays flat: cache or fragmentation, not a reference leak. Bucket input shapes, set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, or call torch.cuda.empty_cache() at a watermark (docs/runbook.md step 3)."
    } else if grows(Kind::Gpu) && (seen(Kind::TorchReserved) || seen(Kind::TorchAllocated)) {
        "GPU memory grows outside PyTorch's allocator (NVML grows, reserved is flat): NCCL, cuBLAS workspaces, another library or process. Check what else the process loads (docs/runbook.md step 4)."
    } else if grows(Kind::Gpu) {
        "GPU memory grows with every request (NVML). Export torch.cuda.memory_allocated() and memory_reserved() as gauges and scan with --metrics to tell kept tensors from allocator cache (docs/runbook.md step 4)."
    } else if grows(Kind::Host) {
        if census {
            "Host memory grows while the GPU does not (or is not watched): tensors kept on the CPU, Python objects or caches kept per request (docs/runbook.md steps 2 to 4)."
        } else {
            "Host memory grows while the GPU does not (or is not watched): tensors kept on the CPU, Python objects or caches kept per request. To name the object that keeps them, mount leaklab's agent in the service and scan again with --agent (docs/agent.md; docs/runbook.md steps 2 to 4)."
        }
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

    #[test]
    fn each_kind_of_growth_gets_its_sentence() {
        assert!(diagnose(
            &[
                (Kind::TorchAllocated, Verdict::Leak),
                (Kind::Gpu, Verdict::Leak)
            ],
            false
        )
        .starts_with("Tensors are being kept alive"));
        assert!(diagnose(
            &[
                (Kind::Host, Verdict::Leak),
                (Kind::CpuTensors, Verdict::Leak)
            ],
            false
        )
        .starts_with("Tensors are being kept alive"));
        assert!(diagnose(
            &[
                (Kind::TorchAllocated, Verdict::Flat),
                (Kind::TorchReserved, Verdict::Leak)
            ],
            false
        )
        .contains("fragmentation"));
        assert!(diagnose(
            &[
                (Kind::TorchReserved, Verdict::Flat),
                (Kind::Gpu, Verdict::Leak)
            ],
            false
        )
        .contains("outside PyTorch"));
        assert!(diagnose(
            &[(Kind::Host, Verdict::Leak), (Kind::Gpu, Verdict::Flat)],
            false
        )
        .starts_with("Host memory grows"));
        assert_eq!(
            diagnose(&[(Kind::Host, Verdict::Plateau)], false),
            "No memory series keeps climbing."
        );
        assert!(diagnose(&[(Kind::Host, Verdict::Leak)], false).contains("scan again with --agent"));
        assert!(
            !diagnose(&[(Kind::Host, Verdict::Leak)], true).contains("--agent"),
            "with the census in the report, no advice to mount the agent"
        );
    }
}
