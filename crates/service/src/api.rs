//! The HTTP API's contract, for every handler the layer serves: a validated [`Batch`] in, an
//! [`Inference`] or an [`InferError`] out, and every error answered with a status and a
//! sentence that says what was wrong, before any tensor is allocated for a bad request.

use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use leaklab_vocab::Stage;

pub use leaklab_vocab::api::{synthetic_request, ErrorBody, InferRequest, InferResponse};

/// A validated batch: `rows × features` finite f32 values, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub rows: usize,
    pub features: usize,
    pub values: Vec<f32>,
}

/// What one request produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Inference {
    /// The request's number among those served (the first is 1).
    pub request: u64,
    pub outputs: Vec<Vec<f32>>,
    /// Whether the answer came from a cache, without a forward pass.
    pub cached: bool,
}

/// Why a handler did not answer a valid batch.
#[derive(Debug, thiserror::Error)]
pub enum InferError {
    #[error("the batch has {got} features per row; the model takes {want}")]
    Shape { got: usize, want: usize },
    /// libtorch failed inside a stage (an allocation failure, most often).
    #[error("libtorch failed during {stage}: {message}")]
    Torch { stage: Stage, message: String },
    /// The handler refused the request for a reason of its own, in its own words.
    #[error("{0}")]
    Refused(String),
}

/// An error answer: a status and a message.
#[derive(Debug, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }

    fn unprocessable(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, message)
    }

    /// The one answer to a handler that panicked: 500, with the panic's first line.
    pub fn panicked(panic: &(dyn std::any::Any + Send)) -> ApiError {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the handler panicked: {}", panic_message(panic)),
        )
    }
}

/// The first line of a panic's message (tch panics with libtorch's whole backtrace).
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    let message = panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown error".into());
    message.lines().next().unwrap_or_default().to_string()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(ErrorBody {
                error: self.message,
            }),
        )
            .into_response()
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> ApiError {
        let message = match &rejection {
            JsonRejection::MissingJsonContentType(_) => {
                "expected `Content-Type: application/json`".to_string()
            }
            _ => rejection.body_text(),
        };
        ApiError::new(rejection.status(), message)
    }
}

impl From<InferError> for ApiError {
    fn from(e: InferError) -> ApiError {
        match e {
            InferError::Shape { .. } | InferError::Refused(_) => {
                ApiError::unprocessable(e.to_string())
            }
            // The request was fine but the process could not serve it now (an allocation
            // failure, most often): retrying later is the right move, hence 503.
            InferError::Torch { .. } => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
            }
        }
    }
}

/// Checks a request against the model's input width and the batch limit, and flattens it.
///
/// Too many rows is 413 (the content is larger than the service will take: split the batch),
/// not 422 (the content is malformed), as a body over the byte limit is.
pub fn validate(
    request: InferRequest,
    features: usize,
    max_batch: usize,
) -> Result<Batch, ApiError> {
    let rows = request.inputs.len();
    if rows == 0 {
        return Err(ApiError::unprocessable(
            "`inputs` is empty: send at least one row",
        ));
    }
    if rows > max_batch {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("batch of {rows} rows exceeds the limit of {max_batch}"),
        ));
    }
    let mut values = Vec::with_capacity(rows * features);
    for (r, row) in request.inputs.into_iter().enumerate() {
        if row.len() != features {
            return Err(ApiError::unprocessable(format!(
                "row {r} has {} features; the model takes {features}",
                row.len()
            )));
        }
        if let Some(c) = row.iter().position(|v| !v.is_finite()) {
            return Err(ApiError::unprocessable(format!(
                "row {r}, column {c} is not a finite number (NaN, infinite, or out of f32 range)"
            )));
        }
        values.extend(row);
    }
    Ok(Batch {
        rows,
        features,
        values,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(inputs: Vec<Vec<f32>>) -> Result<Batch, ApiError> {
        validate(InferRequest { inputs }, 3, 4)
    }

    /// `InferRequest::from_json` is where the parser the `Json` extractor runs is compiled
    /// (optimised, in leaklab-vocab): it must read each value as the extractor does.
    #[test]
    fn the_vocab_parser_reads_bodies_as_the_json_extractor_does() {
        let bodies: [&[u8]; 4] = [
            br#"{"inputs":[[1.0,2.5],[-3e-2,4]]}"#,
            br#"{"inputs":[[1.0,"x"]]}"#,
            br#"{"inputs":[[1.0]],"extra":1}"#,
            br#"{"inputs":[[1.0]"#,
        ];
        for body in bodies {
            let text = String::from_utf8_lossy(body);
            match (
                InferRequest::from_json(body),
                Json::<InferRequest>::from_bytes(body),
            ) {
                (Ok(ours), Ok(Json(axums))) => assert_eq!(ours, axums, "{text}"),
                (Err(ours), Err(axums)) => assert!(
                    axums.body_text().contains(&ours.to_string()),
                    "{text}: {ours} against {}",
                    axums.body_text()
                ),
                (ours, axums) => panic!("{text}: {ours:?} against {axums:?}"),
            }
        }
    }

    #[test]
    fn each_bad_batch_says_what_is_wrong() {
        assert_eq!(
            check(vec![]).unwrap_err().message,
            "`inputs` is empty: send at least one row"
        );
        assert_eq!(
            check(vec![vec![0.0; 3]; 5]).unwrap_err().status,
            StatusCode::PAYLOAD_TOO_LARGE
        );
        assert_eq!(
            check(vec![vec![0.0; 3], vec![0.0; 2]]).unwrap_err().message,
            "row 1 has 2 features; the model takes 3"
        );
        let nan = check(vec![vec![0.0, f32::INFINITY, 0.0]]).unwrap_err();
        assert_eq!(
            (nan.status, nan.message.as_str()),
            (
                StatusCode::UNPROCESSABLE_ENTITY,
                "row 0, column 1 is not a finite number (NaN, infinite, or out of f32 range)"
            )
        );
        assert_eq!(
            check(vec![vec![1.0, 2.0, 3.0]]).unwrap(),
            Batch {
                rows: 1,
                features: 3,
                values: vec![1.0, 2.0, 3.0]
            }
        );
    }

    #[test]
    fn handler_errors_map_to_their_status_and_say_the_stage_by_name() {
        let torch = ApiError::from(InferError::Torch {
            stage: Stage::Forward,
            message: "out of memory".into(),
        });
        assert_eq!(
            (torch.status, torch.message.as_str()),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "libtorch failed during forward: out of memory"
            )
        );
        let refused = ApiError::from(InferError::Refused("inputs must be standardised".into()));
        assert_eq!(
            (refused.status, refused.message.as_str()),
            (
                StatusCode::UNPROCESSABLE_ENTITY,
                "inputs must be standardised"
            )
        );
        let panic: Box<dyn std::any::Any + Send> =
            Box::new(String::from("index out of range\nbacktrace..."));
        assert_eq!(
            ApiError::panicked(panic.as_ref()).message,
            "the handler panicked: index out of range"
        );
    }
}
