//! `GET HEAD OPTIONS /zarr/{mount}/{key...}`: store keys byte for byte, behaving like a
//! well-run bucket because Zarr clients depend on it (see DESIGN.md "Raw keys").

use std::hash::{Hash, Hasher};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::Response;
use bytes::Bytes;

use super::header_list;
use super::zom;
use crate::error::ApiError;
use crate::state::{AppState, Mount};
use crate::store::{ByteRange, ObjectMeta, StoreError, StoreKey};

/// The methods of every route that reads (all but validation).
pub(crate) const ALLOW: &str = "GET, HEAD, OPTIONS";

/// The handler for every method on `/zarr/...`. OPTIONS reaches it unless it is a CORS
/// preflight (which the CORS layer answers, when origins are configured).
pub async fn raw_key(
    State(state): State<AppState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    match method {
        Method::GET | Method::HEAD => {
            // An object replaced between reading its validators and its bytes is served anew,
            // once: its headers must describe the bytes that follow them.
            let served = crate::store::cached::noting_status(async {
                for _ in 0..2 {
                    if let Some(response) = serve(&state, &method, uri.path(), &headers).await? {
                        return Ok(response);
                    }
                }
                Err(ApiError::Upstream)
            });
            let (mut response, noted) = served.await;
            // How the raw cache answers, for the access log (the body may read more). A read
            // through the cache notes its object at once: a mount it does not cache adds nothing.
            if let Ok(response) = &mut response
                && noted.get().is_some()
            {
                response.extensions_mut().insert(noted);
            }
            response
        }
        Method::OPTIONS => Ok(super::options(ALLOW)),
        other => Err(ApiError::MethodNotAllowed {
            method: other.to_string(),
            allow: ALLOW,
        }),
    }
}

/// Splits `/zarr/{mount}/{rest}` into the mount name and the raw (still encoded) rest.
fn split_path(path: &str) -> (&str, &str) {
    let tail = path.strip_prefix("/zarr/").unwrap_or("");
    tail.split_once('/').unwrap_or((tail, ""))
}

/// The strong ETag of an object: its backend version when it has one, else size and mtime.
pub fn etag_of(meta: &ObjectMeta) -> String {
    match &meta.version {
        // A weak validator stays weak (`W/"..."`): it must not pass strong comparisons.
        Some(v) => match v.strip_prefix("W/") {
            Some(weak) => format!("W/\"{}\"", weak.trim_matches('"')),
            None => format!("\"{}\"", v.trim_matches('"')),
        },
        // Without a version or a time (an origin that sends neither), there is nothing that
        // tells one object from another of its size: no validator at all ("").
        None => match meta.last_modified.and_then(|t| t.duration_since(UNIX_EPOCH).ok()) {
            Some(mtime) => format!("\"{:x}-{:x}\"", meta.size, mtime.as_nanos()),
            None => String::new(),
        },
    }
}

/// Whether a list of entity tags (`If-Match` / `If-None-Match`) matches `etag`.
/// `weak` comparison ignores `W/` prefixes on both sides; strong comparison never matches a
/// weak tag. `*` matches any representation.
fn etag_matches(list: &str, etag: &str, weak: bool) -> bool {
    fn opaque(t: &str) -> &str {
        t.strip_prefix("W/").unwrap_or(t)
    }
    entity_tags(list).any(|tag| {
        tag == "*"
            || !etag.is_empty()
                && if weak {
                    opaque(tag) == opaque(etag)
                } else {
                    !etag.starts_with("W/") && tag == etag
                }
    })
}

/// The members of an entity-tag list (RFC 9110 section 8.8.3): `*`, or tags written
/// `[W/]"opaque"`, each with its quotes and prefix; the opaque part may hold a comma. A member
/// that is no entity tag is skipped up to the next comma.
fn entity_tags(list: &str) -> impl Iterator<Item = &str> {
    let mut rest = list;
    std::iter::from_fn(move || {
        loop {
            rest = rest.trim_start_matches([' ', '\t', ',']);
            if rest.is_empty() {
                return None;
            }
            let quoted = rest.strip_prefix("W/").unwrap_or(rest);
            let prefix = rest.len() - quoted.len();
            let tag = match quoted.strip_prefix('"').and_then(|inner| inner.find('"')) {
                Some(close) => Some(&rest[..prefix + close + 2]),
                None if rest.starts_with('*') => Some(&rest[..1]),
                None => None,
            };
            let taken = tag.map_or_else(|| rest.find(',').unwrap_or(rest.len()), str::len);
            rest = &rest[taken..];
            if tag.is_some() {
                return tag;
            }
        }
    })
}

/// The last second an HTTP date can name: 9999-12-31T23:59:59Z.
const LAST_HTTP_SECOND: u64 = 253_402_300_799;

/// A modification time as HTTP dates carry it: whole seconds, no later than now (a file or
/// an object may claim a time to come, from a clock ahead or a copy that kept it; RFC 9110
/// section 8.8.2.1 has the origin send its `Date` instead, so that a client revalidating by
/// date does not keep old bytes until then), and `None` past what an HTTP date can name.
fn http_time(t: SystemTime) -> Option<SystemTime> {
    let t = t.min(SystemTime::now());
    let secs = t.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    (secs <= LAST_HTTP_SECOND).then(|| UNIX_EPOCH + Duration::from_secs(secs))
}

/// Parses a single `bytes=` range. Anything else (other units, several ranges, bad syntax) is
/// `None`, and the whole object is served, as RFC 9110 allows.
pub fn parse_range(value: &str) -> Option<ByteRange> {
    let (unit, set) = value.trim().split_once('=')?;
    if !unit.trim().eq_ignore_ascii_case("bytes") {
        return None;
    }
    // One range; a list may hold empty elements (RFC 9110 section 5.6.1).
    let mut specs = set.split(',').map(str::trim).filter(|s| !s.is_empty());
    let spec = specs.next()?;
    if specs.next().is_some() {
        return None;
    }
    let (first, last) = spec.split_once('-')?;
    let (first, last) = (first.trim(), last.trim());
    // Digits past u64 are a position past any object: saturated, not refused (RFC 9110
    // section 14.1.1: a last-pos past the end means the end).
    let num = |s: &str| -> Option<u64> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            None
        } else {
            Some(s.parse().unwrap_or(u64::MAX))
        }
    };
    match (first.is_empty(), last.is_empty()) {
        (true, false) => Some(ByteRange::Suffix(num(last)?)),
        (false, true) => Some(ByteRange::From(num(first)?)),
        (false, false) => {
            let (a, b) = (num(first)?, num(last)?);
            (b >= a).then(|| ByteRange::Bounded(a, b.saturating_add(1)))
        }
        (true, true) => None,
    }
}

fn content_type(key: &StoreKey) -> HeaderValue {
    const JSON: HeaderValue = HeaderValue::from_static("application/json");
    const BYTES: HeaderValue = HeaderValue::from_static("application/octet-stream");
    match key.name() {
        ".zarray" | ".zgroup" | ".zattrs" | ".zmetadata" | "zarr.json" => JSON,
        _ => BYTES,
    }
}

fn header_str(headers: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// What a raw-key response serves: a stored object, or a document zarrgate synthesized.
enum Content {
    /// Stream the stored object.
    Stored,
    /// Serve these bytes (synthesized consolidated metadata).
    Memory(Bytes),
}

/// A representation's validators and content.
struct Representation {
    size: u64,
    etag: String,
    last_modified: Option<SystemTime>,
    content: Content,
    /// Served as stored for want of the consolidated document (its walk failed or goes on):
    /// not to be kept by caches downstream, whatever the mount's `cache_control` says.
    provisional: bool,
}

/// A strong ETag for synthesized content: a hash of the bytes.
fn content_etag(bytes: &[u8]) -> String {
    let mut h = std::hash::DefaultHasher::new();
    bytes.hash(&mut h);
    format!("\"zg-{:016x}-{:x}\"", h.finish(), bytes.len())
}

/// The representation of `key`: stored as is, or with consolidated metadata added when the
/// mount synthesizes it and the store has none.
async fn representation(state: &AppState, mount: &Mount, key: &StoreKey) -> Result<Option<Representation>, ApiError> {
    if mount.consolidated && key.name() == "zarr.json" {
        // One read of the stored document (up to the size of a group's that is consolidated):
        // it is what is served, unless it is a v3 group to consolidate. (A HEAD, then the
        // document to see what it is, then its body again, were three trips to a bucket.)
        let read = mount
            .store
            .fetch(key, Some(ByteRange::Bounded(0, zom::MAX_GROUP_DOC + 1)));
        match read.await {
            Ok(None) => return Ok(None),
            Ok(Some((bytes, meta))) if bytes.len() as u64 == meta.size => {
                let synthesized = zom::synthesized_zarr_json(state, mount, &key.parent(), &bytes).await;
                let provisional = synthesized.is_err();
                if let Some(rep) = consolidated(mount, key, synthesized) {
                    return Ok(Some(rep));
                }
                return Ok(Some(Representation {
                    size: meta.size,
                    etag: etag_of(&meta),
                    last_modified: meta.last_modified.and_then(http_time),
                    content: Content::Memory(bytes),
                    provisional,
                }));
            }
            // Larger than any group's to consolidate (served as stored), or empty: below.
            Ok(Some(_)) | Err(StoreError::Range { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let stored = mount.store.head(key).await?;
    if mount.consolidated && key.name() == ".zmetadata" && stored.is_none() {
        let synthesized = zom::synthesized_zmetadata(state, mount, &key.parent()).await;
        if let Some(rep) = consolidated(mount, key, synthesized) {
            return Ok(Some(rep));
        }
    }
    Ok(stored.map(|meta| Representation {
        size: meta.size,
        etag: etag_of(&meta),
        last_modified: meta.last_modified.and_then(http_time),
        content: Content::Stored,
        provisional: false,
    }))
}

/// A synthesized document's representation. Consolidating is an addition: when the hierarchy
/// cannot be walked (a store that cannot list, a member that does not parse, an upstream
/// error), `None`, and the key is what is stored, or missing.
fn consolidated(mount: &Mount, key: &StoreKey, synthesized: Result<Option<Bytes>, ApiError>) -> Option<Representation> {
    let bytes = synthesized.unwrap_or_else(|e| {
        match &e {
            ApiError::Unsupported(_) | ApiError::TooLarge(_) => {
                tracing::debug!(%key, error = %e, "not consolidating")
            }
            _ => tracing::warn!(mount = %mount.name, %key, error = %e, "not consolidating"),
        }
        None
    })?;
    Some(Representation {
        size: bytes.len() as u64,
        etag: content_etag(&bytes),
        last_modified: None,
        content: Content::Memory(bytes),
        provisional: false,
    })
}

/// The headers every representation of a key carries.
fn stored_headers(
    mount: &Mount,
    key: &StoreKey,
    etag: &str,
    last_modified: Option<SystemTime>,
    provisional: bool,
) -> axum::http::response::Builder {
    // Stores change under a key: unless the mount says how its answers may be kept
    // (`cache_control`), caches (a browser's, for viewers) revalidate each use, which the ETag
    // makes a 304, instead of keeping a copy for a heuristic lifetime. Constant values, and appended in place (see `super::append`): every raw answer has them.
    const BYTES: HeaderValue = HeaderValue::from_static("bytes");
    const NO_CACHE: HeaderValue = HeaderValue::from_static("no-cache");
    let mut response = super::response();
    super::append(&mut response, header::ACCEPT_RANGES, BYTES);
    let cache_control = match provisional {
        true => NO_CACHE,
        false => mount.cache_control.clone().unwrap_or(NO_CACHE),
    };
    super::append(&mut response, header::CACHE_CONTROL, cache_control);
    super::append(&mut response, header::CONTENT_TYPE, content_type(key));
    // A stored ETag that is no header value (an odd upstream's) is left out, not a failed answer.
    if !etag.is_empty()
        && let Ok(etag) = HeaderValue::try_from(etag)
    {
        super::append(&mut response, header::ETAG, etag);
    }
    if let Some(date) = last_modified.and_then(|t| HeaderValue::try_from(httpdate::fmt_http_date(t)).ok()) {
        super::append(&mut response, header::LAST_MODIFIED, date);
    }
    response
}

/// The response, or `None` when the object changed while it was being served.
async fn serve(
    state: &AppState,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
) -> Result<Option<Response>, ApiError> {
    let (mount_name, rest) = split_path(path);
    let mount = state.mount_at(mount_name).await?;
    let mount = &*mount;
    let (key, names_directory) = StoreKey::from_url_path(rest)?;
    let missing = || ApiError::NotFound(format!("no key '{key}' in mount '{}'", mount.name));
    if names_directory || key.is_root() {
        return Err(missing());
    }
    // A plain GET of a stored key: one read gives the metadata and the bytes (a HEAD first
    // would cost a second trip to the disk or the bucket). Conditional requests, documents that
    // may be synthesized, and ranges on stores that do not resolve them take the general path.
    let conditional = [
        header::IF_MATCH,
        header::IF_NONE_MATCH,
        header::IF_MODIFIED_SINCE,
        header::IF_UNMODIFIED_SINCE,
        header::IF_RANGE,
    ]
    .iter()
    .any(|h| headers.contains_key(h));
    let synthesizable = mount.consolidated && matches!(key.name(), ".zmetadata" | "zarr.json");
    // Range is one field: two field lines of it make it invalid, and it is ignored. So is a
    // Range on HEAD: GET is the only method ranges are defined for (RFC 9110 section 14.2),
    // and a HEAD states the whole object's length, as the GET without a range would.
    let requested = match headers.get_all(header::RANGE).iter().count() {
        1 if *method == Method::GET => header_str(headers, header::RANGE).and_then(parse_range),
        _ => None,
    };
    if *method == Method::GET
        && !conditional
        && !synthesizable
        && (requested.is_none() || mount.store.resolves_ranges())
    {
        let read = match mount.store.get(&key, requested).await {
            // A zero-length object has no bytes to name: any range gets the whole of it.
            Err(StoreError::Range { size: 0, .. }) => mount.store.get(&key, None).await,
            read => read,
        };
        let object = match read {
            Ok(Some(object)) => object,
            Ok(None) => return Err(missing()),
            Err(StoreError::Range { size, .. }) => return Err(ApiError::RangeNotSatisfiable { size }),
            Err(e) => return Err(e.into()),
        };
        let (size, range) = (object.meta.size, object.range.clone());
        let mut response = stored_headers(
            mount,
            &key,
            &etag_of(&object.meta),
            object.meta.last_modified.and_then(http_time),
            false,
        );
        if requested.is_some() && size > 0 {
            response = response.status(StatusCode::PARTIAL_CONTENT).header(
                header::CONTENT_RANGE,
                format!("bytes {}-{}/{size}", range.start, range.end.saturating_sub(1)),
            );
        }
        let body = match requested {
            None => first_piece_read(object.body, &key).await?,
            Some(_) => Body::from_stream(object.body),
        };
        super::append(
            &mut response,
            header::CONTENT_LENGTH,
            HeaderValue::from(range.end - range.start),
        );
        return response.body(body).map(Some).map_err(|_| ApiError::Internal);
    }

    let rep = representation(state, mount, &key).await?.ok_or_else(missing)?;
    let etag = rep.etag.clone();
    let last_modified = rep.last_modified;

    let mut response = stored_headers(mount, &key, &etag, last_modified, rep.provisional);

    // Preconditions, in the order RFC 9110 section 13.2.2 evaluates them.
    match header_list(headers, header::IF_MATCH).as_deref() {
        Some(list) if !etag_matches(list, &etag, false) => return Err(ApiError::PreconditionFailed),
        Some(_) => {}
        None => {
            let since =
                header_str(headers, header::IF_UNMODIFIED_SINCE).and_then(|v| httpdate::parse_http_date(v).ok());
            if since
                .zip(last_modified)
                .is_some_and(|(since, modified)| modified > since)
            {
                return Err(ApiError::PreconditionFailed);
            }
        }
    }
    let not_modified = match header_list(headers, header::IF_NONE_MATCH).as_deref() {
        Some(list) => etag_matches(list, &etag, true),
        None => match (
            header_str(headers, header::IF_MODIFIED_SINCE).and_then(|v| httpdate::parse_http_date(v).ok()),
            last_modified,
        ) {
            (Some(since), Some(modified)) => modified <= since,
            _ => false,
        },
    };
    if not_modified {
        // As a 200 would say (RFC 9110 section 8.6); left out, HEAD would get 0.
        return response
            .status(StatusCode::NOT_MODIFIED)
            .header(header::CONTENT_LENGTH, HeaderValue::from(rep.size))
            .body(Body::empty())
            .map(Some)
            .map_err(|_| ApiError::Internal);
    }

    // If-Range: a range only applies to the representation the client already has.
    let if_range_ok = match header_str(headers, header::IF_RANGE) {
        None => true,
        // Strong comparison: a weak tag never matches.
        Some(v) if v.starts_with('"') || v.starts_with("W/") => v == etag && !etag.starts_with("W/"),
        Some(v) => httpdate::parse_http_date(v)
            .ok()
            .is_some_and(|d| Some(d) == last_modified),
    };
    // A zero-length object has no bytes to name: any range gets the whole, empty, object.
    let requested = requested.filter(|_| if_range_ok && rep.size > 0);
    let (status, range) = match requested {
        None => (StatusCode::OK, 0..rep.size),
        Some(r) => {
            let range = r
                .resolve(rep.size)
                .ok_or(ApiError::RangeNotSatisfiable { size: rep.size })?;
            response = response.header(
                header::CONTENT_RANGE,
                format!("bytes {}-{}/{}", range.start, range.end - 1, rep.size),
            );
            (StatusCode::PARTIAL_CONTENT, range)
        }
    };
    let response = response
        .status(status)
        .header(header::CONTENT_LENGTH, HeaderValue::from(range.end - range.start));

    let body = if *method == Method::HEAD || range.is_empty() {
        Body::empty()
    } else {
        match rep.content {
            Content::Memory(bytes) => Body::from(bytes.slice(range.start as usize..range.end as usize)),
            Content::Stored => {
                let object = match mount
                    .store
                    .get(&key, Some(ByteRange::Bounded(range.start, range.end)))
                    .await
                {
                    Ok(Some(object)) => object,
                    // The object may have vanished since the HEAD: that is a 404 like any other.
                    Ok(None) => return Err(missing()),
                    // The range is past the end of what is stored now: another, shorter object.
                    Err(StoreError::Range { .. }) => return Ok(None),
                    Err(e) => return Err(e.into()),
                };
                // Another object: another tag, or (where there is no tag) another size.
                if etag_of(&object.meta) != etag || object.meta.size != rep.size {
                    return Ok(None);
                }
                match status {
                    StatusCode::OK => first_piece_read(object.body, &key).await?,
                    _ => Body::from_stream(object.body),
                }
            }
        }
    };
    response.body(body).map(Some).map_err(|_| ApiError::Internal)
}

/// The body of a whole object with its first piece read before the response's head is sent:
/// a read that fails in its first piece (a zip entry of one piece that fails its CRC, a file
/// that cannot be read) is an error response, where a failing body would cut the connection
/// after a 200 head, unsent. Ranges are not read ahead: reaching a range's first byte may take
/// long (inflating a zip entry up to it), and would then count against the request's timeout.
async fn first_piece_read(
    mut body: futures::stream::BoxStream<'static, Result<Bytes, StoreError>>,
    key: &StoreKey,
) -> Result<Body, ApiError> {
    use futures::StreamExt;
    match body.next().await {
        None => Ok(Body::empty()),
        Some(Err(e)) => Err(e.naming(key.as_str()).into()),
        Some(Ok(first)) => Ok(Body::from_stream(
            futures::stream::once(async move { Ok(first) }).chain(body),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse() {
        assert_eq!(parse_range("bytes=0-9"), Some(ByteRange::Bounded(0, 10)));
        assert_eq!(parse_range("bytes=5-"), Some(ByteRange::From(5)));
        assert_eq!(parse_range("bytes=-5"), Some(ByteRange::Suffix(5)));
        assert_eq!(parse_range("bytes= 1 - 2 "), Some(ByteRange::Bounded(1, 3)));
        assert_eq!(parse_range("Bytes=0-9,"), Some(ByteRange::Bounded(0, 10)));
        assert_eq!(parse_range("bytes=, -5"), Some(ByteRange::Suffix(5)));
        for ignored in [
            "bytes=5-2",
            "bytes=0-1,4-5",
            "items=0-1",
            "bytes=-",
            "bytes=a-b",
            "bytes=+1-2",
            "bytes=,",
            "",
        ] {
            assert_eq!(parse_range(ignored), None, "{ignored}");
        }
        // Positions past u64 are past any object.
        let huge = "99999999999999999999";
        assert_eq!(
            parse_range(&format!("bytes=0-{huge}")),
            Some(ByteRange::Bounded(0, u64::MAX))
        );
        assert_eq!(
            parse_range(&format!("bytes=-{huge}")),
            Some(ByteRange::Suffix(u64::MAX))
        );
        assert_eq!(parse_range(&format!("bytes={huge}-")), Some(ByteRange::From(u64::MAX)));
    }

    #[test]
    fn etags_compare() {
        assert!(etag_matches("\"a\"", "\"a\"", false));
        assert!(etag_matches("\"x\", \"a\"", "\"a\"", false));
        assert!(etag_matches("*", "\"a\"", false));
        assert!(!etag_matches("W/\"a\"", "\"a\"", false));
        assert!(etag_matches("W/\"a\"", "\"a\"", true));
        assert!(!etag_matches("\"b\"", "\"a\"", true));
        // A weak validator of ours (an upstream's `W/` ETag) passes only weak comparisons.
        assert!(!etag_matches("W/\"a\"", "W/\"a\"", false));
        assert!(etag_matches("*", "W/\"a\"", false));
        assert!(etag_matches("\"a\"", "W/\"a\"", true));
        assert!(etag_matches("W/\"a\"", "W/\"a\"", true));
        // No validator: nothing matches it but `*`.
        assert!(!etag_matches("\"\"", "", true) && !etag_matches("W/\"\"", "", true));
        assert!(etag_matches("*", "", false));
    }

    #[test]
    fn upstream_etags_stay_valid_and_weak_ones_weak() {
        let meta = |v: &str| ObjectMeta {
            size: 1,
            last_modified: None,
            version: Some(v.into()),
        };
        assert_eq!(etag_of(&meta("\"abc\"")), "\"abc\"");
        assert_eq!(etag_of(&meta("abc")), "\"abc\"");
        assert_eq!(etag_of(&meta("W/\"abc\"")), "W/\"abc\"");
    }

    /// Whole seconds, no later than now: a time to come (year 10000 too, which no HTTP date
    /// names and formatting would panic on) is stated as now.
    #[test]
    fn http_dates_are_whole_seconds_up_to_now() {
        let at = |secs: u64, nanos: u32| UNIX_EPOCH + Duration::new(secs, nanos);
        assert_eq!(http_time(at(1_700_000_000, 999_999_999)), Some(at(1_700_000_000, 0)));
        assert_eq!(
            httpdate::fmt_http_date(at(LAST_HTTP_SECOND, 0)),
            "Fri, 31 Dec 9999 23:59:59 GMT"
        );
        for later in [
            at(LAST_HTTP_SECOND, 5),
            at(LAST_HTTP_SECOND + 1, 0),
            SystemTime::now() + Duration::from_secs(60),
        ] {
            let before = SystemTime::now() - Duration::from_secs(1);
            let stated = http_time(later).unwrap();
            assert!(stated >= before && stated <= SystemTime::now(), "{stated:?}");
            assert_eq!(stated.duration_since(UNIX_EPOCH).unwrap().subsec_nanos(), 0);
        }
        assert_eq!(http_time(UNIX_EPOCH - Duration::from_secs(5)), Some(UNIX_EPOCH));
    }

    #[test]
    fn paths_split() {
        assert_eq!(split_path("/zarr/demo/a/b"), ("demo", "a/b"));
        assert_eq!(split_path("/zarr/demo"), ("demo", ""));
        assert_eq!(split_path("/zarr/demo/"), ("demo", ""));
    }
    /// Entity tags may hold commas (RFC 9110 `etagc`): a list is split between tags, not at
    /// every comma.
    #[test]
    fn entity_tag_lists_are_split_between_tags() {
        let tags: Vec<&str> = entity_tags(r#" "a,b" ,W/"c", *, junk, "d""#).collect();
        assert_eq!(tags, [r#""a,b""#, r#"W/"c""#, "*", r#""d""#]);
        assert!(etag_matches(r#""x", "a,b""#, r#""a,b""#, false));
        assert!(!etag_matches(r#""a", "b""#, r#""a,b""#, false));
        assert!(etag_matches(r#"W/"a,b""#, r#""a,b""#, true));
        assert!(!etag_matches(r#"W/"a,b""#, r#""a,b""#, false));
        assert_eq!(entity_tags(r#""unclosed, x"#).count(), 0);
        assert_eq!(entity_tags(r#"W/, "y""#).collect::<Vec<_>>(), [r#""y""#]);
        assert_eq!(entity_tags("").count(), 0);
    }
}
