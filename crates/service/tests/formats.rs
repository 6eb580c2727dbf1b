//! The response formats, as users and scrapers see them.

mod common;

use axum::http::StatusCode;
use common::{call, get_json, infer, router};
use leaklab_service::Variant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn infer_memory_and_metrics_formats() {
    let r = router(common::config(Variant::RefsLeaky));
    let (_, body) = infer(&r, 1).await;
    let mut shape = body.clone();
    shape["outputs"] = serde_json::json!(format!(
        "{} rows × {} columns",
        body["outputs"].as_array().unwrap().len(),
        body["outputs"][0].as_array().unwrap().len()
    ));
    insta::assert_json_snapshot!("infer_response", shape);

    let mut memory = get_json(&r, "/debug/memory").await;
    // What differs from run to run is replaced by its kind; the fields' names stay.
    let mut redact = |pointer: &str, kind: &str| {
        *memory
            .pointer_mut(pointer)
            .unwrap_or_else(|| panic!("/debug/memory has no {pointer}")) = kind.into();
    };
    redact("/mean_output", "[float]");
    redact("/sample/latency_us", "[us]");
    for field in ["rss_bytes", "heap_bytes"] {
        redact(&format!("/sample/memory/{field}"), "[bytes]");
    }
    for stage in ["preprocess", "forward", "postprocess", "telemetry"] {
        redact(&format!("/sample/stage_live_bytes/{stage}"), "[bytes]");
    }
    let cpu = memory["sample"]["memory"]["cpu"].as_object_mut().unwrap();
    for (name, v) in cpu.iter_mut() {
        *v = if name.contains("bytes") {
            "[bytes]"
        } else {
            "[count]"
        }
        .into();
    }
    insta::assert_json_snapshot!("debug_memory", memory);

    let (status, text) = call(&r, "GET", "/metrics", None, Vec::new()).await;
    assert_eq!(status, StatusCode::OK);
    let text = String::from_utf8(text).unwrap();
    // Metric names and labels, values stripped: the contract of dashboards and alert rules.
    let mut series: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.rsplit_once(' ').map_or(l, |(name, _)| name))
        .filter(|l| !l.contains("_bucket"))
        .collect();
    series.sort();
    insta::assert_snapshot!("metrics_series", series.join("\n"));
    assert!(
        text.contains("leaklab_memory_bytes{variant=\"refs-leaky\",probe=\"cpu_allocator_live\"}")
    );
    // The alert rules' capacity (docs/prometheus/leaklab-alerts.yml) is this series.
    assert!(text.contains("leaklab_memory_capacity_bytes{variant=\"refs-leaky\",memory=\"host\"}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_endpoints_are_off_unless_enabled() {
    let mut config = common::config(Variant::Baseline);
    config.http.debug_endpoints = false;
    let r = router(config);
    for uri in ["/debug/memory/samples", "/debug/memory/snapshot"] {
        let (status, body) = call(&r, "GET", uri, None, Vec::new()).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(String::from_utf8_lossy(&body).contains("--debug-endpoints"));
    }
    assert_eq!(
        call(&r, "GET", "/healthz", None, Vec::new()).await.0,
        StatusCode::OK
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_snapshot_endpoint_serves_a_memory_viz_pickle() {
    let mut config = common::config(Variant::RefsLeaky);
    config.http.memory_history_entries = 10_000;
    let r = router(config);
    infer(&r, 1).await;
    let (status, bytes) = call(&r, "GET", "/debug/memory/snapshot", None, Vec::new()).await;
    assert_eq!(status, StatusCode::OK);
    // Pickle protocol header, then a dict whose keys include the viewer's.
    assert_eq!(bytes[0], 0x80);
    let text = String::from_utf8_lossy(&bytes);
    assert!(
        text.contains("segments") && text.contains("device_traces") && text.contains("forward")
    );
}
