//! Errors as the HTTP client sees them.
//!
//! Every layer has its own error enum; they meet here in [`ApiError`], whose `IntoResponse`
//! maps each variant to a status and a JSON body `{"error": {"code", "message"}}` with a full
//! match. Messages of 5xx errors never carry internals: those are logged instead.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::store::{KeyError, StoreError};

/// An error answered to an HTTP client.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The request is malformed (bad selection, unknown format, bad parameter).
    #[error("{0}")]
    BadRequest(String),
    /// The path cannot name anything inside a mount.
    #[error("invalid path: {0}")]
    InvalidPath(#[from] KeyError),
    /// No mount of that name.
    #[error("no mount named '{0}'")]
    UnknownMount(String),
    /// No key, node or array at that path.
    #[error("{0}")]
    NotFound(String),
    /// A version an Icechunk mount does not hold, or a version on a mount that has none.
    #[error("{0}")]
    UnknownVersion(String),
    /// The mount needs a bearer token this request did not present.
    #[error("this resource needs a valid bearer token")]
    Unauthorized,
    /// The bearer token is neither one of the mount's nor a valid JWT (RFC 6750
    /// `invalid_token`); the reason names no secret.
    #[error("the bearer token is not accepted: {0}")]
    InvalidToken(&'static str),
    /// A valid JWT without the scope the mount needs (RFC 6750 `insufficient_scope`).
    #[error("the bearer token lacks the scope '{0}'")]
    InsufficientScope(String),
    /// A signed URL that does not admit the request.
    #[error("{0}")]
    SignedUrl(crate::auth::SignedUrlError),
    /// The server is not ready for traffic (`/readyz`): draining, or a key set not read yet.
    #[error("not ready: {0}")]
    NotReady(&'static str),
    /// The request target is longer than allowed.
    #[error("the request URL is longer than {0} bytes")]
    UriTooLong(usize),
    /// Too many requests in flight.
    #[error("the server is busy; retry shortly")]
    Overloaded,
    /// The request took longer than allowed.
    #[error("the request took longer than {0} s")]
    Timeout(f64),
    /// The method is not allowed on this route.
    #[error("method {method} is not allowed here")]
    MethodNotAllowed { method: String, allow: &'static str },
    /// `If-Match` did not match.
    #[error("precondition failed")]
    PreconditionFailed,
    /// The byte range cannot be served from an object of this size.
    #[error("range not satisfiable for an object of {size} bytes")]
    RangeNotSatisfiable { size: u64 },
    /// The response would exceed a configured limit.
    #[error("{0}")]
    TooLarge(String),
    /// The data uses a codec or data type this server cannot decode.
    #[error("{0}")]
    Unsupported(String),
    /// The upstream store refused our credentials.
    #[error("the upstream store denied access")]
    UpstreamDenied,
    /// A reference of a reference mount points outside the mount's `virtual_prefixes` (a
    /// configuration matter, not the client's: 502).
    #[error("{0}")]
    ReferenceNotAllowed(String),
    /// The upstream store failed.
    #[error("the upstream store failed")]
    Upstream,
    /// The upstream store did not answer in time.
    #[error("the upstream store timed out")]
    UpstreamTimeout,
    /// Stored bytes do not decode. The key is safe to show: the client asked for it.
    #[error("stored data at '{key}' could not be decoded")]
    CorruptData { key: String },
    /// A stored metadata document is not valid metadata (code `corrupt_data`, as other stored
    /// bytes that do not decode). The reason speaks of the document's own fields, which anyone
    /// who may ask can read at its raw key, so it is shown.
    #[error("the metadata at '{key}' is invalid: {reason}")]
    InvalidMetadata { key: String, reason: String },
    /// A bug or an unexpected condition; details go to the log only.
    #[error("internal error")]
    Internal,
}

/// The most characters of a reason [`ApiError::invalid_metadata`] shows: a document's values
/// can be megabytes (a fill value, a codec), and errors are not cached.
const MAX_REASON_CHARS: usize = 300;

impl ApiError {
    /// [`ApiError::InvalidMetadata`], its reason cut to [`MAX_REASON_CHARS`] characters.
    pub fn invalid_metadata(key: impl Into<String>, reason: &str) -> Self {
        let reason = match reason.char_indices().nth(MAX_REASON_CHARS) {
            Some((at, _)) => format!("{}...", &reason[..at]),
            None => reason.to_owned(),
        };
        ApiError::InvalidMetadata {
            key: key.into(),
            reason,
        }
    }

    /// The HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) | ApiError::InvalidPath(_) => StatusCode::BAD_REQUEST,
            ApiError::UnknownMount(_) | ApiError::NotFound(_) | ApiError::UnknownVersion(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Unauthorized | ApiError::InvalidToken(_) => StatusCode::UNAUTHORIZED,
            ApiError::InsufficientScope(_) | ApiError::SignedUrl(_) => StatusCode::FORBIDDEN,
            ApiError::NotReady(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::UriTooLong(_) => StatusCode::URI_TOO_LONG,
            ApiError::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ApiError::PreconditionFailed => StatusCode::PRECONDITION_FAILED,
            ApiError::RangeNotSatisfiable { .. } => StatusCode::RANGE_NOT_SATISFIABLE,
            ApiError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Unsupported(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::UpstreamDenied | ApiError::Upstream | ApiError::ReferenceNotAllowed(_) => StatusCode::BAD_GATEWAY,
            ApiError::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
            ApiError::CorruptData { .. } | ApiError::InvalidMetadata { .. } | ApiError::Internal => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }

    /// The stable, machine-readable error code.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::BadRequest(_) => "bad_request",
            ApiError::InvalidPath(_) => "invalid_path",
            ApiError::UnknownMount(_) => "unknown_mount",
            ApiError::NotFound(_) => "not_found",
            ApiError::UnknownVersion(_) => "unknown_version",
            ApiError::MethodNotAllowed { .. } => "method_not_allowed",
            ApiError::Unauthorized => "unauthorized",
            ApiError::InvalidToken(_) => "invalid_token",
            ApiError::InsufficientScope(_) => "insufficient_scope",
            ApiError::SignedUrl(crate::auth::SignedUrlError::Expired) => "signature_expired",
            ApiError::SignedUrl(_) => "invalid_signature",
            ApiError::NotReady(_) => "not_ready",
            ApiError::UriTooLong(_) => "uri_too_long",
            ApiError::Overloaded => "overloaded",
            ApiError::Timeout(_) => "timeout",
            ApiError::PreconditionFailed => "precondition_failed",
            ApiError::RangeNotSatisfiable { .. } => "range_not_satisfiable",
            ApiError::TooLarge(_) => "too_large",
            ApiError::Unsupported(_) => "unsupported",
            ApiError::UpstreamDenied => "upstream_denied",
            ApiError::ReferenceNotAllowed(_) => "reference_not_allowed",
            ApiError::Upstream => "upstream_error",
            ApiError::UpstreamTimeout => "upstream_timeout",
            ApiError::CorruptData { .. } | ApiError::InvalidMetadata { .. } => "corrupt_data",
            ApiError::Internal => "internal",
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        // The details (bucket names, OS errors) stay in the log.
        tracing::warn!(error = %e, "store error");
        match e {
            StoreError::Corrupt { key, .. } => ApiError::CorruptData { key },
            StoreError::Denied(_) => ApiError::UpstreamDenied,
            StoreError::NotAllowed(m) => ApiError::ReferenceNotAllowed(m),
            StoreError::UnknownVersion(m) => ApiError::UnknownVersion(m),
            StoreError::Timeout(_) => ApiError::UpstreamTimeout,
            StoreError::Io(_) | StoreError::Range { .. } => ApiError::Upstream,
            StoreError::NotSupported(m) => ApiError::Unsupported(m),
            too_large @ (StoreError::TooLarge { .. } | StoreError::TooManyValues { .. }) => {
                ApiError::TooLarge(too_large.to_string())
            }
        }
    }
}

impl From<crate::array::ReadError> for ApiError {
    fn from(e: crate::array::ReadError) -> Self {
        use crate::array::ReadError as R;
        match e {
            R::Corrupt { key, message } => {
                tracing::warn!(%key, %message, "corrupt data");
                ApiError::CorruptData { key }
            }
            R::Unsupported(m) => ApiError::Unsupported(format!("unsupported: {m}")),
            R::Store(s) => s.into(),
            R::Internal(m) => {
                tracing::error!(%m, "internal error while reading");
                ApiError::Internal
            }
            R::TooLarge(m) => ApiError::TooLarge(m),
            R::Changed(key) => {
                tracing::warn!(%key, "a shard changed twice while it was read");
                ApiError::Upstream
            }
        }
    }
}

impl From<crate::array::SelectionError> for ApiError {
    fn from(e: crate::array::SelectionError) -> Self {
        ApiError::BadRequest(e.to_string())
    }
}

impl From<crate::format::FormatError> for ApiError {
    fn from(e: crate::format::FormatError) -> Self {
        match e {
            crate::format::FormatError::BadRequest(m) => ApiError::BadRequest(m),
            crate::format::FormatError::Unsupported(m) => ApiError::Unsupported(m),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let body = json!({"error": {"code": self.code(), "message": self.to_string()}});
        let mut response = (status, axum::Json(body)).into_response();
        let headers = response.headers_mut();
        // What is missing or refused now may not be later (a chunk written, a walk finished, a
        // busy server): a shared cache asks again rather than keep an error (404s are
        // heuristically cacheable, and some caches keep them for minutes).
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        match &self {
            ApiError::RangeNotSatisfiable { size } => {
                if let Ok(v) = HeaderValue::from_str(&format!("bytes */{size}")) {
                    headers.insert(header::CONTENT_RANGE, v);
                }
            }
            ApiError::MethodNotAllowed { allow, .. } => {
                headers.insert(header::ALLOW, HeaderValue::from_static(allow));
            }
            ApiError::Unauthorized => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            ApiError::InvalidToken(why) => {
                let challenge = format!("Bearer error=\"invalid_token\", error_description=\"{why}\"");
                if let Ok(v) = HeaderValue::from_str(&challenge) {
                    headers.insert(header::WWW_AUTHENTICATE, v);
                }
            }
            ApiError::InsufficientScope(scope) => {
                // A scope is one token of printable characters without quotes (RFC 6749).
                let scope: String = scope
                    .chars()
                    .filter(|c| c.is_ascii_graphic() && !matches!(c, '"' | '\\'))
                    .collect();
                let challenge = format!("Bearer error=\"insufficient_scope\", scope=\"{scope}\"");
                if let Ok(v) = HeaderValue::from_str(&challenge) {
                    headers.insert(header::WWW_AUTHENTICATE, v);
                }
            }
            ApiError::NotReady(_) => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            ApiError::Overloaded => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            _ => {}
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn body_is_json_with_code_and_message() {
        let resp = ApiError::UnknownMount("nope".into()).into_response();
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 16).await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["error"]["code"], "unknown_mount");
        assert_eq!(v["error"]["message"], "no mount named 'nope'");
    }

    #[test]
    fn errors_are_not_kept_by_caches() {
        for e in [ApiError::NotFound("x".into()), ApiError::Overloaded, ApiError::Upstream] {
            let resp = e.into_response();
            assert_eq!(resp.headers()[header::CACHE_CONTROL], "no-cache");
        }
    }

    #[test]
    fn reasons_of_invalid_metadata_are_cut() {
        let long = "é".repeat(1000);
        let e = ApiError::invalid_metadata("a/zarr.json", &long);
        let ApiError::InvalidMetadata { reason, .. } = &e else {
            panic!()
        };
        assert_eq!(reason.chars().count(), MAX_REASON_CHARS + 3);
        assert!(reason.ends_with("é..."));
        let e = ApiError::invalid_metadata("a/zarr.json", "short");
        assert_eq!(e.to_string(), "the metadata at 'a/zarr.json' is invalid: short");
    }

    #[test]
    fn internals_do_not_leak() {
        let e: ApiError = StoreError::Io("/secret/path: permission denied".into()).into();
        assert_eq!(e.status(), StatusCode::BAD_GATEWAY);
        assert!(!e.to_string().contains("secret"));
    }
}
