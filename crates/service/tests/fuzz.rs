//! Bad input at scale: generated malformed requests of every kind, each answered 4xx with a
//! message, none 5xx, none panicking, and not one tensor allocated for any of them.
//!
//! `LEAKLAB_FUZZ_CASES` sets the count (300 by default; `cargo xtask soak --full` runs 10,000).
//! The only test in this binary: it asserts on the process-wide allocator.

mod common;

use common::{call, router};
use leaklab_probe::cpu;
use leaklab_service::Variant;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

const FEATURES: usize = 512;

/// A bad request: its content type and body.
fn bad_request() -> impl Strategy<Value = (Option<&'static str>, Vec<u8>)> {
    let json = Some("application/json");
    let good_row = || format!("[{}]", vec!["0.5"; FEATURES].join(","));
    prop_oneof![
        // Random bytes and random text.
        prop::collection::vec(any::<u8>(), 0..2048).prop_map(move |b| (json, b)),
        "\\PC{0,200}".prop_map(move |s: String| (json, s.into_bytes())),
        // Truncations of a valid body.
        (1usize..4000).prop_map(move |cut| {
            let body = format!("{{\"inputs\": [{}]}}", good_row());
            (json, body.as_bytes()[..cut.min(body.len() - 1)].to_vec())
        }),
        // Wrong shapes: rows of the wrong width, ragged batches, empty batches.
        (0usize..2000)
            .prop_filter("not the model's width", |n| *n != FEATURES)
            .prop_map(move |n| (
                json,
                format!("{{\"inputs\": [[{}]]}}", vec!["1"; n].join(",")).into_bytes()
            )),
        (2usize..6, 0usize..FEATURES).prop_map(move |(rows, short)| {
            let mut body: Vec<String> = (0..rows).map(|_| good_row()).collect();
            body[rows - 1] = format!("[{}]", vec!["1"; short].join(","));
            (
                json,
                format!("{{\"inputs\": [{}]}}", body.join(",")).into_bytes(),
            )
        }),
        Just((json, b"{\"inputs\": []}".to_vec())),
        // Wrong types in a row, huge and non-finite numbers.
        prop_oneof![
            Just("\"x\""),
            Just("null"),
            Just("true"),
            Just("{}"),
            Just("[]"),
            Just("1e39"),
            Just("-1e39"),
            Just("1e400"),
            Just("NaN"),
            Just("Infinity")
        ]
        .prop_map(move |v| (
            json,
            format!(
                "{{\"inputs\": [[{v},{}]]}}",
                vec!["0"; FEATURES - 1].join(",")
            )
            .into_bytes()
        )),
        // Deep nesting, wrong top-level types, unknown fields.
        (1usize..5000).prop_map(move |d| (
            json,
            format!("{{\"inputs\": {}{}}}", "[".repeat(d), "]".repeat(d)).into_bytes()
        )),
        prop_oneof![
            Just("[]"),
            Just("1"),
            Just("\"inputs\""),
            Just("null"),
            Just("{\"input\": []}")
        ]
        .prop_map(move |b| (json, b.as_bytes().to_vec())),
        // Right body, wrong or missing content type.
        prop_oneof![
            Just(None),
            Just(Some("text/plain")),
            Just(Some("application/x-www-form-urlencoded")),
            Just(Some("application/xml"))
        ]
        .prop_map(move |ct| (ct, format!("{{\"inputs\": [{}]}}", good_row()).into_bytes())),
        // Over the batch limit and over the body limit.
        (9usize..20).prop_map(move |rows| (
            json,
            format!("{{\"inputs\": [{}]}}", vec![good_row(); rows].join(",")).into_bytes()
        )),
        (1usize..4).prop_map(move |k| (json, vec![b' '; (300 << 10) * k])),
    ]
}

#[test]
fn generated_bad_requests_are_all_refused_with_a_message_and_allocate_nothing() {
    let cases: u32 = std::env::var("LEAKLAB_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut config = common::config(Variant::Baseline);
    config.http.max_batch = 8;
    config.http.body_limit_bytes = 256 << 10;
    let r = router(config);
    rt.block_on(async {
        assert!(common::infer(&r, 0).await.0.is_success());
    });
    let before = cpu::stats();
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let by_status = std::cell::RefCell::new(std::collections::BTreeMap::new());
    runner
        .run(&bad_request(), |(content_type, body)| {
            let (status, bytes) = rt.block_on(call(&r, "POST", "/v1/infer", content_type, body));
            prop_assert!(
                status.is_client_error(),
                "status {status} for a bad request"
            );
            let text = String::from_utf8_lossy(&bytes);
            let message: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| TestCaseError::fail(format!("not JSON: {e}: {text}")))?;
            prop_assert!(
                message["error"].as_str().is_some_and(|m| m.len() > 10),
                "no message: {text}"
            );
            *by_status
                .borrow_mut()
                .entry(status.as_u16())
                .or_insert(0u32) += 1;
            Ok(())
        })
        .unwrap();
    let after = cpu::stats();
    assert_eq!(
        after.alloc_count, before.alloc_count,
        "a bad request allocated tensor memory"
    );
    assert_eq!(after.live_bytes, before.live_bytes);
    println!(
        "{cases} bad requests, answers by status: {:?}",
        by_status.borrow()
    );
    // The service is still fine.
    rt.block_on(async {
        assert!(common::infer(&r, 1).await.0.is_success());
    });
}
