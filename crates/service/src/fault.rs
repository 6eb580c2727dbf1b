//! Fault injection for the lab's own tests, by variant: `LEAKLAB_CRASH_AFTER=<variant>:<requests>`
//! makes that variant's service abort after so many requests, as a crash would, and
//! `LEAKLAB_FAIL_AFTER=<variant>:<requests>` makes it answer HTTP 500 to every request after so
//! many, as a service whose dependency broke does (each request still runs, and leaks as its
//! variant does).

use anyhow::{Context, Result};
use leaklab_vocab::Variant;

pub const CRASH_AFTER_VAR: &str = "LEAKLAB_CRASH_AFTER";
pub const FAIL_AFTER_VAR: &str = "LEAKLAB_FAIL_AFTER";

/// The request count after which `variant` must crash, when the environment asks for one.
pub fn crash_after(variant: Variant) -> Result<Option<u64>> {
    after(CRASH_AFTER_VAR, variant)
}

/// The request count after which `variant` must answer errors, when the environment asks.
pub fn fail_after(variant: Variant) -> Result<Option<u64>> {
    after(FAIL_AFTER_VAR, variant)
}

fn after(var: &str, variant: Variant) -> Result<Option<u64>> {
    let Ok(spec) = std::env::var(var) else {
        return Ok(None);
    };
    parse(var, &spec, variant)
}

fn parse(var: &str, spec: &str, variant: Variant) -> Result<Option<u64>> {
    let (name, n) = spec
        .split_once(':')
        .with_context(|| format!("{var}={spec}: expected <variant>:<requests>"))?;
    if name != variant.name() {
        return Ok(None);
    }
    Ok(Some(n.parse().with_context(|| {
        format!("{var}={spec}: <requests> must be a whole number")
    })?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_named_variant_fails_and_bad_specs_say_why() {
        let parse = |spec, variant| parse(FAIL_AFTER_VAR, spec, variant);
        assert_eq!(
            parse("refs-leaky:15", Variant::RefsLeaky).unwrap(),
            Some(15)
        );
        assert_eq!(parse("refs-leaky:15", Variant::GraphLeaky).unwrap(), None);
        let missing = parse("refs-leaky", Variant::RefsLeaky).unwrap_err();
        assert!(
            missing
                .to_string()
                .contains("LEAKLAB_FAIL_AFTER=refs-leaky: expected <variant>:<requests>"),
            "{missing:#}"
        );
        assert!(parse("refs-leaky:x", Variant::RefsLeaky)
            .unwrap_err()
            .to_string()
            .contains("whole number"));
    }
}
