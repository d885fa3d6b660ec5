//! Small JSON routes: mounts, health, the web page.

use axum::Json;
use axum::extract::State;
use axum::http::{Method, header};
use axum::response::{Html, IntoResponse, Response};
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::state::AppState;

/// `GET /api/v1/mounts`: the mounts this caller may read (protected ones need their token), so
/// the answer varies with `Authorization`. A mount's URL (a local path, a bucket) is shown to
/// callers that presented its token, or to all with `server.show_mount_urls`.
pub async fn mounts(
    State(state): State<AppState>,
    uri: axum::http::Uri,
    headers: axum::http::HeaderMap,
) -> Result<impl IntoResponse, ApiError> {
    let [] = super::query(&uri, [])?;
    let token = crate::auth::bearer(&headers);
    let show_all = state.config.server.show_mount_urls;
    let list: Vec<Value> = state
        .mounts
        .values()
        .filter(|m| m.admits(&state.auth, token).is_ok())
        .map(|m| {
            let mut entry = json!({"name": m.name, "kind": m.kind, "consolidated": m.consolidated});
            // Listed and protected: the caller presented credentials the mount accepts.
            if show_all || !m.access.is_public() {
                entry["url"] = json!(m.url);
            }
            entry
        })
        .collect();
    Ok(([(header::VARY, "authorization")], Json(json!({ "mounts": list }))))
}

/// `GET /api/v1/versions/{mount}`: an Icechunk mount's branches and tags with the snapshots
/// they point to, and the recent snapshots of each branch (id, time, message, parent), newest
/// first. Branches move: the answer is `no-cache` whatever the mount's `cache_control`.
pub async fn versions(State(state): State<AppState>, uri: axum::http::Uri) -> Result<Response, ApiError> {
    let [] = super::query(&uri, [])?;
    let segment = uri.path().strip_prefix("/api/v1/versions/").unwrap_or("");
    let segment = segment.strip_suffix('/').unwrap_or(segment);
    if segment.contains('/') {
        return Err(ApiError::NotFound("no such route".into()));
    }
    let (mount, version) = state.mount_and_version(segment)?;
    let Some(repository) = &mount.repository else {
        return Err(ApiError::UnknownVersion(format!(
            "mount '{}' has no versions (only Icechunk mounts do)",
            mount.name
        )));
    };
    if version.is_some() {
        return Err(ApiError::NotFound("no such route".into()));
    }
    let versions = repository.versions().await?;
    let mut body = serde_json::to_value(&*versions).map_err(|_| ApiError::Internal)?;
    body["mount"] = json!(mount.name);
    Ok(([(header::CACHE_CONTROL, "no-cache")], Json(body)).into_response())
}

/// `GET /metrics`: OpenMetrics text when the `Accept` header asks for it (Prometheus does),
/// else the Prometheus text format 0.0.4 (curl, older scrapers).
pub async fn metrics(State(state): State<AppState>, headers: axum::http::HeaderMap) -> impl IntoResponse {
    // Sizes and counts of the caches as of now (moka applies insertions and evictions in
    // batches).
    state.caches.settle().await;
    let text = state.metrics.render(&state.caches);
    let accept = super::header_list(&headers, header::ACCEPT);
    let (content_type, text) = match crate::metrics::wants_openmetrics(accept.as_deref()) {
        true => ("application/openmetrics-text; version=1.0.0; charset=utf-8", text),
        false => (
            "text/plain; version=0.0.4; charset=utf-8",
            crate::metrics::prometheus_text(&text),
        ),
    };
    ([(header::CONTENT_TYPE, content_type), (header::VARY, "accept")], text)
}

/// `GET /healthz`
pub async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// `GET /readyz`: 200 while the server takes traffic; 503 while it drains (after SIGTERM) or
/// waits for a JWT key set, so that load balancers send it nothing.
pub async fn readyz(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    state.ready().map_err(ApiError::NotReady)?;
    Ok(Json(json!({"status": "ready"})))
}

/// `GET /`: the web page, embedded in the binary (`no-cache`, as every answer that states no
/// other: the front adds it).
pub async fn index() -> impl IntoResponse {
    Html(include_str!("../../static/index.html"))
}

/// Unknown routes.
pub async fn not_found() -> ApiError {
    ApiError::NotFound("no such route".into())
}

/// Known routes, wrong method. Validation takes POST; every other route reads. OPTIONS (but
/// for a CORS preflight, which the CORS layer answers) gets the methods.
pub async fn method_not_allowed(method: Method, uri: axum::http::Uri) -> Response {
    let allow = if uri.path().starts_with("/api/v1/validate/") {
        "POST, OPTIONS"
    } else {
        super::raw::ALLOW
    };
    if method == Method::OPTIONS {
        return super::options(allow);
    }
    ApiError::MethodNotAllowed {
        method: method.to_string(),
        allow,
    }
    .into_response()
}
