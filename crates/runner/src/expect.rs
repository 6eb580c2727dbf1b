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
/// it holds) while its fixed one, four shapes in all, does not leak. Its RSS may still rise to
/// a bound, as every fixed variant's may: glibc's heap under two requests at once steps up by
/// 1 to 10 MB at random requests after the four shapes are compiled (conv-fixed rose 1.0 to
/// 15.7 MB over 60 judged requests in 12 runs here, 20.3 MB in a fresh-clone CI, where the
/// declared RSS noise calls 16 MB a plateau; conv-leaky 62 to 122 MB in the same runs), so
/// what tells the fixed variant from the leaky one is the size of the rise, which the lab's
/// run-lab test compares between the two (under 30 MB, and under half the leaky's). On CUDA
/// the convs run through cuDNN, whose per-shape state the lab has not measured: no expectation.
pub fn expected_rss(variant: Variant, device: Device) -> Option<&'static [Verdict]> {
    match (variant.cause(), device) {
        (Some(Cause::Conv), Device::Cpu) if variant.is_leaky() => {
            Some(&[Verdict::Leak, Verdict::Plateau])
        }
        (Some(Cause::Conv), Device::Cpu) => Some(&[Verdict::Flat, Verdict::Plateau]),
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
