//! The router and the server loop.
//!
//! `app(state)` builds the whole service so tests can drive it with `oneshot`; `run` serves it
//! on a listener until `shutdown` resolves, letting requests in flight finish.

use std::future::Future;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, Method, header};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{any, get, post};
use tokio::net::TcpListener;
use tower_http::cors::{AllowOrigin, CorsLayer};

use crate::http::{api, raw, slice, zom};
use crate::state::AppState;

/// Headers a browser client may read from our responses.
const EXPOSED: [&str; 7] = [
    "content-range",
    "content-length",
    "etag",
    "accept-ranges",
    "last-modified",
    "x-zarr-shape",
    "x-zarr-dtype",
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
        .allow_headers([
            header::RANGE,
            header::IF_MATCH,
            header::IF_NONE_MATCH,
            header::IF_MODIFIED_SINCE,
            header::IF_RANGE,
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            header::ACCEPT,
        ])
        .expose_headers(EXPOSED.map(HeaderName::from_static))
        .max_age(Duration::from_secs(3600))
}

/// One log line per request (method, path, Range, status, bytes, milliseconds) and the
/// request metrics.
async fn access_log(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let start = Instant::now();
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let range = request
        .headers()
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let response = next.run(request).await;
    // Bodies built in memory get their Content-Length from hyper later; their size is exact.
    let bytes = response
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .or_else(|| http_body::Body::size_hint(response.body()).exact());
    tracing::info!(
        target: "zarrgate::access",
        %method,
        path,
        range = range.as_deref().unwrap_or("-"),
        status = response.status().as_u16(),
        bytes = bytes.unwrap_or(0),
        ms = start.elapsed().as_secs_f64() * 1e3,
    );
    state
        .metrics
        .observe(&path, response.status().as_u16(), start.elapsed());
    response
}

/// The whole HTTP service.
pub fn app(state: AppState) -> Router {
    let cors = cors(&state.config.server.cors_origins);
    Router::new()
        .route("/", get(api::index))
        .route("/healthz", get(api::healthz))
        .route("/api/v1/mounts", get(api::mounts))
        .route("/api/v1/slice/{mount}/{*path}", get(slice::slice))
        .route("/metrics", get(api::metrics))
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
        .with_state(state.clone())
        .layer(cors)
        .layer(middleware::from_fn_with_state(state, access_log))
}

/// Serves `app(state)` on `listener` until `shutdown` resolves.
pub async fn run(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, app(state)).with_graceful_shutdown(shutdown).await
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    tracing::info!("shutting down");
}
