//! Every variant through the real handler: leaky ones grow by exactly the bytes their cause
//! keeps per request, fixed ones by nothing after warm-up.
//!
//! The only test in this binary, running the variants in turn: the counting allocator is
//! process-wide, so anything measured in parallel would be seen too.

mod common;

use common::{get_json, infer, router, BATCH};
use leaklab_model::Scale;
use leaklab_service::Variant;

const WARMUP: u64 = 6;
const REQUESTS: u64 = 12;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_variant_grows_by_exactly_what_its_cause_keeps() {
    let m = Scale::Default.config();
    let b = BATCH as i64;
    let graph = m.graph_bytes_per_request(b); // input + hidden activation saved for backward
    let output = m.output_bytes(b);
    let input = m.input_bytes(b);
    let expected = [
        (Variant::GraphLeaky, graph),
        (Variant::GraphFixed, 0),
        (Variant::RefsLeaky, output),
        (Variant::RefsFixed, 0),
        (Variant::CacheLeaky, input),
        (Variant::CacheFixed, 0),
        (Variant::Baseline, 0),
        // The cache and the graph share the input's storage, so it counts once.
        (Variant::Seed, graph + output),
    ];
    assert_eq!((graph, output, input), (81_920, 16_384, 16_384));
    let mut measured = Vec::new();
    for (variant, bytes) in expected {
        let r = router(common::config(variant));
        for i in 0..WARMUP + REQUESTS {
            let (status, body) = infer(&r, i).await;
            assert!(status.is_success(), "{variant}: {body}");
            assert_eq!(body["outputs"].as_array().unwrap().len(), BATCH);
        }
        let samples = get_json(&r, &format!("/debug/memory/samples?since={WARMUP}")).await;
        let live: Vec<i64> = samples
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["memory"]["cpu"]["live_bytes"].as_i64().unwrap())
            .collect();
        assert_eq!(live.len() as u64, REQUESTS);
        let steps: Vec<i64> = live.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(
            steps.iter().all(|s| *s == bytes),
            "{variant}: per-request growth {steps:?}, expected {bytes} each"
        );
        measured.push((variant.name(), steps[0]));
    }
    insta::assert_debug_snapshot!(measured);
}
