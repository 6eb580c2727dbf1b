//! What each variant is expected to do: the lab's own regression contract.

use leaklab_detect::Verdict;
use leaklab_vocab::Variant;

/// Leaky variants must leak; fixed ones may stay flat or grow to a bound and stop (the fixed
/// cache fills up to its byte limit, which reads as a plateau when it fills inside the window).
pub fn expected(variant: Variant) -> &'static [Verdict] {
    if variant.is_leaky() {
        &[Verdict::Leak]
    } else {
        &[Verdict::Flat, Verdict::Plateau]
    }
}

pub fn describe(verdicts: &[Verdict]) -> String {
    verdicts
        .iter()
        .map(Verdict::to_string)
        .collect::<Vec<_>>()
        .join(" or ")
}
