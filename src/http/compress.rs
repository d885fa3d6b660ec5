//! Content coding of answers made of text (RFC 9110 sections 8.4 and 12.5.3): JSON (slices,
//! hierarchies, listings), CSV, the web page and the metrics are sent compressed with zstd or
//! gzip when the request's `Accept-Encoding` takes one. Every browser sends it, and so do
//! Python's HTTP clients and Prometheus; a hierarchy's JSON shrinks tens of times, numbers in
//! JSON or CSV three to four times.
//!
//! Raw keys never are: their bytes are the store's, and ranges and ETags count them as stored.
//! Neither are binary answers (bin, npy, png), whose numbers gain little at the speeds that
//! pay, nor answers under [`MIN_BYTES`].
//!
//! Compression is fast (zstd level 3, gzip level 1: a fifth of gzip's default level's time for
//! most of its gain on numbers) and runs where decoding does: pieces of a body over
//! [`INLINE_BYTES`] on the blocking pool, so that a large JSON slice does not hold up the other
//! connections of its worker. At most [`MAX_COMPRESSING`] bodies are compressed at once (each
//! holds an encoder of up to a few MiB); an answer that finds none free is sent as it is.

use std::io::Write;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use futures::StreamExt;

use crate::state::AppState;

/// Answers smaller than this (most errors, small listings) are sent as they are: compressing
/// them saves less than it costs.
pub const MIN_BYTES: u64 = 1024;

/// Pieces of a body up to this size are compressed on the worker that sends them; larger ones
/// on the blocking pool.
pub const INLINE_BYTES: usize = 64 * 1024;

/// Bodies compressed at once.
pub const MAX_COMPRESSING: usize = 32;

/// The window of zstd streams of unknown size: 512 KiB (level 3 would take 2 MiB), which bounds
/// an encoder's memory to about 1.3 MiB and costs JSON of numbers no ratio worth naming.
const ZSTD_WINDOW_LOG: u32 = 19;

/// The content codings zarrgate sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    Zstd,
    Gzip,
}

impl Coding {
    /// The `Content-Encoding` value.
    pub fn header(self) -> HeaderValue {
        match self {
            Coding::Zstd => HeaderValue::from_static("zstd"),
            Coding::Gzip => HeaderValue::from_static("gzip"),
        }
    }
}

/// The `Vary` value every answer that may be compressed states, compressed or not.
const VARY_ENCODING: HeaderValue = HeaderValue::from_static("accept-encoding");

/// The coding an `Accept-Encoding` value prefers: of zstd and gzip (`x-gzip` too), the one of
/// highest weight, zstd on a tie; none when neither is acceptable (absent, `q=0`, or listed
/// below `identity`). `*` gives its weight to the codings not listed. A listed `identity` (or
/// a `*` that covers it) of a higher weight than both keeps the answer as it is.
pub fn negotiate(accept_encoding: &str) -> Option<Coding> {
    let mut zstd = None;
    let mut gzip = None;
    let mut identity = None;
    let mut any = None;
    for item in accept_encoding.split(',') {
        let mut parts = item.split(';');
        let name = parts.next().unwrap_or("").trim();
        let Some(q) = crate::format::quality(parts) else {
            continue;
        };
        let slot = match name.to_ascii_lowercase().as_str() {
            "zstd" => &mut zstd,
            "gzip" | "x-gzip" => &mut gzip,
            "identity" => &mut identity,
            "*" => &mut any,
            _ => continue,
        };
        // A coding listed twice: its better weight.
        *slot = Some(slot.map_or(q, |had: f32| had.max(q)));
    }
    let zstd = zstd.or(any).unwrap_or(0.0);
    let gzip = gzip.or(any).unwrap_or(0.0);
    let (best, coding) = if zstd >= gzip {
        (zstd, Coding::Zstd)
    } else {
        (gzip, Coding::Gzip)
    };
    let identity = identity.or(any).unwrap_or(0.0);
    (best > 0.0 && best >= identity).then_some(coding)
}

/// The coding for an answer to a request with `headers`: [`negotiate`] of its `Accept-Encoding`
/// lines, when `server.compression` is on.
pub fn wanted(state: &AppState, headers: &HeaderMap) -> Option<Coding> {
    if !state.config.server.compression {
        return None;
    }
    let accept = super::header_list(headers, header::ACCEPT_ENCODING)?;
    negotiate(&accept)
}

/// Whether an answer of this `Content-Type` is text that compresses.
fn compressible(content_type: Option<&HeaderValue>) -> bool {
    let Some(value) = content_type.and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let media = value.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    media.starts_with("text/")
        || media == "application/json"
        || media.ends_with("+json")
        || media == "application/openmetrics-text"
        || media == "application/javascript"
}

/// `response` in `coding`, when it is text of [`MIN_BYTES`] or more (or of unknown size) and
/// a compressor is free. Every text answer says `Vary: accept-encoding`, compressed or not.
///
/// Compressed, it has no `Content-Length` (its size is known once sent) and a strong `ETag`
/// becomes weak (the bytes differ from the identity answer's). An answer to HEAD states what the
/// GET's would, when its size says: one of unknown size (a slice's, made while sent) states no
/// coding, as it states no length.
pub fn apply(state: &AppState, method: &Method, coding: Option<Coding>, mut response: Response) -> Response {
    let status = response.status();
    let headers = response.headers();
    if !compressible(headers.get(header::CONTENT_TYPE))
        || headers.contains_key(header::CONTENT_ENCODING)
        || headers.contains_key(header::CONTENT_RANGE)
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
        || status.is_informational()
    {
        return response;
    }
    response.headers_mut().append(header::VARY, VARY_ENCODING);
    let Some(coding) = coding else {
        return response;
    };
    let stated = response
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let exact = http_body::Body::size_hint(response.body()).exact();
    let head = method == Method::HEAD;
    let size = match (head, stated) {
        (_, Some(n)) => Some(n),
        (false, None) => exact,
        (true, None) => return response,
    };
    if size.is_some_and(|n| n < MIN_BYTES) {
        return response;
    }
    let permit = match head {
        true => None,
        false => match state.compressing.clone().try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(_) => return response,
        },
    };
    let headers = response.headers_mut();
    headers.remove(header::CONTENT_LENGTH);
    headers.insert(header::CONTENT_ENCODING, coding.header());
    if let Some(etag) = headers.get(header::ETAG).filter(|e| !e.as_bytes().starts_with(b"W/")) {
        let mut weak = b"W/".to_vec();
        weak.extend_from_slice(etag.as_bytes());
        if let Ok(weak) = HeaderValue::from_bytes(&weak) {
            headers.insert(header::ETAG, weak);
        }
    }
    if let Some(permit) = permit {
        let body = std::mem::take(response.body_mut());
        // The size the body states of itself (not a header's) is promised to zstd.
        *response.body_mut() = compressed(body, coding, exact, permit);
    }
    response
}

/// A stream compressor over a `Vec` it writes into, emptied as its output is sent.
enum Encoder {
    Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
    Gzip(flate2::write::GzEncoder<Vec<u8>>),
}

impl Encoder {
    /// An encoder in `coding` for a body of `size` bytes, when known.
    fn new(coding: Coding, size: Option<u64>) -> std::io::Result<Self> {
        Ok(match coding {
            Coding::Zstd => {
                let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), 3)?;
                match size {
                    // Tables and window sized to the body.
                    Some(n) => encoder.set_pledged_src_size(Some(n))?,
                    None => encoder.window_log(ZSTD_WINDOW_LOG)?,
                }
                Encoder::Zstd(encoder)
            }
            Coding::Gzip => Encoder::Gzip(flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(1))),
        })
    }

    /// Compresses `data`; what the encoder has written out since the last call.
    fn write(&mut self, data: &[u8]) -> std::io::Result<Bytes> {
        let out = match self {
            Encoder::Zstd(e) => {
                e.write_all(data)?;
                e.get_mut()
            }
            Encoder::Gzip(e) => {
                e.write_all(data)?;
                e.get_mut()
            }
        };
        Ok(Bytes::from(std::mem::take(out)))
    }

    /// The end of the stream.
    fn finish(self) -> std::io::Result<Bytes> {
        Ok(Bytes::from(match self {
            Encoder::Zstd(e) => e.finish()?,
            Encoder::Gzip(e) => e.finish()?,
        }))
    }
}

/// Where a body's compression is: its encoder between pieces, taken while a piece is
/// compressed; gone once the end is written (or an error sent).
struct Compressing {
    input: axum::body::BodyDataStream,
    encoder: Option<Encoder>,
    /// Whether every piece is compressed on the worker (a body known to be small).
    inline: bool,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

/// A step of the encoder: a piece written (`Some`), or the end (`None`).
fn step(mut encoder: Encoder, piece: Option<Bytes>) -> (Option<Encoder>, std::io::Result<Bytes>) {
    match piece {
        Some(piece) => {
            let out = encoder.write(&piece);
            (Some(encoder), out)
        }
        None => (None, encoder.finish()),
    }
}

/// `body` compressed as it is sent, holding `permit` until it ends or is dropped.
fn compressed(body: Body, coding: Coding, size: Option<u64>, permit: tokio::sync::OwnedSemaphorePermit) -> Body {
    let encoder = match Encoder::new(coding, size) {
        Ok(encoder) => encoder,
        // No encoder (zstd could not allocate its context): the body ends in an error, as one
        // that fails while sent.
        Err(e) => return Body::from_stream(futures::stream::once(async move { Err::<Bytes, _>(e) })),
    };
    let state = Compressing {
        input: body.into_data_stream(),
        encoder: Some(encoder),
        inline: size.is_some_and(|n| n <= INLINE_BYTES as u64),
        _permit: permit,
    };
    Body::from_stream(futures::stream::unfold(state, |mut state| async move {
        loop {
            let encoder = state.encoder.take()?;
            let piece = match state.input.next().await {
                Some(Ok(piece)) if piece.is_empty() => {
                    state.encoder = Some(encoder);
                    continue;
                }
                Some(Ok(piece)) => Some(piece),
                Some(Err(e)) => return Some((Err(std::io::Error::other(e)), state)),
                None => None,
            };
            let large = piece.as_ref().is_none_or(|p| p.len() > INLINE_BYTES);
            let (encoder, out) = if state.inline || !large {
                step(encoder, piece)
            } else {
                match crate::workers::spawn_blocking(move || step(encoder, piece)).await {
                    Ok(stepped) => stepped,
                    Err(_) => return Some((Err(std::io::Error::other("compression stopped")), state)),
                }
            };
            state.encoder = encoder;
            match out {
                Ok(out) if out.is_empty() && state.encoder.is_some() => continue,
                Ok(out) => return Some((Ok(out), state)),
                Err(e) => {
                    state.encoder = None;
                    return Some((Err(e), state));
                }
            }
        }
    }))
}

/// A permit pool of [`MAX_COMPRESSING`] compressors.
pub fn compressors() -> Arc<tokio::sync::Semaphore> {
    Arc::new(tokio::sync::Semaphore::new(MAX_COMPRESSING))
}

#[cfg(test)]
mod tests {
    use super::{Coding, negotiate};

    /// Weights decide, zstd wins ties, `*` stands for what is not listed, `identity` listed
    /// above both keeps the answer as it is, and what is no coding of ours is ignored.
    #[test]
    fn accept_encoding_is_weighed() {
        for (accept, expected) in [
            ("gzip, deflate, br, zstd", Some(Coding::Zstd)),
            ("gzip, deflate", Some(Coding::Gzip)),
            ("x-gzip", Some(Coding::Gzip)),
            ("GZIP;Q=0.5", Some(Coding::Gzip)),
            ("zstd;q=0.5, gzip", Some(Coding::Gzip)),
            ("zstd;q=0, gzip;q=0.1", Some(Coding::Gzip)),
            ("*", Some(Coding::Zstd)),
            ("*;q=0.5, zstd;q=0", Some(Coding::Gzip)),
            ("gzip;q=0.5, identity", None),
            ("gzip;q=0.5, *;q=0.8", Some(Coding::Zstd)),
            ("identity;q=0, gzip;q=0.1", Some(Coding::Gzip)),
            ("gzip;q=0, gzip;q=0.4", Some(Coding::Gzip)),
            ("deflate, br", None),
            ("gzip;q=0", None),
            ("gzip;q=2", None),
            ("gzip;q=x", None),
            ("", None),
            ("identity", None),
            ("*;q=0", None),
        ] {
            assert_eq!(negotiate(accept), expected, "{accept:?}");
        }
    }
}
