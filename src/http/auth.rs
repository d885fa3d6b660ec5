//! Bearer tokens (RFC 6750) as requests present them.

/// The bearer token of a request, if it presents one.
pub fn bearer(headers: &axum::http::HeaderMap) -> Option<&[u8]> {
    let value = headers.get(axum::http::header::AUTHORIZATION)?.as_bytes();
    let (scheme, token) = value.split_at(value.iter().position(|b| *b == b' ')?);
    scheme.eq_ignore_ascii_case(b"bearer").then(|| token.trim_ascii())
}
