//! The HTTP edge: what stands between a client's socket and the router (issue 9, defects 6 and 13).
//!
//! - **Connections** are accepted under `max_connections`. Past it, a new connection waits briefly
//!   ([`OVERFLOW_WAIT`]) for a slot and is otherwise answered `503` JSON; far past it (more than
//!   [`OVERFLOW_CONNECTIONS`] already waiting) it is closed at once, so a flood costs no more than that.
//! - **Headers** must arrive within `http_header_timeout_millis` (hyper's header-read timeout), else the
//!   connection is closed. hyper starts that clock whenever it waits for a request head, so it is also
//!   how long an idle keep-alive connection is kept.
//! - **Bodies** must arrive in full within `http_body_timeout_millis` of their headers, else `408` JSON.
//!   The deadline covers reading the request only, never writing the response, so long answers (a
//!   stream, a slow gated order) are not cut.
//! - **Every error is JSON.** axum's extractor rejections (a body over the limit, a bad percent-escape in
//!   a path, a wrong content type) and the router's own `405` are plain text or empty; the [`Edge`] service
//!   rewrites any error answer that is not JSON into the one [`ApiError`] shape, keeping its status and
//!   headers (`Allow`, `Retry-After`). Unknown routes get a JSON `404` from the router's fallback. Only
//!   answers marked [`PassThrough`] (the gate's upstream answers) reach the client as they are.
//! - **The hottest reads go direct.** `GET /v1/products/{productId}/rank` is the hottest read (issue
//!   10: as fast as Redis's `ZREVRANK`), and the router's share of it — route lookup, the
//!   path-parameter map in the request's extensions, the extractors, three boxed futures — cost more
//!   than the read itself. A bodiless `GET` that the [`DirectRoutes`] recognise (plain path segments
//!   only) is answered by the route's own code without the router, `If-None-Match` included; any other
//!   request to such a path (another method, `HEAD`, an escape, a body) goes through the router as
//!   before, so answers are the same either way.
//! - **Every answer is counted** (`rankgate_http_requests_total`, by route template, method and status,
//!   and its latency), here once it is final, or by the fast path for the answers it gives: see
//!   [`crate::telemetry::http_requests`].
//! - **Connections start in the [`fast_path`]**, which answers the requests the routes recognise ahead
//!   of hyper and hands the socket (and the bytes it read) to hyper at the first other request;
//!   connections past the limit and a traced router (DEBUG `tower_http::trace`) skip the lane and the
//!   direct path.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{ConnectInfo, Request};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

use super::entity_tag::IfNoneMatch;
use super::error::{json_error, ApiError, PassThrough};
use super::fast_path::{self, DirectHeaders, DirectMethod, DirectRequest, DirectRoutes, LaneLimits};
use crate::telemetry::http_requests::{self, RouteTemplate};

/// How long a connection past `max_connections` waits for a slot before it is answered 503.
pub const OVERFLOW_WAIT: Duration = Duration::from_millis(100);
/// Connections past `max_connections` that may wait (or be answered 503) at once; more are closed.
pub const OVERFLOW_CONNECTIONS: usize = 256;
/// How long shutdown waits for requests in flight before it drops their connections.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// The bounds the listener enforces.
#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    /// A request head must arrive within this (also the keep-alive idle timeout).
    pub header_timeout: Duration,
    /// A request body must arrive in full within this of its head.
    pub body_timeout: Duration,
    /// Connections served at once.
    pub max_connections: usize,
}

/// Serves `router` (the [`Edge`] around the app's router) on `listener` under `limits` until `shutdown`
/// is cancelled, then lets requests in flight finish (at most [`SHUTDOWN_GRACE`]).
pub async fn serve_until_stopped<R: DirectRoutes>(
    listener: TcpListener,
    router: Edge<R>,
    limits: HttpLimits,
    shutdown: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let overflow = Arc::new(Semaphore::new(OVERFLOW_CONNECTIONS));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let refusal = Edge::<R>::new(
        refusal_router(limits.max_connections),
        limits.body_timeout,
        usize::MAX,
    );
    let graceful = GracefulShutdown::new();
    loop {
        let (stream, peer) = tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    wait_after_accept_error(&error).await;
                    continue;
                }
            },
        };
        if let Ok(slot) = Arc::clone(&slots).try_acquire_owned() {
            let lane = router.direct.as_ref().map(|routes| Lane {
                routes: Arc::clone(routes),
                limits: LaneLimits {
                    header_timeout: limits.header_timeout,
                    max_body_bytes: router.max_body_bytes,
                },
                shutdown: shutdown.clone(),
            });
            spawn_connection(
                &http,
                graceful.watcher(),
                (stream, peer),
                router.clone(),
                slot,
                lane,
            );
            continue;
        }
        let Ok(waiting) = Arc::clone(&overflow).try_acquire_owned() else {
            // Far past the limit: closing costs nothing, answering would cost a task per connection.
            drop(stream);
            continue;
        };
        let (slots, http, watcher) = (Arc::clone(&slots), http.clone(), graceful.watcher());
        let (router, refusal) = (router.clone(), refusal.clone());
        tokio::spawn(async move {
            match tokio::time::timeout(OVERFLOW_WAIT, slots.acquire_owned()).await {
                Ok(Ok(slot)) => {
                    drop(waiting);
                    spawn_connection(&http, watcher, (stream, peer), router, slot, None);
                }
                _ => {
                    let mut http = http;
                    http.keep_alive(false);
                    spawn_connection(&http, watcher, (stream, peer), refusal, waiting, None);
                }
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            grace_secs = SHUTDOWN_GRACE.as_secs(),
            "requests still in flight after the shutdown grace; dropping their connections"
        );
    }
}

/// What a connection's [`fast_path`] lane needs.
struct Lane<R> {
    routes: Arc<R>,
    limits: LaneLimits,
    shutdown: CancellationToken,
}

/// Serves one connection on a task of its own; `permit` is held until the connection ends. With a
/// `lane`, the connection starts in the [`fast_path`] and goes to hyper at its first other request.
/// Every request hyper reads carries the peer's address as axum's [`ConnectInfo`] (the admin guard
/// admits only loopback peers while no admin key is set).
fn spawn_connection<R: DirectRoutes>(
    http: &hyper::server::conn::http1::Builder,
    watcher: Watcher,
    (stream, peer): (TcpStream, SocketAddr),
    router: Edge<R>,
    permit: OwnedSemaphorePermit,
    lane: Option<Lane<R>>,
) {
    let http = http.clone();
    tokio::spawn(async move {
        // The watcher is held through the lane too: graceful shutdown waits for the lane's answer.
        let io = match lane {
            None => fast_path::Prefixed::new(Bytes::new(), stream),
            Some(lane) => {
                match fast_path::serve(
                    stream,
                    Some(peer.ip()),
                    lane.routes.as_ref(),
                    &lane.limits,
                    &lane.shutdown,
                )
                .await
                {
                    fast_path::LaneEnd::Closed => return drop(permit),
                    fast_path::LaneEnd::ToHyper(io) => io,
                }
            }
        };
        let service = TowerToHyperService::new(router.map_request(
            move |request: Request<hyper::body::Incoming>| {
                let mut request = request.map(Body::new);
                request.extensions_mut().insert(ConnectInfo(peer));
                request
            },
        ));
        // Errors here are the client's (reset, header timeout, malformed request): nothing to report.
        let _ = watcher
            .watch(http.serve_connection(TokioIo::new(io), service))
            .await;
        drop(permit);
    });
}

/// The router connections past the limit get: one 503 JSON answer, then the connection closes.
fn refusal_router(max_connections: usize) -> Router {
    Router::new().fallback(move || async move {
        let mut response = ApiError::Unavailable(format!(
            "the server is serving its limit of {max_connections} connections (max_connections); \
             retry in a moment"
        ))
        .into_response();
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        response
            .extensions_mut()
            .insert(RouteTemplate::Fixed(http_requests::CONNECTION_LIMIT));
        response
    })
}

/// After a failed accept: a per-connection error (the peer gave up) needs no pause; running out of file
/// descriptors does, or the loop would spin.
async fn wait_after_accept_error(error: &std::io::Error) {
    use std::io::ErrorKind;
    if matches!(
        error.kind(),
        ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset | ErrorKind::ConnectionRefused
    ) {
        return;
    }
    tracing::warn!(error = %error, "accepting a connection failed; pausing accepts for a second");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// The edge around the router as one service: the body deadline, then the router, then the JSON error
/// shape. Written out rather than as two `middleware::from_fn` layers under a wrapping `Router`: those
/// cost four allocations and a second route lookup per request, 0.8 µs of the 6.3 µs an empty handler
/// costs (bench/results/2026-12-01-issues10-14.md, "Issue 10").
pub struct Edge<R> {
    router: Router,
    body_timeout: Duration,
    max_body_bytes: usize,
    /// The routes answered without the router (module docs); `None`: all go through it.
    direct: Option<Arc<R>>,
}

impl<R> Clone for Edge<R> {
    fn clone(&self) -> Self {
        Edge {
            router: self.router.clone(),
            body_timeout: self.body_timeout,
            max_body_bytes: self.max_body_bytes,
            direct: self.direct.clone(),
        }
    }
}

impl<R: DirectRoutes> Edge<R> {
    /// Wraps `router`: bodies must arrive within `body_timeout`; `max_body_bytes` words the 413.
    pub fn new(router: Router, body_timeout: Duration, max_body_bytes: usize) -> Edge<R> {
        Edge {
            router,
            body_timeout,
            max_body_bytes,
            direct: None,
        }
    }

    /// Answers the requests `routes` recognise directly, as `router`'s routes would (module docs); also
    /// starts each connection in the fast path. Only for a router that serves those routes with the
    /// same code, with no layer around them.
    pub fn with_direct_routes(mut self, routes: R) -> Edge<R> {
        self.direct = Some(Arc::new(routes));
        self
    }

    async fn answer(self, request: Request) -> Response {
        let started = Instant::now();
        if let Some(routes) = &self.direct {
            if request.method() == Method::GET && request.body().is_end_stream() {
                let path = request.uri().path();
                if let Some(target) = routes.recognise(DirectMethod::Get, path) {
                    let if_none_match = IfNoneMatch::of(request.headers());
                    let direct = DirectRequest {
                        path,
                        query: request.uri().query(),
                        body: Bytes::new(),
                        if_none_match: &if_none_match,
                        headers: DirectHeaders::Map(request.headers()),
                        peer: crate::http::peer::PeerAddress::of_extensions(request.extensions()).0,
                    };
                    let route = routes.route_template(&target);
                    let response = routes.answer(target, direct).await.into_response();
                    http_requests::record(route, "GET", response.status(), started);
                    return response;
                }
            }
        }
        let method = request.method().clone();
        let (request, expired) = with_body_deadline(request, self.body_timeout);
        let response = match self.router.oneshot(request).await {
            Ok(response) => response,
            Err(never) => match never {},
        };
        let response = match expired {
            Some(expired) if expired.load(Ordering::Acquire) => body_timeout_answer(self.body_timeout),
            _ => response,
        };
        let mut response = errors_as_json(&method, self.max_body_bytes, response).await;
        // A body refused before it was read in full (too large, too slow) leaves the rest of it on the
        // connection, which then cannot carry another request: say so, so no client reuses it (hyper
        // closes it after the answer either way).
        if matches!(
            response.status(),
            StatusCode::PAYLOAD_TOO_LARGE | StatusCode::REQUEST_TIMEOUT
        ) {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        // Recorded once the answer is final (a 408 above replaces the handler's), by the template the
        // router tagged it with; a path no route serves is `unmatched`, never the raw path.
        let route = response
            .extensions()
            .get::<RouteTemplate>()
            .map_or(http_requests::UNMATCHED, RouteTemplate::as_str);
        http_requests::record(
            route,
            http_requests::method_label(&method),
            response.status(),
            started,
        );
        response
    }
}

impl<R: DirectRoutes> tower::Service<Request> for Edge<R> {
    type Response = Response;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, std::convert::Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The router is always ready (`Router::poll_ready`); `answer` still drives it through `oneshot`.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let edge = self.clone();
        Box::pin(async move { Ok(edge.answer(request).await) })
    }
}

/// A request body must arrive in full within `deadline` of the request head; the flag tells the edge
/// that it did not (then the answer is 408, whatever the handler made of the failed read). Bodiless
/// requests (every read) pay nothing.
fn with_body_deadline(request: Request, deadline: Duration) -> (Request, Option<Arc<AtomicBool>>) {
    if request.body().is_end_stream() {
        return (request, None);
    }
    let expired = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&expired);
    let request = request.map(|body| {
        Body::new(DeadlineBody {
            inner: body,
            deadline: Box::pin(tokio::time::sleep(deadline)),
            expired: flag,
        })
    });
    (request, Some(expired))
}

/// The 408 for a body that missed its deadline; the connection closes after it.
fn body_timeout_answer(deadline: Duration) -> Response {
    let mut response = ApiError::RequestTimeout(format!(
        "body: not received within {} ms (http_body_timeout_millis); send the whole request at once",
        deadline.as_millis()
    ))
    .into_response();
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// A request body that fails once its deadline passes. The deadline is fixed when the head arrives,
/// not reset per chunk, so trickling a byte at a time does not keep a connection forever.
struct DeadlineBody {
    inner: Body,
    deadline: Pin<Box<tokio::time::Sleep>>,
    /// Tells the [`Edge`] to answer 408 whatever the handler made of the failed read.
    expired: Arc<AtomicBool>,
}

/// The error a [`DeadlineBody`] read returns.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive in time")]
struct BodyDeadlineExceeded;

impl HttpBody for DeadlineBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            this.expired.store(true, Ordering::Release);
            return Poll::Ready(Some(Err(axum::Error::new(BodyDeadlineExceeded))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Router fallback: an unknown route is a JSON 404.
pub async fn unknown_route(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError::NotFound(format!(
        "no route for {method} {}; the routes are listed in /openapi.json",
        uri.path()
    ))
}

/// Any error answer that is not JSON (an extractor rejection, the router's 405) becomes the one
/// `{"error": …}` shape with the same status and headers. `max_body_bytes` words the 413.
async fn errors_as_json(method: &Method, max_body_bytes: usize, response: Response) -> Response {
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error())
        || is_json(&response)
        || response.extensions().get::<PassThrough>().is_some()
    {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    // Rejection texts are one short line; more than this is not a rejection worth quoting.
    let text = axum::body::to_bytes(body, 4096)
        .await
        .map(|bytes| String::from_utf8_lossy(&bytes).trim().to_string())
        .unwrap_or_default();
    let message = match status {
        StatusCode::PAYLOAD_TOO_LARGE => format!(
            "body: larger than the {max_body_bytes}-byte limit (max_body_bytes); send it in smaller parts"
        ),
        StatusCode::METHOD_NOT_ALLOWED => {
            let allowed = parts
                .headers
                .get(header::ALLOW)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            format!("method: {method} is not allowed on this route; use {allowed}")
        }
        StatusCode::UNSUPPORTED_MEDIA_TYPE => format!("content-type: {text}"),
        _ if text.is_empty() => format!(
            "{}; see /openapi.json",
            status.canonical_reason().unwrap_or("request refused")
        ),
        _ => format!("{text}; see /openapi.json"),
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.remove(header::CONTENT_TYPE);
    let answer = json_error(status, &message);
    let (answer_parts, answer_body) = answer.into_parts();
    parts.headers.extend(answer_parts.headers);
    Response::from_parts(parts, answer_body)
}

fn is_json(response: &Response) -> bool {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            let essence = v.split(';').next().unwrap_or("").trim();
            essence == "application/json" || essence.ends_with("+json")
        })
}
