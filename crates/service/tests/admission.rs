//! Admission control and allocation failures: refused before allocating, or caught and
//! answered 503, and in both cases the service serves the next request with no growth.
//!
//! The only test in this binary: it sets the process-wide allocator limit.

mod common;

use axum::http::StatusCode;
use common::{call, infer, router};
use leaklab_probe::cpu;
use leaklab_service::api::synthetic_request;
use leaklab_service::Variant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_budget_requests_are_refused_and_allocation_failures_are_survived() {
    // graph-fixed keeps nothing between requests (no cache, no history), so "no growth" is exact.
    let mut config = common::config(Variant::GraphFixed);
    // Room for the model and small batches, not for a batch of 1000 rows (about 40 MB).
    config.http.memory_budget_bytes = Some(cpu::stats().live_bytes.max(0) as u64 + (24 << 20));
    let r = router(config);
    for i in 0..3 {
        assert_eq!(infer(&r, i).await.0, StatusCode::OK);
    }
    let before = cpu::stats();

    // Refused before allocating: the estimate alone is over the budget.
    let big = serde_json::to_vec(&synthetic_request(9, 1000, 512)).unwrap();
    let (status, body) = call(&r, "POST", "/v1/infer", Some("application/json"), big).await;
    let body = String::from_utf8_lossy(&body).to_string();
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert!(body.contains("more than the memory budget"), "{body}");
    let after_refusal = cpu::stats();
    assert_eq!(after_refusal.live_bytes, before.live_bytes);
    assert_eq!(
        after_refusal.alloc_count, before.alloc_count,
        "refused before any allocation"
    );

    // Forced failure inside libtorch: the allocator's cap drops to what is live now.
    cpu::set_limit(Some(cpu::stats().live_bytes as u64 + 1024));
    let (status, body) = infer(&r, 10).await;
    cpu::set_limit(None);
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let message = body["error"].as_str().unwrap();
    assert!(
        message.contains("libtorch failed during preprocess")
            && message.contains("leaklab CPU memory limit"),
        "{message}"
    );
    assert_eq!(
        cpu::stats().live_bytes,
        before.live_bytes,
        "the failed request freed what it made"
    );

    // And the service goes on, with the same exact footprint per request as before.
    for i in 11..14 {
        assert_eq!(infer(&r, i).await.0, StatusCode::OK);
    }
    assert_eq!(cpu::stats().live_bytes, before.live_bytes);
}
