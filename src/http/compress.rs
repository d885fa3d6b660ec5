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
//! most of its gain on numbers) and runs where decoding does: a body that is not known to be
//! under [`INLINE_BYTES`] on the blocking pool, so that a large JSON slice does not hold up the
//! other connections of its worker. At most [`MAX_COMPRESSING`] bodies are compressed at once (each
//! holds an encoder of about 2 MiB); an answer that finds none free is sent as it is.

use std::io::Write;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use futures::StreamExt;

/// Answers smaller than this (most errors, small listings) are sent as they are: compressing
/// them saves less than it costs.
pub const MIN_BYTES: u64 = 1024;

/// A body known to be of at most this size is compressed on the worker that sends it; any
/// other on the blocking pool, piece by piece.
pub const INLINE_BYTES: usize = 64 * 1024;

/// Bodies compressed at once.
pub const MAX_COMPRESSING: usize = 32;

/// The window of zstd streams: 512 KiB (level 3's own is 2 MiB), which bounds an encoder's
/// memory to about 2 MiB (3.5 MiB with level 3's window) and costs JSON of numbers no ratio
/// worth naming.
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

/// The compression of text answers: whether it is on (`server.compression`), and the permits
/// of the compressors that may run at once.
#[derive(Debug, Clone)]
pub struct Compression {
    enabled: bool,
    permits: Arc<tokio::sync::Semaphore>,
}

impl Compression {
    /// On or off, with [`MAX_COMPRESSING`] compressors.
    pub fn new(enabled: bool) -> Self {
        Self {
            enabled,
            permits: Arc::new(tokio::sync::Semaphore::new(MAX_COMPRESSING)),
        }
    }

    /// The coding for an answer to a request with `headers`: [`negotiate`] of its
    /// `Accept-Encoding` lines, when compression is on.
    pub fn wanted(&self, headers: &HeaderMap) -> Option<Coding> {
        if !self.enabled {
            return None;
        }
        let accept = super::header_list(headers, header::ACCEPT_ENCODING)?;
        negotiate(&accept)
    }
}

/// Whether an answer of this `Content-Type` is text that compresses.
fn compressible(content_type: Option<&HeaderValue>) -> bool {
    let Some(value) = content_type.and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let media = value.split(';').next().unwrap_or("").trim().as_bytes();
    let starts = |prefix: &[u8]| media.len() >= prefix.len() && media[..prefix.len()].eq_ignore_ascii_case(prefix);
    let ends =
        |suffix: &[u8]| media.len() >= suffix.len() && media[media.len() - suffix.len()..].eq_ignore_ascii_case(suffix);
    starts(b"text/")
        || ends(b"+json")
        || [
            &b"application/json"[..],
            b"application/openmetrics-text",
            b"application/javascript",
        ]
        .iter()
        .any(|m| media.eq_ignore_ascii_case(m))
}

/// `response` in `coding`, when it is text of [`MIN_BYTES`] or more (or of unknown size) and
/// a compressor is free. With `server.compression` on, every text answer says
/// `Vary: accept-encoding`, compressed or not.
///
/// Compressed, it has no `Content-Length` (its size is known once sent). An answer to HEAD
/// states what the GET's would, when its size says: one of unknown size (a slice's, made while
/// sent) states no coding, as it states no length.
pub fn apply(compression: &Compression, method: &Method, coding: Option<Coding>, mut response: Response) -> Response {
    let status = response.status();
    let headers = response.headers();
    if !compression.enabled
        || !compressible(headers.get(header::CONTENT_TYPE))
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
    // A HEAD takes no compressor, but says what a GET would be answered now.
    let permit = match head {
        true if compression.permits.available_permits() == 0 => return response,
        true => None,
        false => match compression.permits.clone().try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(_) => return response,
        },
    };
    let headers = response.headers_mut();
    headers.remove(header::CONTENT_LENGTH);
    headers.insert(header::CONTENT_ENCODING, coding.header());
    if let Some(permit) = permit {
        let body = std::mem::take(response.body_mut());
        // The size the body states of itself (not a header's) is promised to zstd.
        *response.body_mut() = compressed(body, coding, exact, permit);
    }
    response
}

/// The buffer an encoder writes into: its output is split off as it is sent, and the room
/// left is used again.
type Out = bytes::buf::Writer<bytes::BytesMut>;

/// A stream compressor, and the permit it holds ([`MAX_COMPRESSING`]) wherever it is (on the
/// blocking pool too, when its body is dropped meanwhile).
struct Encoder {
    coder: Coder,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

enum Coder {
    Zstd(zstd::stream::write::Encoder<'static, Out>),
    Gzip(flate2::write::GzEncoder<Out>),
}

impl Encoder {
    /// An encoder in `coding` for a body of `size` bytes, when known.
    fn new(coding: Coding, size: Option<u64>, permit: tokio::sync::OwnedSemaphorePermit) -> std::io::Result<Self> {
        use bytes::BufMut;
        let out = bytes::BytesMut::new().writer();
        let coder = match coding {
            Coding::Zstd => {
                let mut encoder = zstd::stream::write::Encoder::new(out, 3)?;
                // Level 3's window is 2 MiB; a known size makes it (and the tables) smaller.
                encoder.window_log(ZSTD_WINDOW_LOG)?;
                if let Some(n) = size {
                    encoder.set_pledged_src_size(Some(n))?;
                }
                Coder::Zstd(encoder)
            }
            Coding::Gzip => Coder::Gzip(flate2::write::GzEncoder::new(out, flate2::Compression::new(1))),
        };
        Ok(Self { coder, _permit: permit })
    }

    /// Compresses `data`; what the encoder has written out since the last call.
    fn write(&mut self, data: &[u8]) -> std::io::Result<Bytes> {
        let out = match &mut self.coder {
            Coder::Zstd(e) => {
                e.write_all(data)?;
                e.get_mut()
            }
            Coder::Gzip(e) => {
                e.write_all(data)?;
                e.get_mut()
            }
        };
        Ok(out.get_mut().split().freeze())
    }

    /// The end of the stream.
    fn finish(self) -> std::io::Result<Bytes> {
        let out = match self.coder {
            Coder::Zstd(e) => e.finish()?,
            Coder::Gzip(e) => e.finish()?,
        };
        Ok(out.into_inner().freeze())
    }
}

/// Where a body's compression is: its encoder between pieces, taken while a piece is
/// compressed; gone once the end is written (or an error sent).
struct Compressing {
    input: axum::body::BodyDataStream,
    encoder: Option<Encoder>,
    /// Whether the pieces are compressed on the worker: a body known to be small. Any other
    /// (large, or of unknown size) is compressed on the blocking pool piece by piece, however
    /// small its pieces: a worker serves many connections.
    inline: bool,
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

/// `body` compressed as it is sent, holding `permit` until its encoder is gone.
fn compressed(body: Body, coding: Coding, size: Option<u64>, permit: tokio::sync::OwnedSemaphorePermit) -> Body {
    let encoder = match Encoder::new(coding, size, permit) {
        Ok(encoder) => encoder,
        // No encoder (zstd could not allocate its context): the body ends in an error, as one
        // that fails while sent.
        Err(e) => return Body::from_stream(futures::stream::once(async move { Err::<Bytes, _>(e) })),
    };
    let state = Compressing {
        input: body.into_data_stream(),
        encoder: Some(encoder),
        inline: size.is_some_and(|n| n <= INLINE_BYTES as u64),
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
            let (encoder, out) = if state.inline {
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

#[cfg(test)]
mod tests {
    use std::io::Read;

    use axum::body::{Body, Bytes};
    use http_body_util::BodyExt;
    use proptest::prelude::*;

    use super::{Coding, INLINE_BYTES, compressed, negotiate};

    /// `pieces` sent through [`compressed`] in `coding` (its size stated when `sized`), decoded.
    fn round_trip(pieces: Vec<Vec<u8>>, coding: Coding, sized: bool) -> Vec<u8> {
        let total: u64 = pieces.iter().map(|p| p.len() as u64).sum();
        let body = match sized {
            true => Body::from(pieces.concat()),
            false => Body::from_stream(futures::stream::iter(
                pieces.into_iter().map(|p| Ok::<_, std::io::Error>(Bytes::from(p))),
            )),
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let sent = rt.block_on(async {
            let permit = super::Compression::new(true).permits.try_acquire_owned().unwrap();
            let out = compressed(body, coding, sized.then_some(total), permit);
            out.collect().await.unwrap().to_bytes()
        });
        let mut plain = Vec::new();
        match coding {
            Coding::Zstd => zstd::stream::read::Decoder::new(&sent[..])
                .unwrap()
                .read_to_end(&mut plain),
            Coding::Gzip => flate2::read::GzDecoder::new(&sent[..]).read_to_end(&mut plain),
        }
        .unwrap();
        plain
    }

    /// Text-like bytes: digits and separators, and runs of one byte.
    fn text() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            prop::collection::vec(prop::sample::select(b"0123456789.,-e[]\n".to_vec()), 0..3000),
            (any::<u8>(), 0..200_000usize).prop_map(|(b, n)| vec![b; n]),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Whatever its pieces (empty ones, many small ones, large ones compressed on the
        /// blocking pool, a size stated or not), a compressed body decodes to their bytes.
        #[test]
        fn compressed_bodies_decode_to_their_pieces(
            pieces in prop::collection::vec(text(), 0..12),
            zstd in any::<bool>(),
            sized in any::<bool>(),
        ) {
            let coding = if zstd { Coding::Zstd } else { Coding::Gzip };
            let whole = pieces.concat();
            prop_assert_eq!(round_trip(pieces, coding, sized), whole);
        }
    }

    /// A body of several MiB, in pieces over and under the inline size, stated and not.
    #[test]
    fn large_bodies_round_trip() {
        let piece: Vec<u8> = (0..INLINE_BYTES * 3).map(|i| b"0123456789,"[i * 7 % 11]).collect();
        let pieces = vec![piece.clone(), vec![], piece[..100].to_vec(), piece.clone(), piece];
        for coding in [Coding::Zstd, Coding::Gzip] {
            for sized in [false, true] {
                assert_eq!(round_trip(pieces.clone(), coding, sized), pieces.concat());
            }
        }
    }

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
