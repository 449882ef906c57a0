//! The route table: every (method, path) rankgate's API serves, as data the router is built from.
//!
//! axum's `Router` cannot list its routes, so a test of "every route is documented" needs the routes
//! somewhere else; a second hand-written list would drift. Each route group is instead a `const` slice of
//! [`Endpoint`]s, and [`router_of`] is the only way a group becomes a `Router`: the method of an entry is
//! both what the router matches and what the application reports as its endpoints, so the OpenAPI test
//! (`tests/api/ops.rs`) reads exactly what is served.
//!
//! Not in the table: the `[[gate]]` reverse-proxy paths (the operator's own paths, any method, configured
//! at start) and the JSON 404 fallback.

use axum::http::Method;
use axum::routing::{MethodFilter, MethodRouter};
use axum::Router;

/// One route: a method on a path, and the handler serving it.
pub struct Endpoint<S> {
    /// The HTTP method (a GET route answers HEAD too, as axum's `get` does).
    pub method: Method,
    /// The path in axum's syntax (`{param}` segments).
    pub path: &'static str,
    /// The handler, bound to the method filter [`router_of`] derives from `method`, so the method is
    /// written once: `|method| on(method, handler)`.
    handler: fn(MethodFilter) -> MethodRouter<S>,
}

impl<S> Endpoint<S> {
    /// `handler` serving `method` on `path`.
    pub const fn new(
        method: Method,
        path: &'static str,
        handler: fn(MethodFilter) -> MethodRouter<S>,
    ) -> Self {
        Endpoint {
            method,
            path,
            handler,
        }
    }
}

/// The router serving `endpoints`; methods given for one path are merged into one route.
pub fn router_of<S>(endpoints: &[Endpoint<S>]) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    endpoints.iter().fold(Router::new(), |router, endpoint| {
        let filter = MethodFilter::try_from(endpoint.method.clone())
            .unwrap_or_else(|_| panic!("{} {}: not a routable method", endpoint.method, endpoint.path));
        router.route(endpoint.path, (endpoint.handler)(filter))
    })
}

/// The (method, path) pairs of `endpoints`, for the documentation check.
pub fn methods_and_paths<S>(endpoints: &[Endpoint<S>]) -> impl Iterator<Item = (Method, &'static str)> + '_ {
    endpoints
        .iter()
        .map(|endpoint| (endpoint.method.clone(), endpoint.path))
}
