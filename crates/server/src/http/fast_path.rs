//! The HTTP/1.1 fast path: a connection's hottest requests answered without hyper (issues 10 and 13),
//! through the [`DirectRoutes`] the application composes from its products (the rank read, a member's
//! position poll and entry).
//!
//! With the router out of the way ([`crate::http::edge::Edge`]'s direct path), a warm rank read still spent
//! about half of its instructions in hyper's connection machinery (head parsing into a `HeaderMap` and a
//! `Uri`, the dispatcher, the service glue, the response encoder) — more than the read itself — and an
//! empty handler behind hyper already cost more CPU per request than Redis's whole `ZREVRANK`. So a
//! connection starts here: the lane reads request heads itself (httparse, as hyper does) and answers
//! the shapes its [`DirectRoutes`] recognise, then keeps the connection alive for the next request. A
//! waiting member's position poll is the waiting room's hottest request and had the same profile (an
//! empty handler behind hyper cost more than Redis's `ZRANK`), so it takes the lane too:
//!
//! - a bodiless `GET` the routes recognise (the rank read, the position poll), answered with the
//!   route's own code ([`DirectRoutes::answer`]), written in the bytes hyper would write (status line,
//!   the route's headers, `content-length`, `date`). Only over HTTP/1.1, with no header that changes the
//!   exchange (`content-length`, `transfer-encoding`, `connection` other than `keep-alive`, `expect`,
//!   `upgrade`, conditional and range headers); the routes accept only path segments needing no
//!   percent-decoding ([`plain_segment`](super::direct_reply::plain_segment)).
//! - a `POST` the routes recognise (an entry, the surge's one write per member), under the same
//!   conditions, except that its body is framed by one `content-length` of plain digits, no larger than
//!   `max_body_bytes`, and already read in full with the head: a body still on its way is hyper's to
//!   wait for, under the body timeout.
//!
//! **Anything else ends the lane**: the bytes read so far go to hyper together with the socket, so hyper
//! serves that request and every later one on the connection exactly as before (keep-alive, limits,
//! bodies, errors). Except a head hyper would refuse with an empty body (a control byte in a header, a
//! bad request line, a head past [`MAX_REQUEST_HEAD_BYTES`]): the lane refuses it itself, in JSON like
//! every other error (400 naming what is wrong, 431), and closes the connection as hyper would. (A
//! malformed head later on a connection hyper already serves still gets hyper's bare refusal.) Also kept: the header timeout (a head must arrive within `header_timeout` of the
//! previous answer, or of the connection's start; one timer per connection, re-armed only when it
//! fires), graceful shutdown (an idle connection closes when shutdown begins; one whose request is in
//! flight gets its answer first) and the connection slot, held by the caller.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use axum::http::StatusCode;
use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use super::direct_reply::DirectReply;
use super::entity_tag::IfNoneMatch;
use super::error::ApiError;
use crate::telemetry::http_requests;

/// The lane reads a head in reads of this size.
const MAX_HEAD_BYTES: usize = 8 * 1024;
/// The longest request head the lane reads: past it the lane answers 431 JSON. (A connection hyper
/// already serves keeps hyper's own limit, about 400 KiB, for its later heads.)
pub const MAX_REQUEST_HEAD_BYTES: usize = 64 * 1024;
/// Headers the lane parses; a request with more is hyper's.
const MAX_HEADERS: usize = 32;
/// Request headers that change what the exchange is (a body, the connection's fate, an upgrade, a
/// conditional or partial answer): a request with any of them is hyper's and the router's to answer.
const HYPERS_HEADERS: [&str; 10] = [
    "content-length",
    "transfer-encoding",
    "expect",
    "upgrade",
    "if-none-match",
    "if-match",
    "if-modified-since",
    "if-unmodified-since",
    "if-range",
    "range",
];

/// The method of a request the fast path may answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirectMethod {
    /// A bodiless `GET`.
    Get,
    /// A `POST` whose body came whole with its head.
    Post,
}

impl DirectMethod {
    /// The method's name, as the request metrics label it.
    pub fn label(self) -> &'static str {
        match self {
            DirectMethod::Get => "GET",
            DirectMethod::Post => "POST",
        }
    }
}

/// A request answered directly, as its route's handler would get it.
pub struct DirectRequest<'a> {
    /// The path as sent: the routes recognise only segments that need no percent-decoding.
    pub path: &'a str,
    /// The query string, if any.
    pub query: Option<&'a str>,
    /// A `POST`'s body (empty for a `GET`).
    pub body: Bytes,
    /// The request's `If-None-Match` values (none on the lane, which leaves conditional requests to
    /// hyper and the router).
    pub if_none_match: &'a IfNoneMatch,
    /// The request's headers, for the routes' own reading (a member's credential).
    pub headers: DirectHeaders<'a>,
    /// The connection's TCP peer, when known (a member's credential in gateway mode: a trusted proxy).
    pub peer: Option<std::net::IpAddr>,
}

/// Whether `token` (a header name as httparse accepted it: token characters only) is `lower`, a name of
/// lower-case letters and `-`, ignoring case. Eight bytes at a time with bit 5 set: for token characters
/// that maps exactly the upper-case letters onto their lower-case ones and changes neither a lower-case
/// letter nor `-` (no token character becomes one of them). `eq_ignore_ascii_case`'s byte loop spent
/// ~250 instructions of a poll finding its ticket, and the lane compares every header with a dozen names.
#[inline]
fn token_is(token: &[u8], lower: &[u8]) -> bool {
    let n = token.len();
    if n != lower.len() {
        return false;
    }
    let folded = |bytes: &[u8], at: usize| {
        u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes")) | 0x2020_2020_2020_2020
    };
    if n < 8 {
        return token.iter().zip(lower).all(|(a, b)| a | 0x20 == b | 0x20);
    }
    // Whole words, then the last eight bytes as one more word (overlapping the one before): no byte
    // loop for the tail.
    let mut at = 0;
    while at + 8 < n {
        if folded(token, at) != folded(lower, at) {
            return false;
        }
        at += 8;
    }
    folded(token, n - 8) == folded(lower, n - 8)
}

/// Where one header lies in the lane's head: byte offsets of its name and value (a head the lane
/// answers is shorter than 64 KiB).
#[derive(Debug, Clone, Copy, Default)]
pub struct HeaderSpan {
    name: (u16, u16),
    value: (u16, u16),
}

/// A direct request's headers, as whoever read the head holds them.
#[derive(Clone, Copy)]
pub enum DirectHeaders<'a> {
    /// The lane's: spans of the head it read.
    Lane {
        /// The head's bytes.
        head: &'a [u8],
        /// Where each header lies in it.
        spans: &'a [HeaderSpan],
    },
    /// hyper's.
    Map(&'a axum::http::HeaderMap),
}

impl<'a> DirectHeaders<'a> {
    /// The values of the headers called `name` (lower case), as sent.
    pub fn get_all_bytes(self, name: &'static str) -> impl Iterator<Item = &'a [u8]> + 'a {
        let (lane, map) = match self {
            DirectHeaders::Lane { head, spans } => {
                let slice = move |(start, end): (u16, u16)| &head[usize::from(start)..usize::from(end)];
                let values = spans
                    .iter()
                    .filter(move |span| token_is(slice(span.name), name.as_bytes()))
                    .map(move |span| slice(span.value));
                (Some(values), None)
            }
            DirectHeaders::Map(map) => (None, Some(map.get_all(name).iter().map(|value| value.as_bytes()))),
        };
        lane.into_iter().flatten().chain(map.into_iter().flatten())
    }

    /// The values of the headers called `name` (lower case) that are valid UTF-8.
    pub fn get_all_str(self, name: &'static str) -> impl Iterator<Item = &'a str> + 'a {
        self.get_all_bytes(name)
            .filter_map(|value| std::str::from_utf8(value).ok())
    }

    /// The first value of the header called `name` (lower case), as sent. A plain loop: every poll
    /// asks for its ticket.
    pub fn get_bytes(self, name: &'static str) -> Option<&'a [u8]> {
        match self {
            DirectHeaders::Lane { head, spans } => {
                let slice = |(start, end): (u16, u16)| &head[usize::from(start)..usize::from(end)];
                spans
                    .iter()
                    .find(|span| token_is(slice(span.name), name.as_bytes()))
                    .map(|span| slice(span.value))
            }
            DirectHeaders::Map(map) => map.get(name).map(|value| value.as_bytes()),
        }
    }
}

/// The routes the fast path answers itself, composed by the application from its products. Static
/// dispatch: the lane is generic over them, so recognising and answering cost what a `match` did.
pub trait DirectRoutes: Send + Sync + 'static {
    /// What a recognised path names (ranges of the path, see [`range_of`]), carried to
    /// [`DirectRoutes::answer`] so the path is split once.
    type Target: Send;

    /// The target of `method` on `path` when it is answered directly, else `None` (hyper and the router
    /// answer it). Cheap: every request on a lane connection asks it.
    fn recognise(&self, method: DirectMethod, path: &str) -> Option<Self::Target>;

    /// The route template `target` is served by in the router (`/v1/products/{product_id}/rank`): the
    /// label a directly answered request is counted under, as the router would count it.
    fn route_template(&self, target: &Self::Target) -> &'static str;

    /// The answer to a recognised request, exactly as its route's handler gives it.
    fn answer(
        &self,
        target: Self::Target,
        request: DirectRequest<'_>,
    ) -> impl std::future::Future<Output = DirectReply> + Send;
}

/// Where `part`, a slice of `whole`, lies in it: how a [`DirectRoutes::Target`] names a path segment
/// without borrowing the connection's buffer.
pub fn range_of(whole: &str, part: &str) -> std::ops::Range<usize> {
    let start = part.as_ptr() as usize - whole.as_ptr() as usize;
    debug_assert!(start + part.len() <= whole.len(), "part is a slice of whole");
    start..start + part.len()
}

/// How a connection left the lane.
pub enum LaneEnd {
    /// Closed: the client went away, the header timeout passed, or shutdown began while it was idle.
    Closed,
    /// A request the lane does not answer: hyper takes the connection from here, bytes read included.
    ToHyper(Prefixed),
}

/// What a connection's lane needs besides its routes.
#[derive(Clone)]
pub struct LaneLimits {
    /// A head must arrive within this of the previous answer (or of the connection's start).
    pub header_timeout: Duration,
    /// A `POST` body longer than this is the router's to refuse.
    pub max_body_bytes: usize,
}

/// Serves `stream`'s requests that `routes` recognise until it closes or sends anything else (module
/// docs); `peer` is the connection's peer address, handed to every request.
pub async fn serve<R: DirectRoutes>(
    mut stream: TcpStream,
    peer: Option<std::net::IpAddr>,
    routes: &R,
    limits: &LaneLimits,
    shutdown: &CancellationToken,
) -> LaneEnd {
    let header_timeout = limits.header_timeout;
    let mut buffer = BytesMut::with_capacity(4096);
    let mut out = Vec::with_capacity(1024);
    let mut date = DateCache::default();
    // When the connection began waiting for the head being read; the timer checks it when it fires, so
    // a request costs one clock read instead of a timer registration.
    let mut waiting_since = Instant::now();
    let timer = tokio::time::sleep(header_timeout);
    tokio::pin!(timer);
    let cancelled = shutdown.cancelled();
    tokio::pin!(cancelled);
    let no_conditions = IfNoneMatch::absent();
    loop {
        let head = loop {
            match parse_head(&buffer, limits.max_body_bytes, routes) {
                Head::Lane(head) => break head,
                Head::Partial if buffer.len() < MAX_REQUEST_HEAD_BYTES => {}
                Head::Partial => {
                    let error = ApiError::HeadTooLarge(format!(
                        "request head: longer than {MAX_REQUEST_HEAD_BYTES} bytes; send fewer or shorter \
                         headers (cookies included)"
                    ));
                    return refuse(stream, error, &mut out, &mut date).await;
                }
                Head::Malformed(what) => {
                    let error = ApiError::BadRequest(format!("request head: {what}"));
                    return refuse(stream, error, &mut out, &mut date).await;
                }
                Head::Other => return LaneEnd::ToHyper(Prefixed::new(buffer.freeze(), stream)),
            }
            // Room for a whole head (and an entry's body) in one read: with only the few bytes a
            // previous request left, a read would split a request the client wrote whole, and an
            // entry whose body is cut off goes to hyper.
            buffer.reserve(MAX_HEAD_BYTES);
            tokio::select! {
                biased;
                read = stream.read_buf(&mut buffer) => match read {
                    Ok(0) | Err(_) => return LaneEnd::Closed,
                    Ok(_) => {}
                },
                _ = &mut cancelled, if buffer.is_empty() => return LaneEnd::Closed,
                _ = &mut timer => {
                    let deadline = waiting_since + header_timeout;
                    if Instant::now() >= deadline {
                        return LaneEnd::Closed;
                    }
                    timer.as_mut().reset(deadline.into());
                }
            }
        };
        // The answer's time is counted from here, as hyper's requests are from their parsed head.
        let started = Instant::now();
        let head_bytes = buffer.split_to(head.len).freeze();
        let text = |range: &std::ops::Range<usize>| {
            std::str::from_utf8(&head_bytes[range.clone()]).expect("httparse checks the target")
        };
        let request = DirectRequest {
            path: text(&head.path),
            query: head.query.as_ref().map(text),
            body: head_bytes.slice(head.body.clone()),
            if_none_match: &no_conditions,
            headers: DirectHeaders::Lane {
                head: &head_bytes,
                spans: &head.headers[..head.header_count],
            },
            peer,
        };
        let (route, method) = (routes.route_template(&head.target), head.method);
        let reply = routes.answer(head.target, request).await;
        http_requests::record(route, method.label(), reply.status, started);
        out.clear();
        // Shutdown began while this request was in flight: it gets its answer, announced as the last.
        let last = shutdown.is_cancelled();
        write_reply(&mut out, &reply, date.now(), last);
        if stream.write_all(&out).await.is_err() {
            return LaneEnd::Closed;
        }
        waiting_since = Instant::now();
        if last {
            return LaneEnd::Closed;
        }
    }
}

/// Answers `error` in JSON as the connection's last answer and closes it (what hyper does, bodiless,
/// with a head it cannot parse).
async fn refuse(mut stream: TcpStream, error: ApiError, out: &mut Vec<u8>, date: &mut DateCache) -> LaneEnd {
    out.clear();
    write_reply(out, &DirectReply::error(error).await, date.now(), true);
    if stream.write_all(out).await.is_ok() {
        let _ = stream.shutdown().await;
    }
    LaneEnd::Closed
}

/// `reply` as hyper writes an answer: status line, the headers in order (lower-case names), then
/// `content-length` and `date`, then the body; the `last` answer on a connection says
/// `connection: close`, as hyper's does during a graceful shutdown.
fn write_reply(out: &mut Vec<u8>, reply: &DirectReply, date: &[u8], last: bool) {
    if reply.status == StatusCode::OK {
        out.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
    } else {
        out.extend_from_slice(b"HTTP/1.1 ");
        out.extend_from_slice(reply.status.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(reply.status.canonical_reason().unwrap_or("").as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    for (name, value) in &reply.headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if last {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"content-length: ");
    out.extend_from_slice(itoa::Buffer::new().format(reply.body.len()).as_bytes());
    out.extend_from_slice(b"\r\ndate: ");
    out.extend_from_slice(date);
    out.extend_from_slice(b"\r\n\r\n");
    out.extend_from_slice(&reply.body);
}

/// A complete head the lane answers: its length (body included), where its parts lie, and what the
/// routes made of its path.
struct LaneHead<T> {
    len: usize,
    path: std::ops::Range<usize>,
    query: Option<std::ops::Range<usize>>,
    /// Empty for a `GET`.
    body: std::ops::Range<usize>,
    /// The first `header_count` are the request's headers.
    headers: [HeaderSpan; MAX_HEADERS],
    header_count: usize,
    method: DirectMethod,
    target: T,
}

// The lane variant carries the header spans (a few hundred bytes) and lives on the stack for one parse:
// boxing it would allocate on every request the lane answers.
#[allow(clippy::large_enum_variant)]
enum Head<T> {
    /// A request the routes recognise, whole.
    Lane(LaneHead<T>),
    /// Not complete yet.
    Partial,
    /// Anything else: hyper's to answer.
    Other,
    /// Not an HTTP/1 request head (what is wrong with it): hyper would refuse it with an empty body.
    Malformed(&'static str),
}

/// What is wrong with a head httparse refused, for the client.
fn malformed(error: httparse::Error) -> &'static str {
    match error {
        httparse::Error::HeaderName => {
            "a header name holds a character a token may not (control, space, separator)"
        }
        httparse::Error::HeaderValue => "a header value holds a control character; send printable text only",
        httparse::Error::NewLine => "a line does not end in CRLF",
        httparse::Error::Token => "the request line's method is not a token",
        httparse::Error::Version => "the request line is not `METHOD /target HTTP/1.1`",
        _ => "it is not an HTTP/1.1 request head",
    }
}

/// What `buffer` starts with; a `POST` body may be at most `max_body_bytes` (past it the router's limit
/// answers).
fn parse_head<R: DirectRoutes>(buffer: &[u8], max_body_bytes: usize, routes: &R) -> Head<R::Target> {
    if buffer.is_empty() {
        return Head::Partial;
    }
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    let len = match request.parse(buffer) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Head::Partial,
        // More headers than the lane parses: hyper takes up to 100.
        Err(httparse::Error::TooManyHeaders) => return Head::Other,
        Err(error) => return Head::Malformed(malformed(error)),
    };
    let method = match (request.method, request.version) {
        (Some("GET"), Some(1)) => DirectMethod::Get,
        (Some("POST"), Some(1)) => DirectMethod::Post,
        _ => return Head::Other,
    };
    let Some(target) = request.path else {
        return Head::Other;
    };
    let (path, query) = match target.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (target, None),
    };
    // A POST's body is framed by one plain `content-length`; every other header of HYPERS_HEADERS
    // (and a GET's body) is hyper's.
    let mut content_length = None;
    // A head past 64 KiB (which a read that overshot could complete) is hyper's: spans are 16-bit.
    if len > usize::from(u16::MAX) {
        return Head::Other;
    }
    let mut spans = [HeaderSpan::default(); MAX_HEADERS];
    let offset = |part: &[u8]| (part.as_ptr() as usize - buffer.as_ptr() as usize) as u16;
    for (span, header) in spans.iter_mut().zip(request.headers.iter()) {
        let (name, value) = (offset(header.name.as_bytes()), offset(header.value));
        *span = HeaderSpan {
            name: (name, name + header.name.len() as u16),
            value: (value, value + header.value.len() as u16),
        };
    }
    for header in request.headers.iter() {
        let name = header.name.as_bytes();
        if token_is(name, b"connection") {
            if !header.value.eq_ignore_ascii_case(b"keep-alive") {
                return Head::Other;
            }
        } else if method == DirectMethod::Post
            && content_length.is_none()
            && token_is(name, b"content-length")
        {
            match plain_length(header.value) {
                Some(length) => content_length = Some(length),
                None => return Head::Other,
            }
        } else if HYPERS_HEADERS
            .iter()
            .any(|hypers| token_is(name, hypers.as_bytes()))
        {
            return Head::Other;
        }
    }
    let Some(target) = routes.recognise(method, path) else {
        return Head::Other;
    };
    // Both are slices of `buffer`: their offsets locate them in the head the lane keeps.
    let range = |part: &str| {
        let start = part.as_ptr() as usize - buffer.as_ptr() as usize;
        start..start + part.len()
    };
    let body = match method {
        DirectMethod::Get => len..len,
        // A body past the limit is the router's to refuse, and one not yet read in full is hyper's to
        // wait for (under the body timeout, which the lane does not keep).
        DirectMethod::Post => match content_length {
            Some(length) if length <= max_body_bytes && buffer.len() - len >= length => len..len + length,
            _ => return Head::Other,
        },
    };
    Head::Lane(LaneHead {
        len: body.end,
        path: range(path),
        query: query.map(range),
        body,
        headers: spans,
        header_count: request.headers.len(),
        method,
        target,
    })
}

/// A `content-length` of ASCII digits only (hyper refuses anything else, so such a request is its to
/// answer), short enough that it cannot overflow.
fn plain_length(value: &[u8]) -> Option<usize> {
    if value.is_empty() || value.len() > 9 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse().ok()
}

/// The `date` header value, formatted once a second (as hyper caches it).
#[derive(Default)]
struct DateCache {
    second: u64,
    text: String,
}

impl DateCache {
    fn now(&mut self) -> &[u8] {
        let now = SystemTime::now();
        let second = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |since| since.as_secs());
        if second != self.second || self.text.is_empty() {
            self.second = second;
            self.text = httpdate::fmt_http_date(now);
        }
        self.text.as_bytes()
    }
}

/// A socket with bytes already read from it in front: what hyper serves after the lane.
pub struct Prefixed {
    prefix: Bytes,
    stream: TcpStream,
}

impl Prefixed {
    /// `stream`, whose next bytes are `prefix`.
    pub fn new(prefix: Bytes, stream: TcpStream) -> Prefixed {
        Prefixed { prefix, stream }
    }
}

impl AsyncRead for Prefixed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            let prefix = self.prefix.split_to(n);
            buf.put_slice(&prefix);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::direct_reply::plain_segment;

    /// Routes for the lane's own rules: `GET /get/{x}` and `POST /post/{x}`, each segment plain.
    struct TestRoutes;

    impl DirectRoutes for TestRoutes {
        type Target = std::ops::Range<usize>;

        fn recognise(&self, method: DirectMethod, path: &str) -> Option<Self::Target> {
            let segment = match method {
                DirectMethod::Get => path.strip_prefix("/get/")?,
                DirectMethod::Post => path.strip_prefix("/post/")?,
            };
            plain_segment(segment).then(|| range_of(path, segment))
        }

        fn route_template(&self, _: &Self::Target) -> &'static str {
            "/test/{x}"
        }

        async fn answer(&self, target: Self::Target, request: DirectRequest<'_>) -> DirectReply {
            DirectReply::json(Bytes::copy_from_slice(request.path[target].as_bytes()), [])
        }
    }

    fn parse(raw: &str) -> Head<std::ops::Range<usize>> {
        parse_head(raw.as_bytes(), 64, &TestRoutes)
    }

    /// The recognised segment, query and body of a lane request; `None` for one hyper answers.
    fn lane(raw: &str) -> Option<(String, Option<String>, String, usize)> {
        match parse(raw) {
            Head::Lane(head) => Some((
                raw[head.path][head.target].to_owned(),
                head.query.map(|q| raw[q].to_owned()),
                raw[head.body].to_owned(),
                head.len,
            )),
            _ => None,
        }
    }

    #[test]
    fn header_names_match_ignoring_case_only() {
        for same in [
            "x-queue-ticket",
            "X-Queue-Ticket",
            "X-QUEUE-TICKET",
            "x-QUEUE-ticket",
        ] {
            assert!(token_is(same.as_bytes(), b"x-queue-ticket"), "{same}");
        }
        for other in [
            "x-queue-tickets",
            "x-queue-ticke",
            "x_queue-ticket",
            "x-queue~ticket",
            "y-queue-ticket",
            "",
        ] {
            assert!(!token_is(other.as_bytes(), b"x-queue-ticket"), "{other}");
        }
        assert!(token_is(b"Cookie", b"cookie") && !token_is(b"Cookid", b"cookie"));
    }

    #[test]
    fn plain_gets_take_the_lane_with_their_query() {
        assert_eq!(
            lane("GET /get/p1?window=7d HTTP/1.1\r\nHost: x\r\n\r\n").map(|l| (l.0, l.1)),
            Some(("p1".into(), Some("window=7d".into())))
        );
        assert!(lane("GET /get/p1 HTTP/1.1\r\n\r\n").is_some());
        assert!(lane("GET /get/p1 HTTP/1.1\r\nConnection: Keep-Alive\r\n\r\n").is_some());
        for other in [
            "HEAD /get/p1 HTTP/1.1\r\n\r\n",
            "GET /get/p1 HTTP/1.0\r\n\r\n",
            "GET /get/p%31 HTTP/1.1\r\n\r\n",
            "GET /get/ HTTP/1.1\r\n\r\n",
            "GET /healthz HTTP/1.1\r\n\r\n",
            "GET /get/p1 HTTP/1.1\r\nConnection: close\r\n\r\n",
            "GET /get/p1 HTTP/1.1\r\ncontent-length: 3\r\n\r\nabc",
            "GET /get/p1 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST /get/p1 HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
            "GET /get/p1 HTTP/1.1\r\nConnection: upgrade\r\nUpgrade: h2c\r\n\r\n",
            "GET /get/p1 HTTP/1.1\r\nIf-None-Match: \"x\"\r\n\r\n",
            "GET /get/p1 HTTP/1.1\r\nExpect: 100-continue\r\n\r\n",
        ] {
            assert!(matches!(parse(other), Head::Other), "{other:?}");
        }
        // Not HTTP/1 at all (an HTTP/2 preface, a TLS handshake, a control byte in a header): refused
        // by the lane in JSON, where hyper would answer a bodiless 400.
        for malformed in [
            "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            "\x16\x03\x01 not http",
            "GET /get/p1 HTTP/1.1\r\nX-Foo: a\x01b\r\n\r\n",
        ] {
            assert!(matches!(parse(malformed), Head::Malformed(_)), "{malformed:?}");
        }
        assert!(matches!(parse("GET /get/p1"), Head::Partial));
        assert!(matches!(parse(""), Head::Partial));
    }

    #[test]
    fn only_whole_bodies_framed_by_one_plain_length_take_the_lane() {
        let head = "POST /post/drop HTTP/1.1\r\nHost: x\r\nContent-Length: 16\r\n\r\n";
        let whole = format!("{head}{{\"memberId\":\"m\"}}");
        assert_eq!(
            lane(&format!("{whole}GET /next HTTP/1.1\r\n\r\n")),
            Some(("drop".into(), None, "{\"memberId\":\"m\"}".into(), whole.len()))
        );
        assert_eq!(
            lane("POST /post/q?x=1 HTTP/1.1\r\ncontent-length: 0\r\n\r\n").map(|l| l.2),
            Some(String::new())
        );
        for other in [
            // The body not read in full yet, or past the limit (64 here).
            "POST /post/q HTTP/1.1\r\nContent-Length: 15\r\n\r\n{\"memberId\"",
            "POST /post/q HTTP/1.1\r\nContent-Length: 65\r\n\r\n",
            // No length, a second one, one hyper refuses, or another framing.
            "POST /post/q HTTP/1.1\r\n\r\n",
            "POST /post/q HTTP/1.1\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n",
            "POST /post/q HTTP/1.1\r\nContent-Length: +2\r\n\r\n{}",
            "POST /post/q HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
            "POST /post/q HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
            "POST /post/q HTTP/1.1\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n{}",
            "POST /post/q HTTP/1.1\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
            // Another path or method.
            "POST /post/q%31 HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
            "POST /get/q HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
            "PUT /post/q HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
            "POST /post/q HTTP/1.0\r\nContent-Length: 2\r\n\r\n{}",
        ] {
            assert!(matches!(parse(other), Head::Other), "{other:?}");
        }
    }

    #[test]
    fn a_range_of_names_a_slice_of_its_whole() {
        let path = "/v1/queues/q/entries/m";
        let member = &path[path.len() - 1..];
        assert_eq!(&path[range_of(path, member)], "m");
    }
}
