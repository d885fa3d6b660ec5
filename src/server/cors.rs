//! CORS: the headers of every answer, and the layer that answers preflights.

use axum::http::header::Entry;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, header};
use std::time::Duration;
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};

/// Headers a browser client may read from our responses.
pub(super) const EXPOSED: [&str; 11] = [
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

pub(super) fn cors(origins: &[String]) -> CorsLayer {
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

/// The `Vary` of every answer but preflights, as tower-http's CORS layer writes it.
pub(super) const CORS_VARY: HeaderValue =
    HeaderValue::from_static("origin, access-control-request-method, access-control-request-headers");

/// [`CORS_VARY`] after an answer's own `Vary: accept` (a slice's), as one value.
pub(super) const ACCEPT_AND_CORS_VARY: HeaderValue =
    HeaderValue::from_static("accept, origin, access-control-request-method, access-control-request-headers");

/// Adds [`CORS_VARY`] to an answer's `Vary`. An answer that varies on `Accept` alone (a slice
/// of binary data) gets one value naming both: a second value makes the header map allocate
/// room for it. (A slice of text also varies on `Accept-Encoding`, a value of its own.)
pub(super) fn vary_as_cors(headers: &mut HeaderMap) {
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
