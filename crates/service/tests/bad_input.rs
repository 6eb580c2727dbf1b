//! Bad input gets a 4xx that says what was wrong, and leaves no byte behind.
//!
//! The only test in this binary: it asserts on the process-wide allocator.

mod common;

use axum::http::StatusCode;
use common::{call, get_json, infer, router, BATCH};
use leaklab_probe::cpu;
use leaklab_service::Variant;

fn row(v: &str) -> String {
    vec![v; 512].join(",")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_bad_request_is_refused_clearly_and_leaks_nothing() {
    let mut config = common::config(Variant::Baseline);
    config.http.max_batch = 16;
    config.http.body_limit_bytes = 256 * 1024;
    let r = router(config);
    // Warm up: first-request allocations (thread pools, lazy kernels) are not the errors' doing.
    for i in 0..3 {
        assert_eq!(infer(&r, i).await.0, StatusCode::OK);
    }
    let json = Some("application/json");
    let nested = "[".repeat(10_000) + &"]".repeat(10_000);
    let cases: Vec<(&str, Option<&str>, String)> = vec![
        ("malformed json", json, "{\"inputs\": [[1, 2".into()),
        ("not json at all", json, "hello".into()),
        (
            "wrong content type",
            Some("text/plain"),
            format!("{{\"inputs\": [[{}]]}}", row("0")),
        ),
        (
            "no content type",
            None,
            format!("{{\"inputs\": [[{}]]}}", row("0")),
        ),
        ("wrong top-level type", json, "[1, 2, 3]".into()),
        ("missing field", json, "{}".into()),
        (
            "unknown field",
            json,
            format!("{{\"inputs\": [[{}]], \"extra\": 1}}", row("0")),
        ),
        (
            "strings for numbers",
            json,
            format!("{{\"inputs\": [[{}]]}}", row("\"a\"")),
        ),
        ("empty batch", json, "{\"inputs\": []}".into()),
        (
            "wrong feature count",
            json,
            "{\"inputs\": [[1.0, 2.0]]}".into(),
        ),
        (
            "ragged rows",
            json,
            format!("{{\"inputs\": [[{}], [1.0]]}}", row("0")),
        ),
        (
            "NaN literal",
            json,
            format!("{{\"inputs\": [[NaN,{}]]}}", row("0")),
        ),
        (
            "overflows f32 to infinity",
            json,
            format!("{{\"inputs\": [[1e39,{}]]}}", vec!["0"; 511].join(",")),
        ),
        (
            "beyond f64",
            json,
            format!("{{\"inputs\": [[1e400,{}]]}}", vec!["0"; 511].join(",")),
        ),
        (
            "over-limit batch",
            json,
            format!(
                "{{\"inputs\": [{}]}}",
                vec![format!("[{}]", row("0")); 17].join(",")
            ),
        ),
        (
            "body over the size limit",
            json,
            format!(
                "{{\"inputs\": [[{}]]}}",
                row("0.000000000000000000000000000001")
            )
            .repeat(40),
        ),
        ("deeply nested", json, format!("{{\"inputs\": {nested}}}")),
        (
            "truncated body",
            json,
            format!("{{\"inputs\": [[{}", row("0")),
        ),
    ];
    let before = cpu::stats().live_bytes;
    let mut answers = Vec::new();
    for (name, content_type, body) in &cases {
        let (status, bytes) = call(
            &r,
            "POST",
            "/v1/infer",
            *content_type,
            body.clone().into_bytes(),
        )
        .await;
        assert!(status.is_client_error(), "{name}: {status}");
        let text = String::from_utf8_lossy(&bytes).to_string();
        let error = serde_json::from_str::<serde_json::Value>(&text)
            .map(|v| v["error"].as_str().unwrap_or_default().to_string())
            .unwrap_or(text);
        assert!(!error.is_empty(), "{name}: no message");
        answers.push(format!(
            "{name}: {} {}",
            status.as_u16(),
            error.chars().take(120).collect::<String>()
        ));
    }
    assert_eq!(
        cpu::stats().live_bytes,
        before,
        "an error path left tensor memory behind"
    );
    insta::assert_snapshot!(answers.join("\n"));

    // The service still serves, and no bad request counted as a served one.
    let (status, body) = infer(&r, 100).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["request"], 4);
    assert_eq!(body["outputs"].as_array().unwrap().len(), BATCH);
    let memory = get_json(&r, "/debug/memory").await;
    assert_eq!(memory["requests"], 4);
}
