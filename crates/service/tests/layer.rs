//! The HTTP layer with a handler of its own (as the incident drill plugs in): a panic is
//! answered 500 with its first line and the service goes on, a refusal is 422 in the
//! handler's words, and `/metrics` carries the handler's gauges and no per-stage series for a
//! handler without stages.

mod common;

use axum::http::StatusCode;
use common::call;
use leaklab_model::{ModelConfig, Scale};
use leaklab_probe::Probes;
use leaklab_service::api::{synthetic_request, Batch, InferError, Inference};
use leaklab_service::metrics::OwnGauge;
use leaklab_service::{App, Handler, HttpConfig, RequestSample, SampleDepth, Sampler};

/// `GET /debug/memory`'s part of the handler: a struct, whose fields the report flattens in.
#[derive(serde::Serialize)]
struct Served {
    served: u64,
}

/// Answers each row with its first value; panics on two rows, refuses three.
struct Echo {
    sampler: Sampler,
    served: u64,
}

impl Handler for Echo {
    type State = Served;
    fn name(&self) -> &'static str {
        "echo"
    }
    fn model(&self) -> ModelConfig {
        Scale::Default.config()
    }
    fn infer(&mut self, batch: &Batch) -> Result<Inference, InferError> {
        match batch.rows {
            2 => panic!("two rows are one too many\nand a second line that is not shown"),
            3 => Err(InferError::Refused("three rows are refused here".into())),
            rows => {
                self.served += 1;
                Ok(Inference {
                    request: self.served,
                    outputs: batch
                        .values
                        .chunks(batch.features)
                        .map(|r| vec![r[0]])
                        .collect(),
                    cached: rows == 4,
                })
            }
        }
    }
    fn requests(&self) -> u64 {
        self.served
    }
    fn probes(&self) -> &Probes {
        self.sampler.probes()
    }
    fn sample(&mut self, latency_us: u64, depth: SampleDepth) -> RequestSample {
        RequestSample {
            request: self.served,
            latency_us,
            stage_live_bytes: Default::default(),
            memory: self.sampler.memory(depth),
        }
    }
    fn stages(&self) -> bool {
        false
    }
    fn state(&self) -> Served {
        Served {
            served: self.served,
        }
    }
    fn gauges(&self) -> Vec<OwnGauge> {
        vec![OwnGauge {
            name: "echo_served",
            help: "Requests echoed",
            value: self.served as f64,
        }]
    }
}

async fn post(r: &axum::Router, rows: usize) -> (StatusCode, serde_json::Value) {
    let body = serde_json::to_vec(&synthetic_request(rows as u64, rows, 512)).unwrap();
    let (status, bytes) = call(r, "POST", "/v1/infer", Some("application/json"), body).await;
    (status, serde_json::from_slice(&bytes).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_handler_gets_the_same_answers_and_the_same_metrics() {
    leaklab_probe::cpu::install().unwrap();
    let app = App::new(
        Echo {
            sampler: Sampler::new(Probes::cpu()),
            served: 0,
        },
        HttpConfig::new(Scale::Default.config()),
    )
    .unwrap();
    let r = leaklab_service::router(app);
    let (status, body) = post(&r, 1).await;
    assert_eq!(
        (status, body["variant"].as_str(), body["request"].as_u64()),
        (StatusCode::OK, Some("echo"), Some(1)),
        "{body}"
    );
    let (status, body) = post(&r, 2).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            Some("the handler panicked: two rows are one too many")
        )
    );
    let (status, body) = post(&r, 3).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            Some("three rows are refused here")
        )
    );
    // The same validation as the lab's service, before the handler sees anything.
    let (status, body) = post(&r, 1025).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            Some("batch of 1025 rows exceeds the limit of 1024")
        )
    );
    let (status, body) = post(&r, 4).await;
    assert_eq!(
        (status, body["cached"].as_bool(), body["request"].as_u64()),
        (StatusCode::OK, Some(true), Some(2)),
        "the service goes on after a panic"
    );

    let (_, text) = call(&r, "GET", "/metrics", None, Vec::new()).await;
    let text = String::from_utf8(text).unwrap();
    for series in [
        "leaklab_requests_total{variant=\"echo\",outcome=\"ok\"} 2",
        "leaklab_requests_total{variant=\"echo\",outcome=\"server_error\"} 1",
        "leaklab_requests_total{variant=\"echo\",outcome=\"client_error\"} 2",
        "leaklab_echo_served 2",
        "leaklab_memory_bytes{variant=\"echo\",probe=\"cpu_allocator_live\"}",
    ] {
        assert!(text.contains(series), "no `{series}` in\n{text}");
    }
    assert!(
        !text.contains("leaklab_stage_live_bytes{"),
        "a handler without stages exports no per-stage bytes:\n{text}"
    );
    let (status, memory) = call(&r, "GET", "/debug/memory", None, Vec::new()).await;
    let memory: serde_json::Value = serde_json::from_slice(&memory).unwrap();
    assert_eq!(
        (
            status,
            memory["requests"].as_u64(),
            memory["served"].as_u64()
        ),
        (StatusCode::OK, Some(2), Some(2)),
        "{memory}"
    );
}
