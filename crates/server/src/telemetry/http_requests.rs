//! `rankgate_http_requests_total{route,method,status}` and `rankgate_http_request_duration_seconds{route}`.
//!
//! The route label is the route's template (`/v1/queues/{queue}/entries`), never the raw path, so the
//! number of series is bounded by the route table: a path no route serves is [`UNMATCHED`]. The router
//! names the template ([`TagRouteLayer`], a layer in `app::router`, copies axum's `MatchedPath` onto the
//! answer), and the [`Edge`](crate::http::edge::Edge) records each answer once it is final (a body
//! deadline may still turn it into a 408). The requests the fast path answers without the router are
//! recorded there, by the template their [`DirectRoutes`](crate::http::fast_path::DirectRoutes) name.
//!
//! # Why handles are cached
//! Looking a labelled series up through the `metrics` macros builds its key (a label vector) and hashes
//! it on every request: a few hundred nanoseconds, a noticeable share of a rank read answered in a few
//! microseconds. [`HttpRequests`] keeps the handles instead. The exporter drops series idle for
//! [`SERIES_IDLE_TIMEOUT`], after which a kept handle would count into a series nobody renders, so a
//! handle is looked up again once it is older than half that timeout: a handle is always updated when
//! it is (re)resolved, so a series is never idle for the timeout while its handle is in use.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use axum::extract::{MatchedPath, Request};
use axum::http::{Method, StatusCode};
use axum::response::Response;
use metrics::{Counter, Histogram};
use parking_lot::RwLock;

use crate::waiting_room::SERIES_IDLE_TIMEOUT;

/// The route label of a request no route serves.
pub const UNMATCHED: &str = "unmatched";
/// The route label of a connection refused past `max_connections` (answered before any routing).
pub const CONNECTION_LIMIT: &str = "connection_limit";

/// A handle older than this is looked up again (module docs).
const RESOLVE_AGAIN_AFTER: Duration = Duration::from_secs(SERIES_IDLE_TIMEOUT.as_secs() / 2);

/// The route an answer was routed by, put on the response by [`TagRouteLayer`] (or by whoever answers
/// without routing). An answer without one is [`UNMATCHED`].
#[derive(Clone, Debug)]
pub enum RouteTemplate {
    /// The template the router matched.
    Matched(MatchedPath),
    /// A fixed label.
    Fixed(&'static str),
}

impl RouteTemplate {
    /// The label.
    pub fn as_str(&self) -> &str {
        match self {
            RouteTemplate::Matched(path) => path.as_str(),
            RouteTemplate::Fixed(label) => label,
        }
    }
}

/// Router layer: copies the matched route template onto the answer, for the edge to record. Written out
/// rather than `middleware::from_fn`, which boxes a future and clones the route per request.
#[derive(Clone, Copy, Debug, Default)]
pub struct TagRouteLayer;

impl<S> tower::Layer<S> for TagRouteLayer {
    type Service = TagRoute<S>;

    fn layer(&self, inner: S) -> TagRoute<S> {
        TagRoute { inner }
    }
}

/// The service [`TagRouteLayer`] wraps a route in.
#[derive(Clone, Debug)]
pub struct TagRoute<S> {
    inner: S,
}

impl<S> tower::Service<Request> for TagRoute<S>
where
    S: tower::Service<Request, Response = Response>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = TaggedAnswer<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let matched = request.extensions().get::<MatchedPath>().cloned();
        TaggedAnswer {
            inner: self.inner.call(request),
            matched,
        }
    }
}

pin_project_lite::pin_project! {
    /// A route's answer, tagged with its template when it is ready.
    pub struct TaggedAnswer<F> {
        #[pin]
        inner: F,
        matched: Option<MatchedPath>,
    }
}

impl<F, E> Future for TaggedAnswer<F>
where
    F: Future<Output = Result<Response, E>>,
{
    type Output = Result<Response, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut response = ready!(this.inner.poll(cx))?;
        if let Some(matched) = this.matched.take() {
            response.extensions_mut().insert(RouteTemplate::Matched(matched));
        }
        Poll::Ready(Ok(response))
    }
}

/// The method label: the standard methods by name, any other as `other` (a client may send any token).
pub fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::OPTIONS => "OPTIONS",
        Method::TRACE => "TRACE",
        Method::CONNECT => "CONNECT",
        _ => "other",
    }
}

/// A handle and when it was looked up.
struct Resolved<T> {
    handle: T,
    at: Instant,
}

impl<T> Resolved<T> {
    fn fresh(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.at) < RESOLVE_AGAIN_AFTER
    }
}

/// One route's series.
struct RouteSeries {
    duration: Resolved<Histogram>,
    /// By (method, status): a route sees a handful.
    answers: Vec<(&'static str, u16, Resolved<Counter>)>,
}

/// The cached handles of every route seen (module docs).
#[derive(Default)]
pub struct HttpRequests {
    routes: RwLock<HashMap<Box<str>, RouteSeries>>,
}

impl HttpRequests {
    /// The process's one set (handles belong to the process-wide recorder).
    pub fn global() -> &'static HttpRequests {
        static REQUESTS: OnceLock<HttpRequests> = OnceLock::new();
        REQUESTS.get_or_init(HttpRequests::default)
    }

    /// Records one answer: `route` (a template or a fixed label), `method` (from [`method_label`]),
    /// its status, and the time from the request's head (`started`) to now.
    pub fn record(&self, route: &str, method: &'static str, status: StatusCode, started: Instant) {
        self.record_at(route, method, status, started, Instant::now());
    }

    /// [`HttpRequests::record`] of an answer given at `now`.
    fn record_at(
        &self,
        route: &str,
        method: &'static str,
        status: StatusCode,
        started: Instant,
        now: Instant,
    ) {
        let seconds = now.saturating_duration_since(started).as_secs_f64();
        let status = status.as_u16();
        {
            let routes = self.routes.read();
            if let Some(series) = routes.get(route) {
                let answer = series
                    .answers
                    .iter()
                    .find(|(m, s, _)| *m == method && *s == status);
                if let Some((_, _, counter)) = answer {
                    if series.duration.fresh(now) && counter.fresh(now) {
                        counter.handle.increment(1);
                        series.duration.handle.record(seconds);
                        return;
                    }
                }
            }
        }
        self.record_resolving(route, method, status, seconds, now);
    }

    /// The slow path of [`HttpRequests::record`]: a series not seen yet, or a handle to look up again.
    fn record_resolving(&self, route: &str, method: &'static str, status: u16, seconds: f64, now: Instant) {
        let mut routes = self.routes.write();
        let series = routes.entry(route.into()).or_insert_with(|| RouteSeries {
            duration: Resolved {
                handle: duration_histogram(route),
                at: now,
            },
            answers: Vec::new(),
        });
        if !series.duration.fresh(now) {
            series.duration = Resolved {
                handle: duration_histogram(route),
                at: now,
            };
        }
        let position = series
            .answers
            .iter()
            .position(|(m, s, _)| *m == method && *s == status);
        let position = match position {
            Some(position) => position,
            None => {
                series.answers.push((
                    method,
                    status,
                    Resolved {
                        handle: requests_counter(route, method, status),
                        at: now,
                    },
                ));
                series.answers.len() - 1
            }
        };
        let counter = &mut series.answers[position].2;
        if !counter.fresh(now) {
            *counter = Resolved {
                handle: requests_counter(route, method, status),
                at: now,
            };
        }
        counter.handle.increment(1);
        series.duration.handle.record(seconds);
    }
}

fn duration_histogram(route: &str) -> Histogram {
    metrics::histogram!("rankgate_http_request_duration_seconds", "route" => route.to_string())
}

fn requests_counter(route: &str, method: &'static str, status: u16) -> Counter {
    metrics::counter!(
        "rankgate_http_requests_total",
        "route" => route.to_string(),
        "method" => method,
        "status" => status.to_string()
    )
}

/// Records an answer the edge or the fast path gave: see [`HttpRequests::record`].
pub fn record(route: &str, method: &'static str, status: StatusCode, started: Instant) {
    HttpRequests::global().record(route, method, status, started);
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics_exporter_prometheus::PrometheusBuilder;

    fn resolved_at(requests: &HttpRequests, route: &str) -> (Instant, Instant) {
        let routes = requests.routes.read();
        let series = &routes[route];
        (series.duration.at, series.answers[0].2.at)
    }

    /// The handles are kept while fresh and looked up again past half the exporter's idle timeout (so a
    /// series the exporter dropped is registered anew), and every answer is counted either way.
    #[test]
    fn handles_are_kept_while_fresh_and_looked_up_again_when_old() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let requests = HttpRequests::default();
        let route = "/v1/products/{product_id}/rank";
        let start = Instant::now();
        metrics::with_local_recorder(&recorder, || {
            requests.record_at(route, "GET", StatusCode::OK, start, start);
            requests.record_at(
                route,
                "GET",
                StatusCode::OK,
                start,
                start + Duration::from_secs(60),
            );
            assert_eq!(
                resolved_at(&requests, route),
                (start, start),
                "fresh handles are kept"
            );
            let later = start + RESOLVE_AGAIN_AFTER + Duration::from_secs(1);
            requests.record_at(route, "GET", StatusCode::OK, later, later);
            assert_eq!(
                resolved_at(&requests, route),
                (later, later),
                "old handles are looked up again"
            );
            requests.record_at(route, "GET", StatusCode::NOT_MODIFIED, later, later);
        });
        let text = handle.render();
        let count = |status: &str| {
            let prefix = format!(
                "rankgate_http_requests_total{{route=\"{route}\",method=\"GET\",status=\"{status}\"}} "
            );
            text.lines()
                .find_map(|line| line.strip_prefix(&prefix))
                .unwrap_or_else(|| panic!("no {prefix} in {text}"))
                .to_string()
        };
        assert_eq!(count("200"), "3");
        assert_eq!(count("304"), "1");
        assert!(
            text.contains(&format!(
                "rankgate_http_request_duration_seconds_count{{route=\"{route}\"}} 4"
            )),
            "{text}"
        );
    }
}
