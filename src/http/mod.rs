//! Route handlers, one file per route family.

pub mod api;
pub mod raw;
pub mod slice;
pub mod zom;

/// A route's query parameters: unknown ones are 400, so that a misspelt one is not ignored.
pub(crate) fn query<T: serde::de::DeserializeOwned>(uri: &axum::http::Uri) -> Result<T, crate::error::ApiError> {
    serde_urlencoded::from_str(uri.query().unwrap_or(""))
        .map_err(|e| crate::error::ApiError::BadRequest(format!("bad query: {e}")))
}
