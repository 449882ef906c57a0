//! Answers written whole, for the routes that more than one path serves: the router's handler, the
//! edge's direct path ([`crate::http::edge::Edge`]) and the fast lane ([`crate::http::fast_path`]), which skip the
//! router's and hyper's per-request work on the hottest requests (the rank read, a member's position
//! poll). Every path writes exactly a route's [`DirectReply`], so a header added to it (`Cache-Control`,
//! `ETag`, `RateLimit`, …) reaches every one of them.

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::http::error::ApiError;

/// An answer: status, headers (but `content-length` and `date`, which whoever writes the answer adds)
/// and body.
pub struct DirectReply {
    /// 200, or the error's status.
    pub status: StatusCode,
    /// In the order they are written.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The JSON body.
    pub body: Bytes,
}

impl DirectReply {
    /// A `200` with a JSON body and `headers` after its `content-type`, as axum's `Json` writes it.
    pub fn json(body: Bytes, headers: impl IntoIterator<Item = (HeaderName, HeaderValue)>) -> DirectReply {
        // Room for the content type and the few headers a route adds (a poll's two rate-limit headers),
        // so the vector is allocated once, not grown (~300 instructions of a poll).
        let mut all = Vec::with_capacity(4);
        all.push((
            header::CONTENT_TYPE,
            const { HeaderValue::from_static("application/json") },
        ));
        all.extend(headers);
        DirectReply {
            status: StatusCode::OK,
            headers: all,
            body,
        }
    }

    /// The error's answer, exactly as the router gives it.
    pub async fn error(error: ApiError) -> DirectReply {
        let (parts, body) = error.into_response().into_parts();
        DirectReply {
            status: parts.status,
            headers: parts
                .headers
                .into_iter()
                .filter_map(|(name, value)| Some((name?, value)))
                .collect(),
            // An error body is a short JSON object held in memory: collecting it cannot fail.
            body: axum::body::to_bytes(body, usize::MAX).await.unwrap_or_default(),
        }
    }
}

impl IntoResponse for DirectReply {
    fn into_response(self) -> Response {
        let length = HeaderValue::from(self.body.len());
        let mut response = Response::new(Body::from(self.body));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        for (name, value) in self.headers {
            headers.append(name, value);
        }
        // A 304 has no body and says nothing about the length of the one it stands for.
        if self.status != StatusCode::NOT_MODIFIED {
            headers.insert(header::CONTENT_LENGTH, length);
        }
        response
    }
}

/// A path segment a direct (router-free) path may take as the router's `Path` extractor would give it:
/// not empty, no `/`, no percent-escape (those the router decodes). A byte scan: `contains` with a char
/// pattern cost a few hundred instructions of every fast-lane request.
pub fn plain_segment(segment: &str) -> bool {
    !segment.is_empty() && !segment.bytes().any(|byte| byte == b'/' || byte == b'%')
}
