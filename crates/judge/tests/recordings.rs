//! The judge on recordings of live scans (tests/fixtures): deterministic, no service started.

use leaklab_detect::Verdict;
use leaklab_judge::verdict::{Budget, Ops};
use leaklab_judge::{judge, Evidence, Outcome};

/// The evidence of a recording (the `evidence.json` a scan writes beside its report).
fn recorded(name: &str) -> Evidence {
    let path = format!("{}/tests/fixtures/{name}.json", env!("CARGO_MANIFEST_DIR"));
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    serde_json::from_value(doc["evidence"].clone()).unwrap()
}

/// The twin's cache-leaky scanned with its agent (crates/cli/tests/scan.rs, 2026-12-07): its
/// pages stopped growing for the last 108 of 400 judged requests, every host series read a
/// plateau, while the census, over the 100 requests after, saw the cache gain 16 KiB a request.
const TWIN: &str = "twin-cache-leaky";
/// The scan's budget: 5 requests a second for 2 days (8 GiB).
const TWO_DAYS: Budget = Budget {
    steps_per_second: 5.0,
    seconds: 2.0 * 86400.0,
};

#[test]
fn a_plateau_the_census_shows_going_on_fails_at_the_censuss_rate() {
    let j = judge(&recorded(TWIN), Some(TWO_DAYS));
    assert_eq!(j.outcome, Outcome::Fail, "{}", j.diagnosis);
    for s in &j.series {
        assert_eq!(
            s.judgement.as_ref().map(|j| j.verdict),
            Some(Verdict::Plateau),
            "{}",
            s.series
        );
        assert_eq!(s.ops, Some(Ops::Fail), "{}", s.series);
        // 8.26 GB left at 16,384 B a request and 5 a second: 28 hours.
        let hours = s.seconds_to_oom.unwrap() / 3600.0;
        assert!((27.0..29.0).contains(&hours), "{}: {hours} h", s.series);
    }
    let axis = j.axis.expect("an axis");
    assert!(!axis.bounded, "{}", axis.words);
    assert!(axis.words.contains("+16.38 kB a request"), "{}", axis.words);
    assert!(
        j.diagnosis.starts_with("Host memory grows"),
        "{}",
        j.diagnosis
    );
    assert!(
        j.owner.unwrap().fix.contains("'app'.state.pipeline.cache"),
        "the owner names the cache"
    );
}

#[test]
fn without_the_census_the_same_plateau_passes() {
    let mut e = recorded(TWIN);
    e.census = None;
    let j = judge(&e, Some(TWO_DAYS));
    assert_eq!(j.outcome, Outcome::Pass, "{}", j.diagnosis);
}

#[test]
fn a_census_rate_that_lasts_the_budget_passes() {
    // 16,384 B a request at 5 a second fills 8.26 GB in 28 hours: a day's budget lasts.
    let day = Budget {
        seconds: 86400.0,
        ..TWO_DAYS
    };
    let j = judge(&recorded(TWIN), Some(day));
    assert_eq!(j.outcome, Outcome::Pass, "{}", j.diagnosis);
    assert!(
        j.notes.iter().any(|n| n.contains("lasts the budget")),
        "{:?}",
        j.notes
    );
}

#[test]
fn without_a_budget_a_plateau_the_census_shows_going_on_fails() {
    assert_eq!(judge(&recorded(TWIN), None).outcome, Outcome::Fail);
}

/// The zoo's pyplot_figures_kept fixed twin in a fresh-clone CI run (2026-12-08): it rose 7.84 MB
/// and held, and `malloc_trim(0)` returned 25.46 MB; the agent's Python trace had a request in
/// flight at a snapshot (a figure's thousands of objects read as kept) and named the owner
/// Python. Memory the allocator gave back is held by nothing: the owner stays native.
#[test]
fn a_growth_the_allocator_gave_back_is_owned_by_no_python_object_a_trace_caught_in_flight() {
    let e = recorded("pyplot-fixed-given-back");
    assert!(e.python_trace.as_ref().is_some_and(|t| !t.between_requests));
    let j = judge(&e, None);
    let axis = j.axis.expect("an axis");
    assert_eq!(
        axis.axis,
        leaklab_judge::diagnosis::Axis::GivenBack,
        "{}",
        axis.words
    );
    let owner = j.owner.expect("an owner");
    assert_eq!(
        owner.owner,
        leaklab_judge::diagnosis::Owner::Native,
        "{}",
        owner.words
    );
}
