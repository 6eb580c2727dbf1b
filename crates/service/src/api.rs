//! The HTTP API's bodies and its errors: every bad request gets a 4xx and a sentence that says
//! what was wrong, before any tensor is allocated.

use crate::pipeline::{Batch, InferError};
use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

pub use leaklab_vocab::api::{synthetic_request, ErrorBody, InferRequest, InferResponse};

/// An error answer: a status and a message.
#[derive(Debug, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into() }
    }

    fn unprocessable(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(ErrorBody { error: self.message })).into_response()
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> ApiError {
        let message = match &rejection {
            JsonRejection::MissingJsonContentType(_) => "expected `Content-Type: application/json`".to_string(),
            _ => rejection.body_text(),
        };
        ApiError::new(rejection.status(), message)
    }
}

impl From<InferError> for ApiError {
    fn from(e: InferError) -> ApiError {
        match e {
            InferError::Shape { .. } => ApiError::unprocessable(e.to_string()),
            // The request was fine but the process could not serve it now (an allocation
            // failure, most often): retrying later is the right move, hence 503.
            InferError::Torch { .. } => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
        }
    }
}

/// Checks a request against the model's input width and the batch limit, and flattens it.
pub fn validate(request: InferRequest, features: usize, max_batch: usize) -> Result<Batch, ApiError> {
    let rows = request.inputs.len();
    if rows == 0 {
        return Err(ApiError::unprocessable("`inputs` is empty: send at least one row"));
    }
    if rows > max_batch {
        return Err(ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, format!("batch of {rows} rows exceeds the limit of {max_batch}")));
    }
    let mut values = Vec::with_capacity(rows * features);
    for (r, row) in request.inputs.into_iter().enumerate() {
        if row.len() != features {
            return Err(ApiError::unprocessable(format!("row {r} has {} features; the model takes {features}", row.len())));
        }
        if let Some(c) = row.iter().position(|v| !v.is_finite()) {
            return Err(ApiError::unprocessable(format!("row {r}, column {c} is not a finite number (NaN, infinite, or out of f32 range)")));
        }
        values.extend(row);
    }
    Ok(Batch { rows, features, values })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(inputs: Vec<Vec<f32>>) -> Result<Batch, ApiError> {
        validate(InferRequest { inputs }, 3, 4)
    }

    #[test]
    fn each_bad_batch_says_what_is_wrong() {
        assert_eq!(check(vec![]).unwrap_err().message, "`inputs` is empty: send at least one row");
        assert_eq!(check(vec![vec![0.0; 3]; 5]).unwrap_err().status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(check(vec![vec![0.0; 3], vec![0.0; 2]]).unwrap_err().message, "row 1 has 2 features; the model takes 3");
        let nan = check(vec![vec![0.0, f32::INFINITY, 0.0]]).unwrap_err();
        assert_eq!((nan.status, nan.message.as_str()), (StatusCode::UNPROCESSABLE_ENTITY, "row 0, column 1 is not a finite number (NaN, infinite, or out of f32 range)"));
        assert_eq!(check(vec![vec![1.0, 2.0, 3.0]]).unwrap(), Batch { rows: 1, features: 3, values: vec![1.0, 2.0, 3.0] });
    }
}
