//! Exposure limits: body size, batch size and request time are bounded, each with a clear answer.

mod common;

use axum::http::StatusCode;
use common::{call, router};
use leaklab_service::api::synthetic_request;
use leaklab_service::Variant;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_past_its_time_is_answered_408() {
    let mut config = common::config(Variant::Baseline);
    config.http.request_timeout = Duration::from_millis(1);
    let r = router(config);
    let body = serde_json::to_vec(&synthetic_request(1, 512, 512)).unwrap();
    let (status, _) = call(&r, "POST", "/v1/infer", Some("application/json"), body).await;
    assert_eq!(status, StatusCode::REQUEST_TIMEOUT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_and_batch_limits_are_enforced_with_413() {
    let mut config = common::config(Variant::Baseline);
    config.http.max_batch = 4;
    config.http.body_limit_bytes = 64 << 10;
    let r = router(config);
    let five_rows = serde_json::to_vec(&synthetic_request(1, 5, 512)).unwrap();
    assert!(five_rows.len() < 64 << 10);
    let (status, body) = call(&r, "POST", "/v1/infer", Some("application/json"), five_rows).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(String::from_utf8_lossy(&body).contains("exceeds the limit of 4"));
    let (status, _) = call(
        &r,
        "POST",
        "/v1/infer",
        Some("application/json"),
        vec![b' '; 65 << 10],
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
}
