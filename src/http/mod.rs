//! Route handlers, one file per route family.

pub mod api;
pub mod raw;
pub mod slice;
pub mod zom;

/// A route's query parameters: unknown ones are 400, so that a misspelt one is not ignored,
/// but for `_` (the cache buster JavaScript clients add, as often as they like), which every
/// route ignores.
pub(crate) fn query<T: serde::de::DeserializeOwned>(uri: &axum::http::Uri) -> Result<T, crate::error::ApiError> {
    let buster = |pair: &&str| {
        let name = pair.split('=').next().unwrap_or_default();
        percent_encoding::percent_decode_str(name).eq(*b"_")
    };
    let query = uri.query().unwrap_or("");
    let parsed = if query.split('&').any(|p| buster(&p)) {
        let kept: Vec<&str> = query.split('&').filter(|p| !buster(p)).collect();
        serde_urlencoded::from_str(&kept.join("&"))
    } else {
        serde_urlencoded::from_str(query)
    };
    parsed.map_err(|e| crate::error::ApiError::BadRequest(format!("bad query: {e}")))
}

/// A response builder whose header map has room for a response's own headers and for those the
/// CORS layer adds to it. A map created empty holds six before it grows, and growing it as the
/// CORS layer extended it was ~5% of a warm tile's CPU at 64 connections.
pub(crate) fn response() -> axum::http::response::Builder {
    let mut builder = axum::http::Response::builder();
    if let Some(headers) = builder.headers_mut() {
        headers.reserve(12);
    }
    builder
}

/// Appends a header to a response being built. `Builder::header` moves the whole builder
/// through a `Result` at each call and converts its arguments: a warm tile's five headers
/// took ~2k instructions that way.
pub(crate) fn append(
    builder: &mut axum::http::response::Builder,
    name: axum::http::HeaderName,
    value: axum::http::HeaderValue,
) {
    if let Some(headers) = builder.headers_mut() {
        headers.append(name, value);
    }
}

/// Runs a request's `work` as a task of its own, aborted when the request is dropped (its
/// timeout, or its client gone). Work that reads without waiting (local documents in the page
/// cache) uses up tokio's cooperative budget as it goes: run in the request's own task, it
/// would leave none for the request timeout's timer, which could then not fire until the work
/// was done.
pub(crate) async fn own_task<T: Send + 'static>(
    work: impl Future<Output = Result<T, crate::error::ApiError>> + Send + 'static,
) -> Result<T, crate::error::ApiError> {
    joined(tokio_util::task::AbortOnDropHandle::new(tokio::spawn(work)).await)?
}

/// The outcome of a task the request waited for. A panic goes on in the request's own task, so
/// that the server's panic layer answers 500 and logs it as it does a handler's.
pub(crate) fn joined<T>(outcome: Result<T, tokio::task::JoinError>) -> Result<T, crate::error::ApiError> {
    match outcome {
        Ok(t) => Ok(t),
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => Err(crate::error::ApiError::Internal),
    }
}
