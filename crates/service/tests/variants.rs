//! What the variants answer: the cache serves repeats, and leaky or fixed, the numbers agree.

mod common;

use common::{get_json, infer, router};
use leaklab_service::Variant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_input_is_served_from_the_cache_with_the_same_output() {
    let r = router(common::config(Variant::Baseline));
    let (_, first) = infer(&r, 7).await;
    let (_, again) = infer(&r, 7).await;
    assert_eq!(first["cached"], false);
    assert_eq!(again["cached"], true);
    assert_eq!(first["outputs"], again["outputs"]);
    let memory = get_json(&r, "/debug/memory").await;
    assert_eq!(memory["cache_entries"], 1);
    assert_eq!(memory["history_len"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaky_and_fixed_variants_compute_the_same_outputs() {
    let (leaky, fixed) = (
        router(common::config(Variant::Seed)),
        router(common::config(Variant::Baseline)),
    );
    for i in 0..3 {
        let (a, b) = (infer(&leaky, i).await.1, infer(&fixed, i).await.1);
        assert_eq!(a["outputs"], b["outputs"], "request {i}");
    }
}
