//! What each variant is expected to do: the lab's own regression contract.

use leaklab_detect::Verdict;
use leaklab_vocab::{Cause, Device, Variant};

/// What the deciding probe must say. Leaky variants must leak; fixed ones may stay flat or grow
/// to a bound and stop (the fixed cache fills up to its byte limit, which reads as a plateau
/// when it fills inside the window). The conv cause lives below c10's allocator, so the exact
/// probe must see nothing in either variant: oneDNN's cache is not tensor storage.
pub fn expected(variant: Variant) -> &'static [Verdict] {
    if variant.cause() == Some(Cause::Conv) {
        &[Verdict::Flat]
    } else if variant.is_leaky() {
        &[Verdict::Leak]
    } else {
        &[Verdict::Flat, Verdict::Plateau]
    }
}

/// What RSS must say, for a cause the deciding probe cannot see: the conv cause on CPU, whose
/// leaky variant grows with every new shape (a leak inside the cache's filling, a plateau once
/// it holds) while its fixed one, four shapes in all, stays flat. On CUDA the convs run through
/// cuDNN, whose per-shape state the lab has not measured: no expectation.
pub fn expected_rss(variant: Variant, device: Device) -> Option<&'static [Verdict]> {
    match (variant.cause(), device) {
        (Some(Cause::Conv), Device::Cpu) if variant.is_leaky() => {
            Some(&[Verdict::Leak, Verdict::Plateau])
        }
        (Some(Cause::Conv), Device::Cpu) => Some(&[Verdict::Flat]),
        _ => None,
    }
}

pub fn describe(verdicts: &[Verdict]) -> String {
    verdicts
        .iter()
        .map(Verdict::to_string)
        .collect::<Vec<_>>()
        .join(" or ")
}
