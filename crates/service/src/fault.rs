//! Fault injection for the lab's own tests: `LEAKLAB_CRASH_AFTER=<variant>:<requests>` makes
//! that variant's service abort after so many requests, as a crash would.

use anyhow::{Context, Result};
use leaklab_vocab::Variant;

pub const CRASH_AFTER_VAR: &str = "LEAKLAB_CRASH_AFTER";

/// The request count after which `variant` must crash, when the environment asks for one.
pub fn crash_after(variant: Variant) -> Result<Option<u64>> {
    let Ok(spec) = std::env::var(CRASH_AFTER_VAR) else {
        return Ok(None);
    };
    parse(&spec, variant)
}

fn parse(spec: &str, variant: Variant) -> Result<Option<u64>> {
    let (name, n) = spec
        .split_once(':')
        .with_context(|| format!("{CRASH_AFTER_VAR}={spec}: expected <variant>:<requests>"))?;
    if name != variant.name() {
        return Ok(None);
    }
    Ok(Some(n.parse().with_context(|| {
        format!("{CRASH_AFTER_VAR}={spec}: <requests> must be a whole number")
    })?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_named_variant_crashes_and_bad_specs_say_why() {
        assert_eq!(
            parse("refs-leaky:15", Variant::RefsLeaky).unwrap(),
            Some(15)
        );
        assert_eq!(parse("refs-leaky:15", Variant::GraphLeaky).unwrap(), None);
        assert!(parse("refs-leaky", Variant::RefsLeaky)
            .unwrap_err()
            .to_string()
            .contains("expected <variant>:<requests>"));
        assert!(parse("refs-leaky:x", Variant::RefsLeaky)
            .unwrap_err()
            .to_string()
            .contains("whole number"));
    }
}
