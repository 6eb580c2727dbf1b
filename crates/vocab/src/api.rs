//! The service's HTTP bodies, as plain data, and the deterministic requests every client of
//! the lab sends.

use crate::rng::SeededRng;
use serde::{Deserialize, Serialize};

/// `POST /v1/infer`: a batch of rows, each with the model's input width.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct InferRequest {
    pub inputs: Vec<Vec<f32>>,
}

impl InferRequest {
    /// A body's value read as the service's HTTP layer reads it (axum's `Json`: serde_json
    /// through serde_path_to_error, which names the field at fault; the extractor then checks
    /// that nothing follows the value). Compiled here, in a crate the dev profile optimises:
    /// rustc shares a generic's instantiation with the crates downstream at opt-levels 0 and 1,
    /// so the service (opt-level 0) parses with this copy. A drill service's CPU for the same
    /// 620 requests: 5.19 and 5.53 s before, 2.51 and 2.48 s after (2026-12-06).
    pub fn from_json(
        body: &[u8],
    ) -> Result<InferRequest, serde_path_to_error::Error<serde_json::Error>> {
        serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(body))
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InferResponse {
    pub request: u64,
    pub variant: String,
    pub cached: bool,
    pub outputs: Vec<Vec<f32>>,
}

/// Every error answer's body: one sentence that says what was wrong.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ErrorBody {
    pub error: String,
}

/// A deterministic batch for request `index`: distinct for every index, the same on every run.
/// The lab's load client, the tests and the benches all send these.
pub fn synthetic_request(index: u64, rows: usize, features: usize) -> InferRequest {
    let mut rng = SeededRng::new(index.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03);
    let inputs = (0..rows)
        .map(|_| (0..features).map(|_| rng.symmetric() as f32).collect())
        .collect();
    InferRequest { inputs }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_requests_are_distinct_and_reproducible() {
        let a = synthetic_request(1, 2, 3);
        assert_eq!(a, synthetic_request(1, 2, 3));
        assert_ne!(a, synthetic_request(2, 2, 3));
        assert_eq!((a.inputs.len(), a.inputs[0].len()), (2, 3));
    }
}
