//! The one error type every HTTP handler returns.
//!
//! Every error response has the same shape, `{"error": "<message>"}`, and a message that says what to do
//! next. Internal errors are logged with their full chain and answered with a generic message, so no
//! internals (paths, SQL, secrets) ever reach a client.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

/// An error answered over HTTP.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400: a parameter or body field is invalid. The message names it.
    #[error("{0}")]
    BadRequest(String),
    /// 401: missing or wrong credentials (bearer key, entry token).
    #[error("{0}")]
    Unauthorized(String),
    /// 403: the caller may not do this from where it is (admin endpoints without admin keys, from a
    /// peer that is not loopback).
    #[error("{0}")]
    Forbidden(String),
    /// 431: the request head is longer than the server reads.
    #[error("{0}")]
    HeadTooLarge(String),
    /// 404: the thing asked for does not exist.
    #[error("{0}")]
    NotFound(String),
    /// 409: the request conflicts with the current state (e.g. a token already claimed).
    #[error("{0}")]
    Conflict(String),
    /// 408: the request did not arrive in time (its body, past `http_body_timeout_millis`).
    #[error("{0}")]
    RequestTimeout(String),
    /// 413: the body or batch is too large.
    #[error("{0}")]
    PayloadTooLarge(String),
    /// 415: the content type is not one we accept.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// 429: slow down; `retry_after_secs` goes into `Retry-After`, `headers` carries the RateLimit headers.
    #[error("{message}")]
    TooManyRequests {
        /// Human-readable message.
        message: String,
        /// Seconds the client should wait.
        retry_after_secs: u64,
        /// Extra headers, e.g. `RateLimit-Policy` and `RateLimit`.
        headers: Vec<(&'static str, String)>,
    },
    /// 503: a store we depend on is unreachable (fail-closed) or we are not ready yet.
    #[error("{0}")]
    Unavailable(String),
    /// An entry refused before it made a member (428, 429): the body names the `reason` and may carry
    /// what the client needs next (a fresh challenge).
    #[error("{}", .0.message)]
    Refused(Box<Refusal>),
    /// 500: a bug or an unexpected failure. Logged in full, answered generically.
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

impl ApiError {
    /// Shorthand for a 400 naming `field`.
    pub fn bad_field(field: &str, message: impl std::fmt::Display) -> Self {
        ApiError::BadRequest(format!("{field}: {message}"))
    }

    fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::HeadTooLarge(_) => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::TooManyRequests { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Refused(refusal) => refusal.status,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let message = match &self {
            ApiError::Internal(error) => {
                tracing::error!(error = format!("{error:#}"), "internal error");
                "internal error; the server log has the details".to_string()
            }
            other => other.to_string(),
        };
        if let ApiError::Refused(refusal) = self {
            return refusal.into_response();
        }
        let mut response = json_error(status, &message);
        if let ApiError::TooManyRequests {
            retry_after_secs,
            headers,
            ..
        } = &self
        {
            let map = response.headers_mut();
            map.insert(header::RETRY_AFTER, HeaderValue::from(*retry_after_secs));
            for (name, value) in headers {
                if let Ok(value) = HeaderValue::from_str(value) {
                    map.insert(*name, value);
                }
            }
        }
        if let ApiError::Unavailable(_) = &self {
            // A store that is down (or restarting empty) is usually back within seconds: clients and
            // load balancers retry after this rather than at once (SPEC 2.2, issue 29).
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from(UNAVAILABLE_RETRY_AFTER_SECONDS),
            );
        }
        if let ApiError::Unauthorized(_) = &self {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// An entry refused before it made a member: `{"error", "reason", …extra}` with its status and an
/// optional `Retry-After`.
#[derive(Debug)]
pub struct Refusal {
    /// 428 (a challenge to solve) or 429 (a budget spent).
    pub status: StatusCode,
    /// What was wrong, naming the field or key, and what to do next.
    pub message: String,
    /// The refusal's reason label.
    pub reason: &'static str,
    /// Seconds before trying again makes sense.
    pub retry_after_secs: Option<u64>,
    /// More fields of the body, e.g. `"challenge": {…}`.
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let mut body = serde_json::Map::new();
        body.insert("error".into(), self.message.into());
        body.insert("reason".into(), self.reason.into());
        body.extend(self.extra);
        let mut response = (self.status, Json(serde_json::Value::Object(body))).into_response();
        if let Some(seconds) = self.retry_after_secs {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

/// `Retry-After` of every 503 answer.
pub const UNAVAILABLE_RETRY_AFTER_SECONDS: u64 = 2;

/// The body of every error answer.
#[derive(Debug, serde::Serialize)]
pub struct ErrorBody<'a> {
    /// What was wrong, naming the field, and what to do next.
    pub error: &'a str,
}

/// An error answer in the one shape, `{"error": message}`.
pub fn json_error(status: StatusCode, message: &str) -> Response {
    (status, Json(ErrorBody { error: message })).into_response()
}

/// Marks an answer that must reach the client as it is, even an error that is not JSON: the gate's
/// upstream answers (SPEC 2.4 passes them back unchanged).
#[derive(Debug, Clone, Copy)]
pub struct PassThrough;

/// The result type of every handler.
pub type ApiResult<T> = Result<T, ApiError>;
