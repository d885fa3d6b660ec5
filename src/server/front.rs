//! The front every request passes (access log, CORS, guard, concurrency limit, timeout) and the
//! routes behind it.

use super::access_log::AccessLogRecord;
use super::access_log::LoggedBody;
use super::activity::InFlightRequest;
use super::cors::EXPOSED;
use super::cors::cors;
use super::cors::vary_as_cors;
use super::limits::ConcurrencyLimit;
use super::limits::ConcurrencyPermit;
use crate::auth::signed_url::SIGNED;
use crate::auth::{Refusal, bearer};
use crate::error::ApiError;
use crate::http::{api, compress, raw, slice, zom};
use crate::state::AppState;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, header};
use axum::response::IntoResponse;
use axum::response::Response;
use axum::routing::{any, get, post};
use axum::{BoxError, Router};
use futures::FutureExt;
use std::future::Future;
use std::time::Duration;
use tower::{Layer, ServiceExt};
use tower_http::cors::CorsLayer;

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
pub(super) fn finish(response: &mut Response, head: bool) {
    if !head || http_body::Body::size_hint(response.body()).exact() == Some(0) {
        return;
    }
    state_length(response);
    *response.body_mut() = axum::body::Body::empty();
}

/// Adds `Content-Length` to an answer of exact size that has none, as axum's router does to its
/// routes' answers.
pub(super) fn state_length<B: http_body::Body>(response: &mut axum::http::Response<B>) {
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
pub(super) enum Direct {
    Raw,
    Slice,
}

/// Whether `path` is `prefix` followed by a mount's name (a segment that is not empty), as the
/// router's `{prefix}{mount}` routes match.
pub(super) fn names_mount(path: &str, prefix: &str) -> bool {
    path.strip_prefix(prefix)
        .is_some_and(|rest| !rest.is_empty() && !rest.starts_with('/'))
}

/// The mount a request reads, when its route family names one.
pub(super) fn mount_of(path: &str) -> Option<&str> {
    mount_and_rest(path).map(|(mount, _)| mount)
}

/// The mount segment of a path whose route family names one, and the path below it (without
/// its leading slash).
pub(super) fn mount_and_rest(path: &str) -> Option<(&str, &str)> {
    [
        "/zarr/",
        "/api/v1/slice/",
        "/api/v1/zom/",
        "/api/v1/list/",
        "/api/v1/validate/",
        "/api/v1/versions/",
    ]
    .iter()
    .find_map(|prefix| path.strip_prefix(prefix))
    .map(|rest| rest.split_once('/').unwrap_or((rest, "")))
}

/// The answer to a request whose handling panicked: a 500 `internal` JSON answer (logged with
/// the panic's message, which the client never sees), so that a bug costs one request, not the
/// connection and whatever it had under way. Panics of decoding and encoding tasks on the
/// blocking pool come back as failed tasks and are answered the same way.
pub(super) fn panicked(panic: &(dyn std::any::Any + Send)) -> Response {
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
///
/// A reload ([`App::reload`]) puts a front over the new state in its place: requests under way
/// finish with the one they began with, and connections stay open.
#[derive(Clone)]
pub struct App(std::sync::Arc<std::sync::RwLock<std::sync::Arc<Front>>>);

pub(super) struct Front {
    pub(super) state: AppState,
    /// Every route, with no layer around it.
    pub(super) routes: Router,
    /// No origins, no CORS headers at all (nor answers to preflights).
    pub(super) cors: Option<CorsLayer>,
    /// The `Access-Control-Expose-Headers` value of every answer but preflights.
    pub(super) cors_exposed: HeaderValue,
    /// Requests reading mounts, at most `limits.max_concurrent_requests`; one past it is
    /// refused (503).
    pub(super) concurrency: std::sync::Arc<ConcurrencyLimit>,
    pub(super) timeout: Duration,
    /// Whether slices and raw keys are answered without the router ([`Front::dispatch`]).
    pub(super) direct: bool,
    /// The health listener's front ([`serve_health`]): every path but `/healthz` and `/metrics`
    /// is 404 before anything else is looked at (a protected mount's 401 would name it).
    pub(super) health_only: bool,
    /// Whether a mount sets its own `Cache-Control` (`mounts.NAME.cache_control`), or may
    /// answer immutable ones (an Icechunk mount's snapshots).
    pub(super) mount_cache_control: bool,
    /// Where its routes come from, so that a reload can make them over the new state.
    pub(super) route_source: RouteSource,
}

/// The routes of a front: made over its state, or given ready-made (a test's own, which a
/// reload keeps).
#[derive(Clone)]
pub(super) enum RouteSource {
    Made(fn(AppState) -> Router),
    Given(Router),
}

/// The service over the routes of zarrgate.
pub fn app(state: AppState) -> App {
    build(state, routes, true, false)
}

/// The routes of liveness and metrics, which the health listener ([`serve_health`]) serves
/// alone.
pub(super) fn health_routes() -> axum::Router<AppState> {
    Router::new()
        .route("/healthz", get(api::healthz))
        .route("/readyz", get(api::readyz))
        .route("/metrics", get(api::metrics))
}

/// The routes, handlers only ([`app`] is them behind its front).
pub fn routes(state: AppState) -> Router {
    health_routes()
        .route("/", get(api::index))
        .route("/api/v1/mounts", get(api::mounts))
        .route("/api/v1/versions/{mount}", get(api::versions))
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
    App::new(make_front(state, RouteSource::Given(routes), false, false, None))
}

/// The front over `state` and the routes `make_routes` makes over it.
pub(super) fn build(state: AppState, make_routes: fn(AppState) -> Router, direct: bool, health_only: bool) -> App {
    App::new(make_front(
        state,
        RouteSource::Made(make_routes),
        direct,
        health_only,
        None,
    ))
}

/// The front over `state` and the routes of `route_source`.
fn make_front(
    state: AppState,
    route_source: RouteSource,
    direct: bool,
    health_only: bool,
    concurrency: Option<std::sync::Arc<ConcurrencyLimit>>,
) -> Front {
    let server = &state.config.server;
    let limits = &state.config.limits;
    let routes = match &route_source {
        RouteSource::Made(make) => make(state.clone()),
        RouteSource::Given(routes) => routes.clone(),
    };
    Front {
        cors: (!server.cors_origins.is_empty()).then(|| cors(&server.cors_origins)),
        cors_exposed: HeaderValue::from_str(&EXPOSED.join(",")).unwrap_or(HeaderValue::from_static("")),
        // Kept across a reload that leaves it as it is: requests under way hold its permits.
        concurrency: concurrency
            .filter(|c| c.limit() == limits.max_concurrent_requests)
            .unwrap_or_else(|| std::sync::Arc::new(ConcurrencyLimit::new(limits.max_concurrent_requests))),
        timeout: Duration::from_secs_f64(limits.request_timeout_s),
        direct,
        health_only,
        mount_cache_control: state
            .mounts
            .values()
            .any(|m| m.cache_control.is_some() || m.repository.is_some()),
        route_source,
        routes,
        state,
    }
}

impl App {
    fn new(front: Front) -> Self {
        Self(std::sync::Arc::new(std::sync::RwLock::new(std::sync::Arc::new(front))))
    }

    /// The front serving new requests.
    pub(super) fn current(&self) -> std::sync::Arc<Front> {
        self.0.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// The state new requests are served with.
    pub fn state(&self) -> AppState {
        self.current().state.clone()
    }

    /// Serves `state` from now on (SIGHUP): new requests get a front over it, with routes
    /// made anew; those under way finish with the state they began with.
    pub fn reload(&self, state: AppState) {
        let now = self.current();
        let front = make_front(
            state,
            now.route_source.clone(),
            now.direct,
            now.health_only,
            Some(now.concurrency.clone()),
        );
        *self.0.write().unwrap_or_else(std::sync::PoisonError::into_inner) = std::sync::Arc::new(front);
    }

    /// Answers `request`; `in_flight` (the connection's mark of it) is held until the
    /// response's body is over.
    pub(super) async fn serve(
        self,
        request: Request,
        in_flight: Option<InFlightRequest>,
    ) -> axum::http::Response<LoggedBody> {
        let front = self.current();
        let mut done = AccessLogRecord::begin(&front.state, &request, in_flight);
        let head = request.method() == Method::HEAD;
        let mut response = front.answer(request).await;
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
/// reading mounts, its permit and deadline.
pub(super) struct Routed<'a> {
    pub(super) answer: futures::future::BoxFuture<'static, Response>,
    pub(super) limit: Option<Limit<'a>>,
}

/// The permit ([`ConcurrencyLimit`]) and the deadline (`limits.request_timeout_s`) of a request
/// reading mounts.
pub(super) struct Limit<'a> {
    pub(super) _permit: ConcurrencyPermit<'a>,
    pub(super) deadline: tokio::time::Instant,
    /// Made when the answer first waits. Most answers (a cached tile) are ready at their first
    /// poll: they need no timer, whose making and dropping clones and drops the runtime's
    /// handle. The deadline is set before, as if the timer had been.
    pub(super) timer: Option<std::pin::Pin<Box<tokio::task::coop::Unconstrained<tokio::time::Sleep>>>>,
    /// `limits.request_timeout_s` as written (the `Duration` is rounded to nanoseconds).
    pub(super) seconds: f64,
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

/// Marks an HTTP/1.1 request that came with no `Host` field or with several.
#[derive(Clone, Copy)]
pub(super) struct NoSingleHost;

/// RFC 9112 section 3.2: an HTTP/1.1 request with no Host field, or with more than one, is
/// answered 400 (hyper serves it). Marked where the request came over a connection (one made
/// in-process names no host), and refused by the front.
pub(super) fn mark_host<B>(request: &mut hyper::Request<B>) {
    if request.version() == hyper::Version::HTTP_11 {
        let mut hosts = request.headers().get_all(header::HOST).iter();
        if hosts.next().is_none() || hosts.next().is_some() {
            request.extensions_mut().insert(NoSingleHost);
        }
    }
}

/// The `Cache-Control` of answers that state none.
pub(super) const NO_CACHE: HeaderValue = HeaderValue::from_static("no-cache");

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
    pub(super) fn answer(&self, request: Request) -> impl Future<Output = Response> + Send + '_ {
        let request = self.unsigned(request);
        // While draining, an HTTP/1 connection is closed after each answer, so that its client
        // connects anew: past a load balancer that no longer sends it here.
        let close = request.version() <= axum::http::Version::HTTP_11 && self.state.lifecycle.draining();
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
        // The `Cache-Control` of the mount read, for its successful answers (errors stay
        // `no-cache`: a CDN keeping a 404 or a 503 for an hour serves it for an hour).
        // Not for a signed URL's answers: a shared cache would keep them past the URL's expiry.
        let signed = request.extensions().get::<SignedRequest>().is_some();
        let mount_cache_control = match self.mount_cache_control && !signed {
            true => mount_of(request.uri().path()).and_then(|segment| self.state.cache_control_of(segment)),
            false => None,
        };
        futures::future::Either::Left(self.guarded(request).map(move |mut response| {
            let status = response.status();
            let headers = response.headers_mut();
            if let Some(value) = mount_cache_control
                && (status.is_success() || status == axum::http::StatusCode::NOT_MODIFIED)
            {
                headers.entry(header::CACHE_CONTROL).or_insert(value);
            }
            // An answer that does not say how it may be cached (a slice, a hierarchy, a listing)
            // is `no-cache`, as raw keys and errors are: a shared cache would otherwise keep it
            // for a heuristic lifetime of its own (CloudFront: a day), past the staleness bound
            // docs/operations.md states.
            headers.entry(header::CACHE_CONTROL).or_insert(NO_CACHE);
            if close {
                headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
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
    pub(super) fn allowed(&self, origin: Option<&HeaderValue>) -> Option<HeaderValue> {
        if self.any_origin() {
            return Some(HeaderValue::from_static("*"));
        }
        let origins = &self.state.config.server.cors_origins;
        origin
            .filter(|origin| origins.iter().any(|o| o.as_bytes() == origin.as_bytes()))
            .cloned()
    }

    /// Whether every origin is allowed (`"*"`).
    pub(super) fn any_origin(&self) -> bool {
        self.state.config.server.cors_origins.iter().any(|o| o == "*")
    }

    /// [`Front::routed`], a panic of which is answered as [`panicked`] says (with CORS
    /// headers as any answer, so that a page can read it): one in the checks and routing done
    /// as its future is made, or one while it is polled.
    pub(super) fn guarded(&self, request: Request) -> impl Future<Output = Response> + Send + '_ {
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
    pub(super) fn routed(
        &self,
        request: Request,
    ) -> futures::future::Either<futures::future::Ready<Response>, Routed<'_>> {
        use futures::future::{Either, ready};
        // Liveness and metrics: never refused for load, and all the health listener answers.
        let health = matches!(request.uri().path(), "/healthz" | "/readyz" | "/metrics");
        if self.health_only && !health {
            let refused = ApiError::NotFound("this listener answers /healthz, /readyz and /metrics alone".into());
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
        let Some(permit) = self.concurrency.try_acquire() else {
            return Either::Left(ready(ApiError::Overloaded.into_response()));
        };
        Either::Right(Routed {
            answer: self.dispatch(request),
            limit: Some(Limit {
                _permit: permit,
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
    pub(super) fn dispatch(&self, request: Request) -> futures::future::BoxFuture<'static, Response> {
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
    pub(super) fn through_router(&self, request: Request) -> futures::future::BoxFuture<'static, Response> {
        let path = request.uri().path();
        let coding = match path.starts_with("/zarr/") || path.starts_with("/api/v1/slice/") {
            true => None,
            false => Some(self.state.compression.wanted(request.headers())),
        };
        let method = request.method().clone();
        let state = self.state.clone();
        let answer = self.routes.clone().oneshot(request);
        answer
            .map(move |r| {
                let response = r.unwrap_or_else(|e| match e {});
                match coding {
                    Some(coding) => compress::apply(&state.compression, &method, coding, response),
                    None => response,
                }
            })
            .boxed()
    }

    /// Whether `request` may reach a handler: its URL is not too long, and it presents the
    /// token its mount or /metrics needs.
    pub(super) fn admits(&self, request: &Request) -> Result<(), ApiError> {
        if request.extensions().get::<NoSingleHost>().is_some() {
            return Err(ApiError::BadRequest(
                "an HTTP/1.1 request must have exactly one Host field".into(),
            ));
        }
        let max = self.state.config.limits.max_url_bytes;
        if request.uri().path_and_query().map_or(0, |pq| pq.as_str().len()) > max {
            return Err(ApiError::UriTooLong(max));
        }
        if let Some(SignedRequest(verdict)) = request.extensions().get::<SignedRequest>() {
            return verdict.clone().map_err(ApiError::SignedUrl);
        }
        let path = request.uri().path();
        let token = bearer(request.headers());
        if path == "/metrics" {
            let allowed = self
                .state
                .metrics_token
                .as_ref()
                .is_none_or(|t| token.is_some_and(|b| t.matches(b)));
            return if allowed { Ok(()) } else { Err(ApiError::Unauthorized) };
        }
        // The handlers' own lookup (which percent-decodes the segment), so that no spelling
        // of a protected mount's name passes here and reaches it there.
        let Some(mount) = mount_of(path).and_then(|segment| self.state.mount(segment).ok()) else {
            return Ok(());
        };
        mount.admits(&self.state.auth, token).map_err(|refusal| match refusal {
            Refusal::Missing => ApiError::Unauthorized,
            Refusal::InvalidToken(why) => ApiError::InvalidToken(why),
            Refusal::InsufficientScope(scope) => ApiError::InsufficientScope(scope),
        })
    }

    /// A request under `/signed/{expires}.{signature}/` made the request it stands for (the
    /// rest of its path, with its query), marked with the signature's verdict ([`admits`]
    /// answers a refusal, and lets an admitted one read its mount whatever credentials
    /// the mount asks for). Other requests are left as they are.
    ///
    /// [`admits`]: Front::admits
    pub(super) fn unsigned(&self, mut request: Request) -> Request {
        let Some(after) = request.uri().path().strip_prefix(SIGNED) else {
            return request;
        };
        let (token, inner) = after.split_once('/').unwrap_or((after, ""));
        let inner = format!("/{inner}");
        let mount_and_rest = mount_and_rest(&inner)
            .and_then(|(segment, rest)| Some((self.state.mount(segment).ok()?.name.clone(), rest.to_owned())));
        let verdict = match (&self.state.auth.signing_key, mount_and_rest) {
            (None, _) => Err(crate::auth::SignedUrlError::Disabled),
            (Some(_), None) => Err(crate::auth::SignedUrlError::Malformed),
            (Some(key), Some((mount, rest))) => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                key.check(token, &mount, &rest, now)
            }
        };
        let target = match request.uri().query() {
            Some(query) => format!("{inner}?{query}"),
            None => inner,
        };
        match target.parse::<axum::http::Uri>() {
            Ok(uri) => *request.uri_mut() = uri,
            Err(_) => {
                request
                    .extensions_mut()
                    .insert(SignedRequest(Err(crate::auth::SignedUrlError::Malformed)));
                return request;
            }
        }
        request.extensions_mut().insert(SignedRequest(verdict));
        request
    }
}

/// The verdict on a signed URL's signature, for the request it stood for ([`Front::unsigned`]).
#[derive(Clone)]
pub(super) struct SignedRequest(Result<(), crate::auth::SignedUrlError>);
