//! One in-process client for the service's tests: requests go through the real router.
#![allow(dead_code)] // each test binary uses its own subset

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use leaklab_model::Scale;
use leaklab_service::api::synthetic_request;
use leaklab_service::{Device, PipelineConfig, ServiceConfig, Variant};
use tower::ServiceExt;

pub const BATCH: usize = 8;

pub fn config(variant: Variant) -> ServiceConfig {
    let mut pipeline = PipelineConfig::new(Scale::Default.config(), Device::Cpu);
    // Five entries' worth, so the fixed cache is full after five requests.
    pipeline.cache_capacity_bytes = 5 * 4 * BATCH * 512;
    let mut config = ServiceConfig::new(variant, pipeline);
    config.http.debug_endpoints = true;
    config
}

pub fn router(config: ServiceConfig) -> Router {
    leaklab_service::router(leaklab_service::app(config).expect("service starts"))
}

pub async fn call(
    router: &Router,
    method: &str,
    uri: &str,
    content_type: Option<&str>,
    body: Vec<u8>,
) -> (StatusCode, Vec<u8>) {
    let mut req = Request::builder().method(method).uri(uri);
    if let Some(ct) = content_type {
        req = req.header("content-type", ct);
    }
    let resp = router
        .clone()
        .oneshot(req.body(Body::from(body)).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    (
        status,
        resp.into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
}

pub async fn infer(router: &Router, index: u64) -> (StatusCode, serde_json::Value) {
    let body = serde_json::to_vec(&synthetic_request(index, BATCH, 512)).unwrap();
    let (status, bytes) = call(router, "POST", "/v1/infer", Some("application/json"), body).await;
    (status, serde_json::from_slice(&bytes).unwrap())
}

pub async fn get_json(router: &Router, uri: &str) -> serde_json::Value {
    let (status, bytes) = call(router, "GET", uri, None, Vec::new()).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "{uri}: {}",
        String::from_utf8_lossy(&bytes)
    );
    serde_json::from_slice(&bytes).unwrap()
}
