//! Codecs: one per file, each naming its spec and carrying its own tests.
//!
//! A chunk is decoded by a chain, as in Zarr v3: bytes->bytes codecs (compressors, checksums,
//! shuffles) in reverse order, then one array->bytes codec (plain bytes, variable-length
//! encodings, sharding), then array->array codecs (transpose) in reverse order. Zarr v2 is mapped
//! onto the same chain: the compressor and numeric filters are bytes->bytes stages, object codecs
//! are array->bytes, and `order: "F"` is a transpose.
//!
//! Every decoder takes a `limit` on its output: a decompression bomb or a lie in a header is a
//! [`CodecError::TooLarge`] or [`CodecError::Corrupt`], never an allocation of what the data
//! claims.

/// Errors of decoding one chunk. Configuration errors are found when metadata is parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// The stored bytes are not what the codec produces.
    #[error("corrupt data: {0}")]
    Corrupt(String),
    /// Decoding would produce more than the limit (a bomb, or a header that lies).
    #[error("decoded data would exceed {limit} bytes")]
    TooLarge {
        /// The limit that was hit.
        limit: usize,
    },
    /// Well-formed variable-length elements that take more memory decoded than this server
    /// gives one chunk (a limit, not corruption: 413 for the request).
    #[error("{0}")]
    OverLimit(String),
    /// A codec or option this server cannot decode.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The codec's configuration is invalid.
    #[error("invalid codec configuration: {0}")]
    Config(String),
}

/// A codec that maps bytes to bytes (compressors, checksums, byte shuffles).
pub trait BytesToBytes: Send + Sync + std::fmt::Debug {
    /// Decodes `input`. The output may not exceed `limit` bytes.
    fn decode(&self, input: &[u8], limit: usize) -> Result<Vec<u8>, CodecError>;

    /// How much larger than what it decodes to its input may be, as a ratio (numerator,
    /// denominator), for a chunk of `shape` elements as this stage encodes them: the stages
    /// before it in decoding produce that input. Compressors and checksums add a bounded header
    /// or nothing; Base64 text is 4/3; a numeric filter's stored type may be wider than the
    /// type it decodes to; ZFP pads every dimension to blocks of four.
    fn expansion(&self, _shape: &[u64]) -> (usize, usize) {
        (1, 1)
    }
}

pub mod astype;
pub mod base64;
pub mod blosc;
pub mod bz2;
pub mod categorize;
pub mod chain;
pub mod checksum32;
pub mod crc32c;
pub mod delta;
pub mod fixedscaleoffset;
pub mod gzip;
pub mod json2;
pub mod lz4;
pub mod lzma;
pub mod msgpack2;
pub mod numeric;
pub mod packbits;
pub mod pcodec;
pub mod sharding;
pub mod shuffle;
pub mod transpose;
pub mod vlen;
pub mod zep0007;
pub mod zfpy;
pub mod zlib;
pub mod zstd;

use std::io::Read;

use serde_json::{Map, Value};

use crate::dtype::DType;

/// The bytes->bytes codec of a Zarr v2 compressor or filter (a whole numcodecs dict, `id` included).
///
/// Returns `Ok(None)` when `id` names no bytes->bytes codec of this module (delta, fixedscaleoffset,
/// quantize, packbits, categorize, astype, vlen-utf8, vlen-bytes, json2, ...): the caller handles
/// those, or reports them as unsupported.
pub fn bytes_codec_v2(config: &Value) -> Result<Option<Box<dyn BytesToBytes>>, CodecError> {
    let id = match config.get("id") {
        Some(Value::String(id)) => id.as_str(),
        Some(other) => return Err(CodecError::Config(format!("codec id must be a string, not {other}"))),
        None => return Err(CodecError::Config("codec has no id".to_string())),
    };
    bytes_codec_numcodecs(id, config)
}

/// The bytes->bytes codec of a Zarr v3 codec entry (`name` and its optional `configuration`).
///
/// `gzip`, `zstd`, `blosc` and `crc32c` are the codecs of the v3 spec; `numcodecs.<id>` names
/// (written by zarr-python for numcodecs codecs) take the numcodecs configuration with or without
/// its `id`. Returns `Ok(None)` for names that are not bytes->bytes codecs of this module.
pub fn bytes_codec_v3(name: &str, configuration: Option<&Value>) -> Result<Option<Box<dyn BytesToBytes>>, CodecError> {
    Ok(Some(match name {
        "gzip" => Box::new(gzip::Gzip::from_v3(configuration)?),
        "zstd" => Box::new(zstd::Zstd::from_v3(configuration)?),
        "blosc" => Box::new(blosc::Blosc::from_v3(configuration)?),
        "crc32c" => Box::new(crc32c::Crc32c::from_v3(configuration)?),
        _ => match name.strip_prefix("numcodecs.") {
            Some(id) => {
                let empty = Value::Object(Map::new());
                return bytes_codec_numcodecs(id, configuration.unwrap_or(&empty));
            }
            None => return Ok(None),
        },
    }))
}

/// The decoder of a numcodecs codec that encodes typed numbers rather than bytes (`pcodec`,
/// `zfpy`: in v2 the compressor, or a filter, of the type that reaches it; in v3,
/// `numcodecs.<id>`, the array->bytes codec) for elements of `dtype`; `None` for other ids. Such
/// a codec given bytes (`dtype` `None`: after a compressor, say) is unsupported, and so are
/// multi-byte numbers in big-endian order: numcodecs encodes native-order arrays only, and
/// views datetimes and timedeltas as int64 whatever their order, so that the numbers it stores
/// are their stored bytes, which the chain then reads in the array's order.
pub fn typed_codec(
    id: &str,
    config: &Value,
    dtype: Option<&DType>,
) -> Result<Option<Box<dyn BytesToBytes>>, CodecError> {
    use crate::dtype::Kind;
    let numbers = || match dtype {
        None => Err(CodecError::Unsupported(format!("{id} of bytes rather than numbers"))),
        Some(d)
            if d.big_endian
                && d.item_size().is_some_and(|n| n > 1)
                && !matches!(d.kind, Kind::DateTime(_) | Kind::TimeDelta(_)) =>
        {
            Err(CodecError::Unsupported(format!(
                "{id} of {} elements (numcodecs encodes native byte order only)",
                d.typestr()
            )))
        }
        Some(d) => Ok(d),
    };
    Ok(Some(match id {
        "pcodec" => Box::new(pcodec::Pcodec::new(config, numbers()?)?),
        "zfpy" => Box::new(zfpy::Zfpy::new(config, numbers()?)?),
        _ => return Ok(None),
    }))
}

/// Dispatches a numcodecs id with its configuration dict (which may lack the `id` key).
fn bytes_codec_numcodecs(id: &str, config: &Value) -> Result<Option<Box<dyn BytesToBytes>>, CodecError> {
    Ok(Some(match id {
        "gzip" => Box::new(gzip::Gzip::from_v2(config)?),
        "zlib" => Box::new(zlib::Zlib::from_v2(config)?),
        "zstd" => Box::new(zstd::Zstd::from_v2(config)?),
        "blosc" => Box::new(blosc::Blosc::from_v2(config)?),
        "lz4" => Box::new(lz4::Lz4::from_v2(config)?),
        "bz2" => Box::new(bz2::Bz2::from_v2(config)?),
        "lzma" => Box::new(lzma::Lzma::from_v2(config)?),
        "shuffle" => Box::new(shuffle::Shuffle::from_v2(config)?),
        "crc32c" => Box::new(crc32c::Crc32c::from_v2(config)?),
        "base64" => Box::new(base64::Base64::from_v2(config)?),
        _ => match checksum32::Checksum32::from_v2(id, config)? {
            Some(checksum) => Box::new(checksum),
            None => return Ok(None),
        },
    }))
}

/// Reads a decoder to its end, keeping at most `limit` bytes: one byte more is a
/// [`CodecError::TooLarge`]. `size_hint` (e.g. a trusted-after-check header) only sizes the first
/// allocation and is capped by `limit`. Read errors become what `read_error` makes of them.
pub(crate) fn read_limited(
    reader: impl Read,
    limit: usize,
    size_hint: usize,
    read_error: impl FnOnce(std::io::Error) -> CodecError,
) -> Result<Vec<u8>, CodecError> {
    let mut out = Vec::with_capacity(size_hint.min(limit));
    let cap = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1);
    reader.take(cap).read_to_end(&mut out).map_err(read_error)?;
    if out.len() > limit {
        return Err(CodecError::TooLarge { limit });
    }
    // Decoded chunks are cached and weighed by their length: do not keep spare capacity.
    out.shrink_to_fit();
    Ok(out)
}

/// The options of a codec configuration: `None` and JSON `null` are no options, an object is
/// taken as is, anything else is a [`CodecError::Config`].
pub(crate) fn config_object<'a>(
    codec: &str,
    config: Option<&'a Value>,
) -> Result<Option<&'a Map<String, Value>>, CodecError> {
    match config {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(map)) => Ok(Some(map)),
        Some(other) => Err(CodecError::Config(format!(
            "{codec}: configuration must be an object, not {other}"
        ))),
    }
}

/// Checks that a numcodecs dict names `codec` when it carries an `id` and returns its options.
pub(crate) fn numcodecs_object<'a>(
    codec: &str,
    config: &'a Value,
) -> Result<Option<&'a Map<String, Value>>, CodecError> {
    let map = config_object(codec, Some(config))?;
    match map.and_then(|m| m.get("id")) {
        None => {}
        Some(Value::String(id)) if id == codec => {}
        Some(other) => return Err(CodecError::Config(format!("{codec}: unexpected id {other}"))),
    }
    Ok(map)
}

/// An optional integer option in `range`; absent or `null` is `None`.
pub(crate) fn optional_int(
    codec: &str,
    options: Option<&Map<String, Value>>,
    key: &str,
    range: std::ops::RangeInclusive<i64>,
) -> Result<Option<i64>, CodecError> {
    match options.and_then(|m| m.get(key)) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => match value.as_i64() {
            Some(n) if range.contains(&n) => Ok(Some(n)),
            _ => Err(CodecError::Config(format!(
                "{codec}: {key} must be an integer in {}..={}, not {value}",
                range.start(),
                range.end()
            ))),
        },
    }
}

/// An optional boolean option; absent or `null` is `None`.
pub(crate) fn optional_bool(
    codec: &str,
    options: Option<&Map<String, Value>>,
    key: &str,
) -> Result<Option<bool>, CodecError> {
    match options.and_then(|m| m.get(key)) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(value) => Err(CodecError::Config(format!(
            "{codec}: {key} must be a boolean, not {value}"
        ))),
    }
}

/// An optional string option; absent or `null` is `None`.
pub(crate) fn optional_str<'a>(
    codec: &str,
    options: Option<&'a Map<String, Value>>,
    key: &str,
) -> Result<Option<&'a str>, CodecError> {
    match options.and_then(|m| m.get(key)) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.as_str())),
        Some(value) => Err(CodecError::Config(format!(
            "{codec}: {key} must be a string, not {value}"
        ))),
    }
}

#[cfg(test)]
pub(crate) mod test_vectors {
    //! The numcodecs vectors under `tests/fixtures/codecs/`, written by `make_codec_vectors.py`.

    /// The decoded bytes every vector encodes (256 little-endian `u32`).
    pub(crate) fn expected() -> Vec<u8> {
        std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/codecs/expected.bin"
        ))
        .unwrap()
    }

    /// One vector: `tests/fixtures/codecs/<codec>/<name>.bin`.
    pub(crate) fn vector(codec: &str, name: &str) -> Vec<u8> {
        let path = format!(
            "{}/tests/fixtures/codecs/{codec}/{name}.bin",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// Bytes written as hex digits, whitespace ignored (`"93 a1ff"`).
    pub(crate) fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// Zeros, compressible to almost nothing: the plain text of the bomb tests.
    pub(crate) const BOMB_LEN: usize = 100 << 20;
    /// The limit the bomb tests decode with.
    pub(crate) const BOMB_LIMIT: usize = 1 << 20;
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn v2_dispatch() {
        for id in [
            "gzip",
            "zlib",
            "zstd",
            "blosc",
            "lz4",
            "bz2",
            "lzma",
            "shuffle",
            "crc32c",
            "crc32",
            "adler32",
            "fletcher32",
            "jenkins_lookup3",
            "base64",
        ] {
            assert!(bytes_codec_v2(&json!({ "id": id })).unwrap().is_some(), "{id}");
        }
        for id in [
            "delta",
            "fixedscaleoffset",
            "quantize",
            "packbits",
            "categorize",
            "astype",
            "vlen-utf8",
            "json2",
        ] {
            assert!(
                bytes_codec_v2(&json!({ "id": id, "dtype": "<i4" })).unwrap().is_none(),
                "{id}"
            );
        }
        for id in ["zfpy", "pcodec", "pickle"] {
            assert!(bytes_codec_v2(&json!({ "id": id })).unwrap().is_none(), "{id}");
        }
        assert!(matches!(
            bytes_codec_v2(&json!({ "level": 1 })),
            Err(CodecError::Config(_))
        ));
        assert!(matches!(
            bytes_codec_v2(&json!({ "id": 5 })),
            Err(CodecError::Config(_))
        ));
        assert!(matches!(
            bytes_codec_v2(&json!({ "id": "zlib", "level": 42 })),
            Err(CodecError::Config(_))
        ));
    }

    #[test]
    fn v3_dispatch() {
        assert!(bytes_codec_v3("gzip", Some(&json!({ "level": 5 }))).unwrap().is_some());
        assert!(
            bytes_codec_v3("zstd", Some(&json!({ "level": 0, "checksum": false })))
                .unwrap()
                .is_some()
        );
        assert!(bytes_codec_v3("crc32c", None).unwrap().is_some());
        let blosc = json!({ "cname": "zstd", "clevel": 5, "shuffle": "shuffle", "typesize": 4, "blocksize": 0 });
        assert!(bytes_codec_v3("blosc", Some(&blosc)).unwrap().is_some());
        assert!(
            bytes_codec_v3("numcodecs.zlib", Some(&json!({ "level": 1 })))
                .unwrap()
                .is_some()
        );
        assert!(
            bytes_codec_v3("numcodecs.bz2", Some(&json!({ "id": "bz2", "level": 1 })))
                .unwrap()
                .is_some()
        );
        assert!(bytes_codec_v3("numcodecs.lz4", None).unwrap().is_some());
        assert!(
            bytes_codec_v3("numcodecs.lzma", Some(&json!({ "format": 1, "check": -1 })))
                .unwrap()
                .is_some()
        );
        assert!(
            bytes_codec_v3("numcodecs.shuffle", Some(&json!({ "elementsize": 8 })))
                .unwrap()
                .is_some()
        );
        assert!(
            bytes_codec_v3("bytes", Some(&json!({ "endian": "little" })))
                .unwrap()
                .is_none()
        );
        assert!(
            bytes_codec_v3("transpose", Some(&json!({ "order": [1, 0] })))
                .unwrap()
                .is_none()
        );
        assert!(
            bytes_codec_v3("numcodecs.delta", Some(&json!({ "dtype": "<i4" })))
                .unwrap()
                .is_none()
        );
        assert!(matches!(
            bytes_codec_v3("numcodecs.zlib", Some(&json!({ "id": "gzip" }))),
            Err(CodecError::Config(_))
        ));
        assert!(matches!(
            bytes_codec_v3("gzip", Some(&json!([1]))),
            Err(CodecError::Config(_))
        ));
    }

    #[test]
    fn v2_and_v3_decode_the_same_vectors() {
        let expected = test_vectors::expected();
        let v2 = bytes_codec_v2(&json!({ "id": "zlib", "level": 1 })).unwrap().unwrap();
        assert_eq!(
            v2.decode(&test_vectors::vector("zlib", "level1"), 1 << 20).unwrap(),
            expected
        );
        let v3 = bytes_codec_v3("numcodecs.zlib", Some(&json!({ "level": 1 })))
            .unwrap()
            .unwrap();
        assert_eq!(
            v3.decode(&test_vectors::vector("zlib", "level1"), 1 << 20).unwrap(),
            expected
        );
    }

    #[test]
    fn read_limited_stops_one_past_the_limit() {
        let data = [7u8; 10];
        let io_err = |e: std::io::Error| CodecError::Corrupt(e.to_string());
        assert_eq!(read_limited(&data[..], 10, 100, io_err).unwrap(), data);
        assert_eq!(
            read_limited(&data[..], 9, 0, io_err),
            Err(CodecError::TooLarge { limit: 9 })
        );
        assert_eq!(read_limited(&data[..0], 0, 0, io_err).unwrap(), Vec::<u8>::new());
    }
}
