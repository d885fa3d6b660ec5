//! The router and the server loop.
//!
//! `app(state)` builds the whole service so tests can drive it with `oneshot`; `run` serves it
//! on a listener until `shutdown` resolves, letting requests in flight finish.

use std::future::Future;
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::header::Entry;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, header};
use axum::response::IntoResponse;
use axum::response::Response;
use axum::routing::{any, get, post};
use axum::{BoxError, Router};
use futures::FutureExt;
use tokio::net::TcpListener;
use tower::{Layer, ServiceExt};
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};

use crate::error::ApiError;
use crate::http::{api, compress, raw, slice, zom};
use crate::state::AppState;

/// Headers a browser client may read from our responses.
const EXPOSED: [&str; 11] = [
    "content-range",
    "content-length",
    "etag",
    "accept-ranges",
    "last-modified",
    "x-zarr-shape",
    "x-zarr-dtype",
    "x-zarr-vmin",
    "x-zarr-vmax",
    "retry-after",
    "www-authenticate",
];

fn cors(origins: &[String]) -> CorsLayer {
    let allow_origin = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()))
    };
    CorsLayer::new()
        .allow_origin(allow_origin)
        .allow_methods([Method::GET, Method::HEAD, Method::OPTIONS, Method::POST])
        // Whatever request headers the page asks for (Range, conditional headers, and those a
        // client library adds of its own, such as Cache-Control): none of them changes what a
        // read can do.
        .allow_headers(AllowHeaders::mirror_request())
        .expose_headers(EXPOSED.map(HeaderName::from_static))
        .max_age(Duration::from_secs(3600))
}

/// The longest path the access log writes whole, in characters.
const LOGGED_PATH_CHARS: usize = 1024;

/// One log line per request (method, path, Range, status, body bytes, milliseconds to the
/// response head and to its end) and the request metrics. Status and latency are counted at the
/// response head ([`Finished::head`]); the line is written, and the body bytes and aborted
/// responses counted, when this is dropped: with the body, when it is over (sent to its end, or
/// given up: the client left, or the body failed). A request whose client leaves before the
/// head is logged with status 499 (nginx's "client closed request") and counted as aborted.
struct Finished {
    state: AppState,
    method: Method,
    /// The request's URI (its path is logged, up to [`LOGGED_PATH_CHARS`]).
    uri: axum::http::Uri,
    range: Option<HeaderValue>,
    /// The route family of its path ([`crate::metrics::route_index`]).
    route: usize,
    start: Instant,
    /// The response's status and the time to its head, once there is one.
    head: Option<(u16, Duration)>,
    /// The body's length, when known before it is sent.
    length: Option<u64>,
    /// Body bytes handed to the connection.
    bytes: u64,
    /// Whether the body reached its end.
    ended: bool,
    /// Whether the request came over HTTP/2, where a body handed on whole waits in the
    /// connection, unsent, while its stream's window is closed: its body is watched however
    /// short ([`LoggedBody`]).
    http2: bool,
    /// The connection's mark of the request, held to the end of the body.
    under_way: Option<UnderWay>,
}

impl Finished {
    fn begin(state: &AppState, request: &Request, under_way: Option<UnderWay>) -> Self {
        state.metrics.started();
        Self {
            state: state.clone(),
            method: request.method().clone(),
            uri: request.uri().clone(),
            range: request.headers().get(header::RANGE).cloned(),
            route: crate::metrics::route_index(request.uri().path()),
            start: Instant::now(),
            head: None,
            length: None,
            bytes: 0,
            ended: false,
            http2: request.version() == axum::http::Version::HTTP_2,
            under_way,
        }
    }

    /// The response's head is ready: its status and latency are counted.
    fn head(&mut self, response: &Response) {
        let (status, head) = (response.status().as_u16(), self.start.elapsed());
        self.state.metrics.observe(self.route, status, head);
        self.head = Some((status, head));
        if let Some(under_way) = &mut self.under_way {
            under_way.answered();
        }
        // A streamed body has no exact size hint, but its Content-Length header.
        self.length = http_body::Body::size_hint(response.body()).exact().or_else(|| {
            response
                .headers()
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok())
        });
    }
}

impl Drop for Finished {
    fn drop(&mut self) {
        // A body of known length is over once that much is handed on (hyper stops polling it
        // there); HEAD, 204 and 304 bodies send nothing.
        let complete = self.head.is_some()
            && (self.method == Method::HEAD
                || match self.length {
                    Some(n) => n == self.bytes,
                    None => self.ended,
                });
        if self.ended && !complete && self.head.is_some() {
            // The body ended short of its stated length (a file truncated while it was sent):
            // the client's connection is cut, and the response counts as aborted.
            tracing::warn!(
                path = %self.uri.path(),
                sent = self.bytes,
                length = self.length.unwrap_or_default(),
                "response body ended before its length"
            );
        }
        self.state.metrics.ended(self.route, self.bytes, complete);
        if !tracing::enabled!(target: "zarrgate::access", tracing::Level::INFO) {
            return;
        }
        let path = self.uri.path();
        let (status, head) = self.head.unwrap_or((499, self.start.elapsed()));
        // A path is logged up to 1 KiB: a request of a 64 KiB URL writes no 64 KiB line.
        let path: std::borrow::Cow<str> = match path.char_indices().nth(LOGGED_PATH_CHARS) {
            Some((cut, _)) => format!("{}...", &path[..cut]).into(),
            None => path.into(),
        };
        tracing::info!(
            target: "zarrgate::access",
            method = %self.method,
            // A string field: the text format quotes and escapes it.
            path = &*path,
            range = self.range.as_ref().and_then(|v| v.to_str().ok()).unwrap_or("-"),
            status,
            bytes = self.bytes,
            ms = millis(self.start.elapsed()),
            head_ms = millis(head),
            aborted = !complete,
        );
    }
}

/// Milliseconds to the microsecond (`0.296`, not `0.29577899999999996`).
fn millis(d: Duration) -> f64 {
    d.as_micros() as f64 / 1e3
}

/// A response body that counts what is handed on of it; the access log line is written when
/// it is dropped ([`Finished`]), and its connection's mark of the request is given back then.
/// It hands on frames of at most [`MAX_FRAME`], and tells its connection when it waits for the
/// client to take more ([`Activity::stalled`]): one of more than a frame, and any over HTTP/2.
pub struct LoggedBody {
    body: axum::body::Body,
    done: Finished,
    /// Made for a body that needs it (a tile over HTTP/1 does not): hyper moves the body
    /// several times a request.
    more: Option<Box<MoreOfBody>>,
}

/// What a [`LoggedBody`] of more than one frame, or over HTTP/2, keeps.
#[derive(Default)]
struct MoreOfBody {
    /// What is left of a frame of the body's over [`MAX_FRAME`].
    rest: axum::body::Bytes,
    sending: Option<std::sync::Arc<Sending>>,
}

/// The largest frame a response body hands on ([`LoggedBody`]). A connection asks for the next
/// frame once it has sent most of the last: a stall is a client taking none of this in
/// `limits.send_timeout_s`, not none of a whole 8 MiB answer (a client reading 70 KB/s).
pub const MAX_FRAME: usize = 1 << 20;

impl LoggedBody {
    fn rest(&self) -> Option<&axum::body::Bytes> {
        self.more
            .as_ref()
            .map(|more| &more.rest)
            .filter(|rest| !rest.is_empty())
    }
}

impl http_body::Body for LoggedBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        if let Some(sending) = this.more.as_ref().and_then(|more| more.sending.as_ref()) {
            sending.0.store(Sending::ASKED, std::sync::atomic::Ordering::Relaxed);
        }
        let polled = match this.more.as_deref_mut() {
            Some(more) if !more.rest.is_empty() => {
                let piece = more.rest.split_to(more.rest.len().min(MAX_FRAME));
                std::task::Poll::Ready(Some(Ok(http_body::Frame::data(piece))))
            }
            _ => {
                let mut polled = std::pin::Pin::new(&mut this.body).poll_frame(cx);
                if let std::task::Poll::Ready(Some(Ok(frame))) = &mut polled
                    && let Some(data) = frame.data_mut()
                    && data.len() > MAX_FRAME
                {
                    this.more.get_or_insert_default().rest = data.split_off(MAX_FRAME);
                }
                polled
            }
        };
        match &polled {
            std::task::Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.done.bytes += data.len() as u64;
                }
                // Taken by the connection: from now on the body waits for it to ask again. A
                // body whose length is all handed on (a tile, in one frame) is over over
                // HTTP/1, and is not watched.
                if let Some(activity) = this.done.under_way.as_ref().map(|u| &u.activity) {
                    match this.more.as_ref().and_then(|more| more.sending.as_ref()) {
                        Some(sending) => sending.0.store(activity.now_ms(), std::sync::atomic::Ordering::Relaxed),
                        None if this.done.http2 || this.done.length != Some(this.done.bytes) => {
                            this.more.get_or_insert_default().sending = Some(activity.sending());
                        }
                        None => {}
                    }
                }
            }
            std::task::Poll::Ready(None) => this.done.ended = true,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.rest().is_none() && self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        let inner = self.body.size_hint();
        let Some(rest) = self.rest() else {
            return inner;
        };
        let rest = rest.len() as u64;
        let mut hint = http_body::SizeHint::new();
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper.saturating_add(rest));
        }
        // Still at most the upper bound: both grow by `rest`, and it saturates first.
        hint.set_lower(inner.lower().saturating_add(rest));
        hint
    }
}

impl Drop for LoggedBody {
    /// The body is over when hyper drops it: after its end, or before (the client left). An
    /// empty body (or one read to its end without a last poll) is at its end here.
    fn drop(&mut self) {
        if http_body::Body::is_end_stream(&self.body) {
            self.done.ended = true;
        }
    }
}

/// The bearer token of a request, if it presents one.
pub fn bearer(headers: &axum::http::HeaderMap) -> Option<&[u8]> {
    let value = headers.get(header::AUTHORIZATION)?.as_bytes();
    let (scheme, token) = value.split_at(value.iter().position(|b| *b == b' ')?);
    scheme.eq_ignore_ascii_case(b"bearer").then(|| token.trim_ascii())
}

/// Finishes an answer to HEAD as axum's router finishes those of its routes: `Content-Length`
/// from the body's exact size when it has none ([`state_length`]), and no body. Answers the
/// front makes itself (401, 414, 503, 504) and the handlers it calls directly need it: over
/// HTTP/2, hyper sends a HEAD answer's body, and clients refuse the stream. A HEAD answer with
/// no body already (the router's, a handler's own HEAD answer) is left as it is: its empty body
/// says nothing of the GET's length.
///
/// Other answers are left as they are: a connection states the exact size of a body without
/// `Content-Length` itself, with no header value to make (hyper writes it into the response
/// head: over HTTP/1 for every status that has a body, over HTTP/2 for a body that is not
/// empty, whose end the headers frame marks otherwise). [`app`]'s service, which no connection
/// serves, states it as axum's router does.
fn finish(response: &mut Response, head: bool) {
    if !head || http_body::Body::size_hint(response.body()).exact() == Some(0) {
        return;
    }
    state_length(response);
    *response.body_mut() = axum::body::Body::empty();
}

/// Adds `Content-Length` to an answer of exact size that has none, as axum's router does to its
/// routes' answers.
fn state_length<B: http_body::Body>(response: &mut axum::http::Response<B>) {
    if response.headers().contains_key(header::CONTENT_LENGTH) {
        return;
    }
    if let Some(length) = http_body::Body::size_hint(response.body()).exact() {
        response
            .headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    }
}

/// The handlers [`Front::dispatch`] calls directly.
enum Direct {
    Raw,
    Slice,
}

/// Whether `path` is `prefix` followed by a mount's name (a segment that is not empty), as the
/// router's `{prefix}{mount}` routes match.
fn names_mount(path: &str, prefix: &str) -> bool {
    path.strip_prefix(prefix)
        .is_some_and(|rest| !rest.is_empty() && !rest.starts_with('/'))
}

/// The mount a request reads, when its route family names one.
fn mount_of(path: &str) -> Option<&str> {
    [
        "/zarr/",
        "/api/v1/slice/",
        "/api/v1/zom/",
        "/api/v1/list/",
        "/api/v1/validate/",
    ]
    .iter()
    .find_map(|prefix| path.strip_prefix(prefix))
    .map(|rest| rest.split('/').next().unwrap_or(""))
}

/// The answer to a request whose handling panicked: a 500 `internal` JSON answer (logged with
/// the panic's message, which the client never sees), so that a bug costs one request, not the
/// connection and whatever it had under way. Panics of decoding and encoding tasks on the
/// blocking pool come back as failed tasks and are answered the same way.
fn panicked(panic: &(dyn std::any::Any + Send)) -> Response {
    let message = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("(no message)");
    tracing::error!(panic = message, "a request handler panicked");
    ApiError::Internal.into_response()
}

/// The whole HTTP service, as one hand-written front over the routes.
///
/// Every request is logged and counted, gets CORS headers, and passes the guard (414, 401).
/// Then liveness and metrics answer at once; everything else (reading mounts) shares one
/// concurrency limit and timeout. The steps are plain code in one future rather than a stack
/// of middleware layers: axum's `from_fn` layers, routers nested in routers and tower's
/// limit layers each cloned the services below them and boxed a future per request, and
/// together cost more than the slice handler serving a cached tile.
#[derive(Clone)]
pub struct App(std::sync::Arc<Front>);

struct Front {
    state: AppState,
    /// Every route, with no layer around it.
    routes: Router,
    /// No origins, no CORS headers at all (nor answers to preflights).
    cors: Option<CorsLayer>,
    /// The `Access-Control-Expose-Headers` value of every answer but preflights.
    cors_exposed: HeaderValue,
    /// Requests reading mounts, at most `limits.max_concurrent_requests`; one past it is
    /// refused (503).
    turns: RequestTurns,
    timeout: Duration,
    /// Whether slices and raw keys are answered without the router ([`Front::dispatch`]).
    direct: bool,
    /// The health listener's front ([`serve_health`]): every path but `/healthz` and `/metrics`
    /// is 404 before anything else is looked at (a protected mount's 401 would name it).
    health_only: bool,
}

/// Turns of a limit that is only ever tried, never waited for: a count, which is all a
/// semaphore would be here (tokio's takes its waiters' lock to give each permit back, a lock
/// every request on every core then takes).
struct RequestTurns {
    taken: std::sync::atomic::AtomicUsize,
    limit: usize,
}

/// A turn of [`RequestTurns`], given back when dropped.
struct RequestTurn<'a>(&'a std::sync::atomic::AtomicUsize);

impl RequestTurns {
    /// A turn, if one is free.
    fn take(&self) -> Option<RequestTurn<'_>> {
        use std::sync::atomic::Ordering::{AcqRel, Acquire};
        let free = |taken: usize| (taken < self.limit).then_some(taken + 1);
        self.taken.fetch_update(AcqRel, Acquire, free).ok()?;
        Some(RequestTurn(&self.taken))
    }
}

impl Drop for RequestTurn<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// The service over the routes of zarrgate.
pub fn app(state: AppState) -> App {
    let routes = routes(state.clone());
    build(state, routes, true, false)
}

/// The routes of liveness and metrics, which the health listener ([`serve_health`]) serves
/// alone.
fn health_routes() -> axum::Router<AppState> {
    Router::new()
        .route("/healthz", get(api::healthz))
        .route("/metrics", get(api::metrics))
}

/// The routes, handlers only ([`app`] is them behind its front).
pub fn routes(state: AppState) -> Router {
    health_routes()
        .route("/", get(api::index))
        .route("/api/v1/mounts", get(api::mounts))
        .route("/api/v1/slice/{mount}", get(slice::slice))
        .route("/api/v1/slice/{mount}/", get(slice::slice))
        .route("/api/v1/slice/{mount}/{*path}", get(slice::slice))
        .route("/api/v1/zom/{mount}", get(zom::zom))
        .route("/api/v1/zom/{mount}/", get(zom::zom))
        .route("/api/v1/zom/{mount}/{*path}", get(zom::zom))
        .route("/api/v1/list/{mount}", get(zom::list))
        .route("/api/v1/list/{mount}/", get(zom::list))
        .route("/api/v1/list/{mount}/{*path}", get(zom::list))
        .route("/api/v1/zom-schema", get(zom::zom_schema))
        .route("/api/v1/validate/{mount}", post(zom::validate))
        .route("/api/v1/validate/{mount}/", post(zom::validate))
        .route("/api/v1/validate/{mount}/{*path}", post(zom::validate))
        .route("/zarr/{mount}", any(raw::raw_key))
        .route("/zarr/{mount}/", any(raw::raw_key))
        .route("/zarr/{mount}/{*key}", any(raw::raw_key))
        .fallback(api::not_found)
        .method_not_allowed_fallback(api::method_not_allowed)
        .with_state(state)
}

/// The front (log, metrics, panics, CORS, guard, limits) over any `routes`: [`app`]'s, or a
/// test's own (which get every request: the direct answers of slices and raw keys are
/// [`app`]'s).
pub fn front(state: AppState, routes: Router) -> App {
    build(state, routes, false, false)
}

fn build(state: AppState, routes: Router, direct: bool, health_only: bool) -> App {
    let server = &state.config.server;
    let limits = &state.config.limits;
    App(std::sync::Arc::new(Front {
        cors: (!server.cors_origins.is_empty()).then(|| cors(&server.cors_origins)),
        cors_exposed: HeaderValue::from_str(&EXPOSED.join(",")).unwrap_or(HeaderValue::from_static("")),
        turns: RequestTurns {
            taken: 0.into(),
            limit: limits.max_concurrent_requests,
        },
        timeout: Duration::from_secs_f64(limits.request_timeout_s),
        direct,
        health_only,
        routes,
        state,
    }))
}

impl App {
    /// Answers `request`; `under_way` (the connection's mark of it) is held until the
    /// response's body is over.
    async fn serve(self, request: Request, under_way: Option<UnderWay>) -> axum::http::Response<LoggedBody> {
        let mut done = Finished::begin(&self.0.state, &request, under_way);
        let head = request.method() == Method::HEAD;
        let mut response = self.0.answer(request).await;
        finish(&mut response, head);
        done.head(&response);
        response.map(|body| LoggedBody { body, done, more: None })
    }
}

impl<B> tower::Service<axum::http::Request<B>> for App
where
    B: http_body::Body<Data = axum::body::Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response;
    type Error = std::convert::Infallible;
    type Future = futures::future::BoxFuture<'static, Result<Response, std::convert::Infallible>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: axum::http::Request<B>) -> Self::Future {
        let head = request.method() == Method::HEAD;
        let served = self.clone().serve(request.map(axum::body::Body::new), None);
        Box::pin(async move {
            let mut response = served.await;
            // What a connection states (answers to HEAD are finished).
            if !head {
                state_length(&mut response);
            }
            Ok(response.map(axum::body::Body::new))
        })
    }
}

/// A request's answer under way ([`Front::routed`]): the handler's future and, for a request
/// reading mounts, its turn and deadline.
struct Routed<'a> {
    answer: futures::future::BoxFuture<'static, Response>,
    limit: Option<Limit<'a>>,
}

/// The turn ([`RequestTurns`]) and the deadline (`limits.request_timeout_s`) of a request
/// reading mounts.
struct Limit<'a> {
    _turn: RequestTurn<'a>,
    deadline: tokio::time::Instant,
    /// Made when the answer first waits. Most answers (a cached tile) are ready at their first
    /// poll: they need no timer, whose making and dropping clones and drops the runtime's
    /// handle. The deadline is set before, as if the timer had been.
    timer: Option<std::pin::Pin<Box<tokio::task::coop::Unconstrained<tokio::time::Sleep>>>>,
    /// `limits.request_timeout_s` as written (the `Duration` is rounded to nanoseconds).
    seconds: f64,
}

impl Future for Routed<'_> {
    type Output = Response;

    /// The answer, or 504 once the deadline has passed. The timer is polled outside tokio's
    /// cooperative budget (as `tokio::time::timeout` polls its own once the future it guards
    /// has used the budget up): an answer that keeps using it up does not keep the timeout
    /// from firing.
    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Response> {
        let this = &mut *self;
        if let std::task::Poll::Ready(answer) = this.answer.as_mut().poll(cx) {
            return std::task::Poll::Ready(answer);
        }
        let Some(limit) = &mut this.limit else {
            return std::task::Poll::Pending;
        };
        let deadline = limit.deadline;
        let timer = limit
            .timer
            .get_or_insert_with(|| Box::pin(tokio::task::coop::unconstrained(tokio::time::sleep_until(deadline))));
        timer
            .as_mut()
            .poll(cx)
            .map(|()| ApiError::Timeout(limit.seconds).into_response())
    }
}

/// The `Vary` of every answer but preflights, as tower-http's CORS layer writes it.
const CORS_VARY: HeaderValue =
    HeaderValue::from_static("origin, access-control-request-method, access-control-request-headers");

/// [`CORS_VARY`] after an answer's own `Vary: accept` (a slice's), as one value.
const ACCEPT_AND_CORS_VARY: HeaderValue =
    HeaderValue::from_static("accept, origin, access-control-request-method, access-control-request-headers");

/// Marks an HTTP/1.1 request that came with no `Host` field or with several.
#[derive(Clone, Copy)]
struct NoSingleHost;

/// RFC 9112 section 3.2: an HTTP/1.1 request with no Host field, or with more than one, is
/// answered 400 (hyper serves it). Marked where the request came over a connection (one made
/// in-process names no host), and refused by the front.
fn mark_host<B>(request: &mut hyper::Request<B>) {
    if request.version() == hyper::Version::HTTP_11 {
        let mut hosts = request.headers().get_all(header::HOST).iter();
        if hosts.next().is_none() || hosts.next().is_some() {
            request.extensions_mut().insert(NoSingleHost);
        }
    }
}

/// The `Cache-Control` of answers that state none.
const NO_CACHE: HeaderValue = HeaderValue::from_static("no-cache");

/// Adds [`CORS_VARY`] to an answer's `Vary`. An answer that varies on `Accept` alone (a slice
/// of binary data) gets one value naming both: a second value makes the header map allocate
/// room for it. (A slice of text also varies on `Accept-Encoding`, a value of its own.)
fn vary_as_cors(headers: &mut HeaderMap) {
    match headers.entry(header::VARY) {
        Entry::Occupied(mut vary) if vary.iter().count() == 1 && vary.get() == "accept" => {
            vary.insert(ACCEPT_AND_CORS_VARY);
        }
        Entry::Occupied(mut vary) => vary.append(CORS_VARY),
        Entry::Vacant(vary) => {
            vary.insert(CORS_VARY);
        }
    }
}

impl Front {
    /// The answer to `request`, with CORS headers when origins are configured.
    ///
    /// tower-http's CORS layer answers preflights. The headers of other answers are written
    /// here, as that layer writes them (checked by tests), from values made once: the layer
    /// builds a header map, a `Vary` value and a future of its own for every request.
    ///
    /// It is [`Front::guarded`]'s future with the headers added to its answer, not an `async`
    /// function: that would hold the request twice over (as its argument, and in the future it
    /// awaits), and hyper moves the whole for every request.
    fn answer(&self, request: Request) -> impl Future<Output = Response> + Send + '_ {
        /// The CORS headers an answer gets, decided from its request.
        enum Cors {
            None,
            /// An OPTIONS that is no preflight, from an origin allowed or not.
            Options(Option<HeaderValue>),
            /// Any other request, from an origin allowed or not.
            Other(Option<HeaderValue>),
        }
        let origin = request.headers().get(header::ORIGIN);
        let cors = match &self.cors {
            None => Cors::None,
            Some(cors) if request.method() == Method::OPTIONS => {
                if request.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD) {
                    // The layer answers a preflight itself; the service below is never called.
                    let preflight = cors.clone().layer(tower::service_fn(|_: Request| async {
                        Ok::<_, std::convert::Infallible>(Response::default())
                    }));
                    let answered = Box::pin(preflight.oneshot(request));
                    return futures::future::Either::Right(answered.map(|r| r.unwrap_or_else(|e| match e {})));
                }
                // An OPTIONS that is no preflight goes to the routes (204 with Allow); its
                // answer is a response like any other: with the origin allowed, a page reads it.
                Cors::Options(origin.and_then(|o| self.allowed(Some(o))))
            }
            Some(_) => Cors::Other(self.allowed(origin)),
        };
        futures::future::Either::Left(self.guarded(request).map(move |mut response| {
            let headers = response.headers_mut();
            // An answer that does not say how it may be cached (a slice, a hierarchy, a listing)
            // is `no-cache`, as raw keys and errors are: a shared cache would otherwise keep it
            // for a heuristic lifetime of its own (CloudFront: a day), past the staleness bound
            // docs/operations.md states.
            headers.entry(header::CACHE_CONTROL).or_insert(NO_CACHE);
            match cors {
                Cors::None | Cors::Options(None) => {}
                Cors::Options(Some(allowed)) => {
                    if !self.any_origin() {
                        headers.append(header::VARY, HeaderValue::from_static("origin"));
                    }
                    headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allowed);
                    headers.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, self.cors_exposed.clone());
                }
                Cors::Other(allowed) => {
                    vary_as_cors(headers);
                    if let Some(origin) = allowed {
                        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
                    }
                    headers.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, self.cors_exposed.clone());
                }
            }
            response
        }))
    }

    /// The `Access-Control-Allow-Origin` of a request from `origin`: `*` when every origin is,
    /// the origin when it is listed, none otherwise.
    fn allowed(&self, origin: Option<&HeaderValue>) -> Option<HeaderValue> {
        if self.any_origin() {
            return Some(HeaderValue::from_static("*"));
        }
        let origins = &self.state.config.server.cors_origins;
        origin
            .filter(|origin| origins.iter().any(|o| o.as_bytes() == origin.as_bytes()))
            .cloned()
    }

    /// Whether every origin is allowed (`"*"`).
    fn any_origin(&self) -> bool {
        self.state.config.server.cors_origins.iter().any(|o| o == "*")
    }

    /// [`Front::routed`], a panic of which is answered as [`panicked`] says (with CORS
    /// headers as any answer, so that a page can read it): one in the checks and routing done
    /// as its future is made, or one while it is polled.
    fn guarded(&self, request: Request) -> impl Future<Output = Response> + Send + '_ {
        use futures::future::{Either, ready};
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.routed(request))) {
            Ok(routed) => Either::Left(
                std::panic::AssertUnwindSafe(routed)
                    .catch_unwind()
                    .map(|answered| answered.unwrap_or_else(|panic| panicked(panic.as_ref()))),
            ),
            Err(panic) => Either::Right(ready(panicked(panic.as_ref()))),
        }
    }

    /// Refuses what must not reach a handler: overlong URLs (414) and requests without the
    /// bearer token a protected mount or /metrics needs (401); then routes, mount reads
    /// within the limits. Tokens are never logged.
    fn routed(&self, request: Request) -> futures::future::Either<futures::future::Ready<Response>, Routed<'_>> {
        use futures::future::{Either, ready};
        // Liveness and metrics: never refused for load, and all the health listener answers.
        let health = matches!(request.uri().path(), "/healthz" | "/metrics");
        if self.health_only && !health {
            let refused = ApiError::NotFound("this listener answers /healthz and /metrics alone".into());
            return Either::Left(ready(refused.into_response()));
        }
        if let Err(refused) = self.admits(&request) {
            return Either::Left(ready(refused.into_response()));
        }
        if health {
            return Either::Right(Routed {
                answer: self.through_router(request),
                limit: None,
            });
        }
        let Some(turn) = self.turns.take() else {
            return Either::Left(ready(ApiError::Overloaded.into_response()));
        };
        Either::Right(Routed {
            answer: self.dispatch(request),
            limit: Some(Limit {
                _turn: turn,
                deadline: tokio::time::Instant::now() + self.timeout,
                timer: None,
                seconds: self.state.config.limits.request_timeout_s,
            }),
        })
    }

    /// The handler's answer. Slices and raw keys, the requests viewers make by the thousand,
    /// go to their handlers directly; the rest through the router (which matches the same
    /// paths to the same handlers, and clones and boxes more). Every answer is then finished
    /// as the router finishes its own ([`finish`]).
    ///
    /// Each handler's future is a box of its own: the futures above it stay small, and hyper
    /// moves them for every request.
    fn dispatch(&self, request: Request) -> futures::future::BoxFuture<'static, Response> {
        let method = request.method();
        let path = request.uri().path();
        let direct = if !self.direct {
            None
        } else if names_mount(path, "/zarr/") {
            Some(Direct::Raw)
        } else if (method == Method::GET || method == Method::HEAD) && names_mount(path, "/api/v1/slice/") {
            Some(Direct::Slice)
        } else {
            None
        };
        let Some(direct) = direct else {
            return self.through_router(request);
        };
        let (parts, _) = request.into_parts();
        let state = State(self.state.clone());
        match direct {
            Direct::Raw => raw::raw_key(state, parts.method, parts.uri, parts.headers)
                .map(IntoResponse::into_response)
                .boxed(),
            Direct::Slice => slice::slice(state, parts.method, parts.uri, parts.headers).boxed(),
        }
    }

    /// The router's answer to `request`, boxed; text compressed as the request accepts
    /// ([`compress`]), but for raw keys, whose bytes are sent as stored, and slices, whose
    /// handler compresses what it makes of text (the router serves both when the front does
    /// not call their handlers).
    fn through_router(&self, request: Request) -> futures::future::BoxFuture<'static, Response> {
        let path = request.uri().path();
        let coding = match path.starts_with("/zarr/") || path.starts_with("/api/v1/slice/") {
            true => None,
            false => Some(compress::wanted(&self.state, request.headers())),
        };
        let method = request.method().clone();
        let state = self.state.clone();
        let answer = self.routes.clone().oneshot(request);
        answer
            .map(move |r| {
                let response = r.unwrap_or_else(|e| match e {});
                match coding {
                    Some(coding) => compress::apply(&state, &method, coding, response),
                    None => response,
                }
            })
            .boxed()
    }

    /// Whether `request` may reach a handler: its URL is not too long, and it presents the
    /// token its mount or /metrics needs.
    fn admits(&self, request: &Request) -> Result<(), ApiError> {
        if request.extensions().get::<NoSingleHost>().is_some() {
            return Err(ApiError::BadRequest(
                "an HTTP/1.1 request must have exactly one Host field".into(),
            ));
        }
        let max = self.state.config.limits.max_url_bytes;
        if request.uri().path_and_query().map_or(0, |pq| pq.as_str().len()) > max {
            return Err(ApiError::UriTooLong(max));
        }
        let path = request.uri().path();
        let token = bearer(request.headers());
        let allowed = if path == "/metrics" {
            self.state
                .metrics_token
                .as_ref()
                .is_none_or(|t| token.is_some_and(|b| t.matches(b)))
        } else {
            // The handlers' own lookup (which percent-decodes the segment), so that no spelling
            // of a protected mount's name passes here and reaches it there.
            mount_of(path)
                .and_then(|segment| self.state.mount(segment).ok())
                .is_none_or(|mount| mount.allows(token))
        };
        if allowed { Ok(()) } else { Err(ApiError::Unauthorized) }
    }
}

/// `limits.send_timeout_s`: how long a response's body may wait for its client to take more
/// of it ([`Activity::stalled`]); then its connection is closed: a client that stopped reading
/// a streamed response gives its turn back ([`crate::state::MAX_STREAMS`]).
pub fn send_timeout(limits: &crate::config::LimitsConfig) -> Duration {
    // Validated at load: finite, a millisecond to a day (a state made in code is not
    // validated: at least a millisecond).
    Duration::try_from_secs_f64(limits.send_timeout_s)
        .unwrap_or(Duration::from_secs(120))
        .max(Duration::from_millis(1))
}

/// How long the kernel lets a connection leave what it was sent unacknowledged (the peer gone,
/// or its receive window closed) before it closes it. Not `limits.send_timeout_s`, which may
/// be shorter than retransmissions take on a lossy network.
pub const STALLED: Duration = Duration::from_secs(120);

/// Socket options of an accepted connection: a stalled peer is dropped after [`STALLED`].
/// (TCP_NODELAY measured 1-2% fewer warm tiles a second at 64 connections, and no gain.)
#[cfg_attr(not(any(target_os = "linux", target_os = "android")), allow(unused_variables))]
fn tune_connection(tcp: &mut tokio::net::TcpStream) {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if let Err(e) = socket2::SockRef::from(&*tcp).set_tcp_user_timeout(Some(STALLED)) {
        tracing::debug!(error = %e, "TCP_USER_TIMEOUT not set");
    }
}

/// An accepted connection: its turn ([`crate::config::LimitsConfig::max_connections`]) and its
/// count in the metrics, given back when it closes.
struct OpenConnection {
    state: AppState,
    _turn: tokio::sync::OwnedSemaphorePermit,
}

impl OpenConnection {
    fn new(state: AppState, turn: tokio::sync::OwnedSemaphorePermit) -> Self {
        state.metrics.connection_opened();
        Self { state, _turn: turn }
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.state.metrics.connection_closed();
    }
}

/// Serves `app(state)` on `listener` until `shutdown` resolves, then lets the responses under
/// way finish for up to `server.drain_s`.
pub async fn run(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // Validated at load: finite, 0 to a day.
    let drain = Duration::try_from_secs_f64(state.config.server.drain_s).unwrap_or(Duration::ZERO);
    run_draining(listener, state, shutdown, drain).await
}

/// [`run`], letting responses under way finish for up to `drain` after `shutdown`, then
/// returning whether or not they have: a client reading a large body slowly, or a request
/// waiting on a store that does not answer, does not keep the caller waiting. The connections
/// still open are then ended with the workers serving them (`server.workers`); with none, they
/// are tasks of the caller's runtime, which ends them when it shuts down (`main` does so right
/// after).
pub async fn run_draining(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
    drain: Duration,
) -> std::io::Result<()> {
    serve_with(listener, state, shutdown, drain, HEADER_READ_TIMEOUT).await
}

/// [`run_draining`] giving a client `header_read` to send a request's head (and a keep-alive
/// connection as long idle between requests).
pub async fn serve_with(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
    drain: Duration,
    header_read: Duration,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use hyper_util::server::conn::auto::Builder;

    // Each connection holds a turn: at the limit, new ones wait in the listen backlog, so
    // what connections hold (buffers, bodies under way, descriptors) is bounded.
    let state_connections = state.config.limits.max_connections;
    let connections = std::sync::Arc::new(tokio::sync::Semaphore::new(state_connections));
    let open = state.clone();
    let header_list = state.config.limits.max_url_bytes.saturating_add(16 << 10);
    let stalled = send_timeout(&state.config.limits);
    let app = app(state);
    let mut builder = Builder::new(TokioExecutor::new());
    // A client has `header_read` to send a request's head, and an idle keep-alive connection
    // is closed after as long: half-sent requests (slowloris) and idle connections do not
    // hold descriptors, nor the shutdown, for ever. The connection's own loop (below) sees to
    // both, from a time it keeps in an atomic and a timer that wakes once a period. hyper's
    // header read timeout would do the first with a timer of its own made, registered and
    // dropped for every request: 3.5% of a warm tile's instructions.
    builder.http1().header_read_timeout(None);
    // hyper notices a client hanging up mid-request by reading the socket after every request
    // head. The head still holds hyper's read buffer then, so that read made the connection
    // allocate another for every request (3% of a warm tile's instructions). The connection's
    // loop watches for it instead, and only while a request waits for its answer ([`HangUp`]).
    #[cfg(unix)]
    builder.http1().half_close(true);
    // A request head is at most a URL of `limits.max_url_bytes` and 16 KiB of fields, as over
    // HTTP/2 below: a longer one is a 431 from hyper. Its default buffer, ~400 KiB, let each
    // connection hold that much of a head that never ends (400 MB at `max_connections`).
    builder.http1().max_buf_size(header_list.max(8192));
    // HTTP/2 refuses a request whose headers exceed the list size with a bare 431 (16 KiB by
    // default, less than `limits.max_url_bytes` may allow): a URL over that limit by up to
    // 16 KiB gets the JSON 414 that HTTP/1 gives.
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(header_read)
        .keep_alive_timeout(header_read)
        .max_header_list_size(u32::try_from(header_list).unwrap_or(u32::MAX));
    let builder = std::sync::Arc::new(builder);
    // Connections are served by the workers, or on this runtime when there are none.
    let mut workers = match open.config.server.workers {
        0 => None,
        n => Some(crate::workers::Workers::start(n, open.config.server.blocking_threads).await?),
    };
    let (stop, stopping) = tokio::sync::watch::channel(());
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let Some((tcp, turn)) = next_connection(&listener, &connections, shutdown.as_mut()).await else {
            break;
        };
        // Given to a worker, it is registered anew with the worker's runtime.
        let tcp = match &workers {
            None => Accepted::Here(tcp),
            Some(_) => match tcp.into_std() {
                Ok(tcp) => Accepted::HandedOver(tcp),
                Err(e) => {
                    tracing::warn!(error = %e, "handing an accepted connection over failed");
                    continue;
                }
            },
        };
        let activity = std::sync::Arc::new(Activity::new());
        let service = {
            let (app, activity) = (app.clone(), activity.clone());
            hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
                let under_way = Activity::begin(&activity);
                mark_host(&mut request);
                let served = app.clone().serve(request.map(body_of), Some(under_way));
                // Not `async move { Ok(served.await) }`: that future holds `served` twice over
                // (as captured, and as awaited), and hyper moves it whole for every request.
                futures::FutureExt::map(served, Ok::<_, std::convert::Infallible>)
            })
        };
        let (builder, mut stopping) = (builder.clone(), stopping.clone());
        let open = OpenConnection::new(open.clone(), turn);
        let connection = async move {
            let _open = open;
            let tcp = match tcp {
                Accepted::Here(tcp) => tcp,
                Accepted::HandedOver(tcp) => match tokio::net::TcpStream::from_std(tcp) {
                    Ok(tcp) => tcp,
                    Err(e) => {
                        tracing::warn!(error = %e, "registering a connection with its worker's runtime failed");
                        return;
                    }
                },
            };
            // A connection that sends nothing is closed after `header_read` too (telling
            // HTTP/1 from HTTP/2 waits for its first bytes, before hyper's timer), and at once
            // on shutdown.
            let mut first = [0u8; 1];
            let sent = tokio::select! {
                peeked = tokio::time::timeout(header_read, tcp.peek(&mut first)) => matches!(peeked, Ok(Ok(1))),
                _ = stopping.changed() => false,
            };
            if !sent {
                return;
            }
            let mut hang_up = HangUp::new(&tcp);
            let connection = builder
                .serve_connection_with_upgrades(TokioIo::new(tcp), service)
                .into_owned();
            let mut connection = std::pin::pin!(connection);
            // Asked to finish (it takes no new request, ends those under way, then closes)
            // on shutdown, or when it has had no request under way for `header_read`: hyper
            // closes an idle HTTP/1 connection itself, but keeps an idle HTTP/2 one as long as
            // its client answers pings, and an HTTP/1 one holding part of a request's head
            // until the head is whole. Such a connection, with still no request under way a
            // moment later, is dropped (`cut_off`).
            let mut finishing = false;
            // While requests are under way, bodies are checked for stalling this often (a
            // quarter of the timeout past it, at most).
            let check = header_read.min((stalled / 4).max(Duration::from_millis(10)));
            let mut idle = std::pin::pin!(tokio::time::sleep(check));
            // A connection with no request under way `grace` after it was asked to finish (for
            // idleness or on shutdown) is dropped: one holding half a request head (a slow or
            // stalled client) would otherwise stay open, and keep the exit, until the head is
            // whole.
            let (mut stopped, mut cutting) = (false, false);
            let grace = header_read.min(SHUTDOWN_HEAD_GRACE);
            let mut cut_off = std::pin::pin!(tokio::time::sleep(Duration::ZERO));
            loop {
                tokio::select! {
                    // The connection first: the branches after it see what its poll left.
                    biased;
                    ended = connection.as_mut() => {
                        if let Err(e) = ended {
                            tracing::debug!(error = %e, "connection ended");
                        }
                        break;
                    }
                    // Its client gone, the requests waiting for their answers are dropped (and
                    // with them their turns), as hyper's own check did.
                    () = std::future::poll_fn(|cx| hang_up.poll(cx, activity.waiting())) => {
                        tracing::debug!("client hung up with a request waiting for its answer");
                        break;
                    }
                    () = idle.as_mut() => {
                        // A client that has left a body unread for `stalled` loses the
                        // connection, and its bodies what they hold (their turns among it),
                        // also while it finishes: over HTTP/2 a stream whose window stays
                        // closed stalls no socket, and nothing else would end it.
                        if activity.stalled(stalled) {
                            tracing::info!(
                                seconds = stalled.as_secs_f64(),
                                "closing a connection whose client left a response unread for limits.send_timeout_s"
                            );
                            break;
                        }
                        match activity.busy_until(header_read, check) {
                            Some(until) => idle.as_mut().reset(until),
                            None if !finishing => {
                                finishing = true;
                                connection.as_mut().graceful_shutdown();
                                cutting = true;
                                cut_off.as_mut().reset(tokio::time::Instant::now() + grace);
                            }
                            None => idle.as_mut().reset(tokio::time::Instant::now() + check),
                        }
                    }
                    _ = stopping.changed(), if !stopped => {
                        stopped = true;
                        if !finishing {
                            finishing = true;
                            connection.as_mut().graceful_shutdown();
                        }
                        cutting = true;
                        cut_off.as_mut().reset(tokio::time::Instant::now() + grace);
                    }
                    () = cut_off.as_mut(), if cutting => {
                        if activity.nothing_under_way() {
                            break;
                        }
                        // A request under way: the connection ends with its response (hyper
                        // takes no other), within the drain.
                        cutting = false;
                    }
                }
            }
        };
        match &mut workers {
            Some(workers) => workers.spawn(connection),
            None => {
                tokio::spawn(connection);
            }
        }
    }
    // Nothing more is accepted; the responses under way get `drain` to finish: until every
    // connection has given its turn back.
    tracing::info!(drain_s = drain.as_secs_f64(), "shutting down");
    drop(listener);
    let _ = stop.send(());
    let every_turn = u32::try_from(state_connections).unwrap_or(u32::MAX);
    tokio::select! {
        _ = connections.acquire_many(every_turn) => Ok(()),
        () = tokio::time::sleep(drain) => {
            tracing::warn!(seconds = drain.as_secs_f64(), "closing the connections still open after the shutdown signal");
            Ok(())
        }
    }
}

/// The next connection on `listener` with its turn of `turns` (waited for first: at the limit,
/// new connections wait in the listen backlog), its socket tuned ([`tune_connection`]); `None`
/// once `shutdown` resolves. An accept that fails (out of descriptors, say) is tried again
/// soon; the connections under way go on.
async fn next_connection<F: Future<Output = ()>>(
    listener: &TcpListener,
    turns: &std::sync::Arc<tokio::sync::Semaphore>,
    mut shutdown: std::pin::Pin<&mut F>,
) -> Option<(tokio::net::TcpStream, tokio::sync::OwnedSemaphorePermit)> {
    let turn = tokio::select! {
        turn = turns.clone().acquire_owned() => turn.ok()?,
        () = &mut shutdown => return None,
    };
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((mut tcp, _)) => {
                    tune_connection(&mut tcp);
                    return Some((tcp, turn));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            () = &mut shutdown => return None,
        }
    }
}

/// Connections the health listener ([`serve_health`]) keeps open at once; more wait to be
/// accepted.
pub const HEALTH_CONNECTIONS: usize = 16;

/// Serves `/healthz` and `/metrics` alone on `listener` (`server.health_bind`) until `shutdown`
/// resolves: a listener of its own, with connections of its own, so that a liveness probe or a
/// scrape is answered while every one of `limits.max_connections` is taken (by clients reading
/// slowly, say), where on `bind` it would wait to be accepted. Other paths are 404. The answers
/// are the front's (the metrics token, CORS, counts in `/metrics`), over HTTP/1.
pub async fn serve_health(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use hyper_util::server::conn::auto::Builder;

    let routes = health_routes()
        .method_not_allowed_fallback(api::method_not_allowed)
        .with_state(state.clone());
    let app = build(state, routes, false, true);
    let turns = std::sync::Arc::new(tokio::sync::Semaphore::new(HEALTH_CONNECTIONS));
    let mut builder = Builder::new(TokioExecutor::new()).http1_only();
    // A client has as long to send a request's head as on `bind`; an idle one is then closed.
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let builder = std::sync::Arc::new(builder);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let Some((tcp, turn)) = next_connection(&listener, &turns, shutdown.as_mut()).await else {
            break;
        };
        let (app, builder) = (app.clone(), builder.clone());
        let service = hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
            mark_host(&mut request);
            futures::FutureExt::map(
                app.clone().serve(request.map(body_of), None),
                Ok::<_, std::convert::Infallible>,
            )
        });
        tokio::spawn(async move {
            let _turn = turn;
            if let Err(e) = builder.serve_connection(TokioIo::new(tcp), service).await {
                tracing::debug!(error = %e, "health connection ended");
            }
        });
    }
    Ok(())
}

/// An accepted connection, on the runtime that accepted it or handed over to a worker's.
enum Accepted {
    Here(tokio::net::TcpStream),
    HandedOver(std::net::TcpStream),
}

/// A request's body as the handlers take it. A request without one (a GET, as nearly all are)
/// gets the empty body, which takes no allocation; hyper's would be boxed.
fn body_of(incoming: hyper::body::Incoming) -> axum::body::Body {
    match http_body::Body::is_end_stream(&incoming) {
        true => axum::body::Body::empty(),
        false => axum::body::Body::new(incoming),
    }
}

/// What a connection has under way: requests not yet answered to the end of their response
/// bodies, and when the last began or ended.
struct Activity {
    born: tokio::time::Instant,
    under_way: std::sync::atomic::AtomicUsize,
    /// Of those, the requests whose response's head is not yet made.
    unanswered: std::sync::atomic::AtomicUsize,
    /// Milliseconds from `born` to the last beginning or end of a request.
    last_ms: std::sync::atomic::AtomicU64,
    /// The watched bodies under way ([`Sending`], [`LoggedBody`]), each kept by its body and
    /// here (one kept here alone is over).
    sending: std::sync::Mutex<Vec<std::sync::Arc<Sending>>>,
}

/// Where a watched response body ([`LoggedBody`]) is: the milliseconds from its connection's
/// `born` to when the connection took its last frame and has not asked for the next since, or
/// [`Sending::ASKED`] while the connection waits for the body.
struct Sending(std::sync::atomic::AtomicU64);

impl Sending {
    const ASKED: u64 = u64::MAX;
}

/// Forgets the bodies that are over: kept by the list alone.
fn forget_bodies_over(bodies: &mut Vec<std::sync::Arc<Sending>>) {
    bodies.retain(|body| std::sync::Arc::strong_count(body) > 1);
}

/// A request under way on a connection ([`Activity::begin`]), until it is dropped: with its
/// response's body ([`LoggedBody`]), when that is over (sent, or given up). A connection
/// sending a long body is not idle (asked to finish mid-body, it lost an HTTP/1 client's
/// pipelined request and made an HTTP/2 client open another connection).
struct UnderWay {
    activity: std::sync::Arc<Activity>,
    /// Whether its response's head is made ([`UnderWay::answered`]).
    answered: bool,
}

impl Activity {
    fn new() -> Self {
        Self {
            born: tokio::time::Instant::now(),
            under_way: 0.into(),
            unanswered: 0.into(),
            last_ms: 0.into(),
            sending: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Milliseconds since `born` (below [`Sending::ASKED`]).
    fn now_ms(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_millis()).unwrap_or(Sending::ASKED - 1)
    }

    fn touch(&self) {
        self.last_ms.store(self.now_ms(), std::sync::atomic::Ordering::Relaxed);
    }

    fn bodies(&self) -> std::sync::MutexGuard<'_, Vec<std::sync::Arc<Sending>>> {
        // A plain list: consistent whenever the lock is released (a poisoned lock is taken
        // over as is).
        self.sending.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A body whose first frame was just taken, watched from now on ([`Self::stalled`]).
    fn sending(&self) -> std::sync::Arc<Sending> {
        let sending = std::sync::Arc::new(Sending(self.now_ms().into()));
        let mut bodies = self.bodies();
        // Bodies that are over go when the list would grow, not only when it is checked: a busy
        // HTTP/2 connection begins many between two checks.
        if bodies.len() == bodies.capacity() {
            forget_bodies_over(&mut bodies);
        }
        bodies.push(sending.clone());
        drop(bodies);
        sending
    }

    /// Whether a body under way has waited `limit` or longer for the connection to ask for
    /// more of it: the client has not taken what it was sent (HTTP/1: the socket's buffers
    /// are full; HTTP/2: the stream's or the connection's window is closed). Bodies that are
    /// over are forgotten here.
    fn stalled(&self, limit: Duration) -> bool {
        let limit = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
        let now = self.now_ms();
        let mut bodies = self.bodies();
        forget_bodies_over(&mut bodies);
        bodies.iter().any(|body| {
            let taken = body.0.load(std::sync::atomic::Ordering::Relaxed);
            taken != Sending::ASKED && now.saturating_sub(taken) >= limit
        })
    }

    fn begin(this: &std::sync::Arc<Self>) -> UnderWay {
        this.under_way.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        this.unanswered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        this.touch();
        UnderWay {
            activity: this.clone(),
            answered: false,
        }
    }

    /// Whether a request waits for its response's head.
    fn waiting(&self) -> bool {
        self.unanswered.load(std::sync::atomic::Ordering::Relaxed) > 0
    }

    /// Whether no request is under way.
    fn nothing_under_way(&self) -> bool {
        self.under_way.load(std::sync::atomic::Ordering::Relaxed) == 0
    }

    /// `None` when nothing has been under way for `idle`; else when to ask again: at most
    /// `check` (no more than `idle`) from now, so that a request begun meanwhile is checked on
    /// as often.
    fn busy_until(&self, idle: Duration, check: Duration) -> Option<tokio::time::Instant> {
        let last = self.born + Duration::from_millis(self.last_ms.load(std::sync::atomic::Ordering::Relaxed));
        let until = last + idle;
        let now = tokio::time::Instant::now();
        match (self.nothing_under_way(), until > now) {
            (true, false) => None,
            (_, true) => Some(until.min(now + check)),
            (false, false) => Some(now + check),
        }
    }
}

impl UnderWay {
    /// Its response's head is made: the request no longer waits for its answer.
    fn answered(&mut self) {
        if !std::mem::replace(&mut self.answered, true) {
            self.activity
                .unanswered
                .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

impl Drop for UnderWay {
    fn drop(&mut self) {
        self.answered();
        self.activity
            .under_way
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        self.activity.touch();
    }
}

/// Not unix: hyper's own check for a client hanging up is on, and this is never ready.
#[cfg(not(unix))]
struct HangUp;

#[cfg(not(unix))]
impl HangUp {
    fn new(_: &tokio::net::TcpStream) -> Self {
        Self
    }

    fn poll(&mut self, _: &mut std::task::Context<'_>, _: bool) -> std::task::Poll<()> {
        std::task::Poll::Pending
    }
}

/// Watches a connection's socket for its client hanging up (or shutting its sending side, which
/// hyper took for the same), while a request waits for its answer: through a second descriptor
/// of the socket, registered with the runtime for that time only (a request answered at its
/// first poll, a cached tile, costs nothing). A request whose head is answered and whose body
/// is under way finds a hang-up when its body is next written.
#[cfg(unix)]
struct HangUp {
    /// The connection's socket, owned by hyper's connection.
    socket: std::os::fd::RawFd,
    watch: Option<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>>,
    /// The socket could not be watched for the request waiting now (out of descriptors, say):
    /// not tried again until no request waits.
    unwatchable: bool,
}

#[cfg(unix)]
impl HangUp {
    fn new(tcp: &tokio::net::TcpStream) -> Self {
        Self {
            socket: std::os::fd::AsRawFd::as_raw_fd(tcp),
            watch: None,
            unwatchable: false,
        }
    }

    /// Ready once the client has hung up while a request is `waiting`. Polled only while the
    /// connection (and so its socket) is open: after the connection's own poll said so.
    fn poll(&mut self, cx: &mut std::task::Context<'_>, waiting: bool) -> std::task::Poll<()> {
        use std::task::Poll;
        if !waiting {
            (self.watch, self.unwatchable) = (None, false);
            return Poll::Pending;
        }
        if self.unwatchable {
            return Poll::Pending;
        }
        let watch = match &mut self.watch {
            Some(watch) => watch,
            None => {
                // SAFETY: `socket` is the descriptor of the connection's TcpStream, which
                // hyper's connection owns and keeps open while it is pending, as it is whenever
                // this is polled; it is only duplicated here, never closed.
                let socket = unsafe { std::os::fd::BorrowedFd::borrow_raw(self.socket) };
                let watch = socket.try_clone_to_owned().and_then(|fd| {
                    // SAFETY: the OwnedFd, which the AsyncFd owns, keeps its descriptor open.
                    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
                        .map_err(std::io::Error::from)
                });
                match watch {
                    Ok(watch) => self.watch.insert(watch),
                    Err(e) => {
                        tracing::debug!(error = %e, "cannot watch a connection for its client hanging up");
                        self.unwatchable = true;
                        return Poll::Pending;
                    }
                }
            }
        };
        // Bytes that arrive (an HTTP/2 frame, a pipelined request) are no hang-up: their
        // readiness is cleared, and the next event waited for.
        while let Poll::Ready(ready) = watch.poll_read_ready(cx) {
            let Ok(mut guard) = ready else {
                self.unwatchable = true;
                return Poll::Pending;
            };
            if guard.ready().is_read_closed() || guard.ready().is_error() {
                return Poll::Ready(());
            }
            guard.clear_ready();
        }
        Poll::Pending
    }
}

/// How long after the shutdown signal, or after it was asked to finish for having had no
/// request under way for the header read timeout, a connection with still none under way is
/// dropped, even if it holds part of a request's head (at most the header read timeout).
const SHUTDOWN_HEAD_GRACE: Duration = Duration::from_secs(1);

/// How long a client may take to send a request's head, and a keep-alive connection may stay
/// idle between requests.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// SIGTERM and SIGINT (Ctrl-C) as a count that goes up with each: listened for from when this
/// is called (on a runtime), so that a signal arriving before anything waits for it is not lost,
/// and seen by every receiver (the server, its health listener, the second signal's watch).
pub fn shutdown_signals() -> tokio::sync::watch::Receiver<u32> {
    let (count, counted) = tokio::sync::watch::channel(0u32);
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        // Registered here, not when first polled.
        let (term, int) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()));
        tokio::spawn(async move {
            let (mut term, mut int) = match (term, int) {
                (Ok(term), Ok(int)) => (term, int),
                _ => return std::future::pending().await,
            };
            loop {
                tokio::select! {
                    _ = term.recv() => {},
                    _ = int.recv() => {},
                }
                count.send_modify(|n| *n += 1);
            }
        });
    }
    #[cfg(not(unix))]
    tokio::spawn(async move {
        while tokio::signal::ctrl_c().await.is_ok() {
            count.send_modify(|n| *n += 1);
        }
        std::future::pending::<()>().await
    });
    counted
}

/// Resolves once `signals` ([`shutdown_signals`]) has counted `n` of them.
pub async fn signalled(mut signals: tokio::sync::watch::Receiver<u32>, n: u32) {
    if signals.wait_for(|&count| count >= n).await.is_err() {
        std::future::pending::<()>().await;
    }
}
