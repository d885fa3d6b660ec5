//! `lzma`: numcodecs [`lzma`](https://numcodecs.readthedocs.io/en/stable/compression/lzma.html),
//! written by Python's `lzma.compress` in one of its formats: `.xz`
//! ([format](https://tukaani.org/xz/xz-file-format.txt), numcodecs' default, `format: 1`), legacy
//! `.lzma` ("alone", `format: 2`), or raw (`format: 3`), whose filter chain (`filters`, in
//! Python's filter-spec dicts) is not in the data but in the codec's configuration. liblzma
//! (built from source) decodes, verifying the integrity check of `.xz` (CRC32, CRC64, SHA-256).
//! Concatenated `.xz` streams are read, as Python's `lzma.decompress` does.

use liblzma::bufread::XzDecoder;
use liblzma::stream::{CONCATENATED, Filters, LzmaOptions, Stream};
use serde_json::{Map, Value};

use super::{BytesToBytes, CodecError, numcodecs_object, optional_int, read_limited};

/// The memory the decoder may use, dictionary included. `xz -9` needs 65 MiB whatever the data
/// size, so this cannot follow the output limit; liblzma commits the dictionary only as it is
/// written. Zip archives' LZMA entries are read within it too.
pub(crate) const MEMLIMIT: u64 = 256 << 20;

/// The container format, numcodecs' `format` (Python's `lzma.FORMAT_*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LzmaFormat {
    /// `FORMAT_AUTO` (0): `.xz` or `.lzma`, told apart by the magic bytes.
    Auto,
    /// `FORMAT_XZ` (1), the default.
    Xz,
    /// `FORMAT_ALONE` (2): the legacy `.lzma` format.
    Alone,
    /// `FORMAT_RAW` (3): the bare filter chain's output, the chain given in encoding order.
    Raw(Vec<RawFilter>),
}

/// A filter of a raw chain, from one of Python's filter-spec dicts (`{"id": lzma.FILTER_*,
/// ...}`), with what decoding needs of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RawFilter {
    /// `FILTER_LZMA1` or `FILTER_LZMA2` (`lzma2`): a preset (`preset`, default 6) and the
    /// options that override it (`dict_size`, `lc`, `lp`, `pb`).
    Lzma {
        lzma2: bool,
        preset: u32,
        dict_size: Option<u32>,
        lc: Option<u32>,
        lp: Option<u32>,
        pb: Option<u32>,
    },
    /// `FILTER_DELTA`: the distance in bytes (`dist`, default 1).
    Delta { dist: u32 },
    /// A branch/call/jump filter (`FILTER_X86` .. `FILTER_SPARC`) and its `start_offset`.
    Bcj { id: u64, start_offset: u32 },
}

/// Python's `lzma.FILTER_*` ids.
const FILTER_LZMA1: u64 = 0x4000_0000_0000_0001;
const FILTER_LZMA2: u64 = 0x21;
const FILTER_DELTA: u64 = 0x03;
/// `FILTER_X86`, `FILTER_POWERPC`, `FILTER_IA64`, `FILTER_ARM`, `FILTER_ARMTHUMB`,
/// `FILTER_SPARC`.
const FILTERS_BCJ: std::ops::RangeInclusive<u64> = 0x04..=0x09;

/// The LZMA decoder for one container format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lzma {
    /// The container format.
    pub format: LzmaFormat,
}

/// A raw chain from numcodecs' `filters`: at most four filters, LZMA1 or LZMA2 last and only
/// there (as liblzma requires), dictionaries within [`MEMLIMIT`].
fn raw_filters(filters: Option<&Value>) -> Result<Vec<RawFilter>, CodecError> {
    let config = |m: String| CodecError::Config(format!("lzma: {m}"));
    let Some(Value::Array(specs)) = filters else {
        return Err(config("format 3 (raw) needs its filters".into()));
    };
    if specs.is_empty() || specs.len() > 4 {
        return Err(config(format!("a raw chain has 1 to 4 filters, not {}", specs.len())));
    }
    let mut chain = Vec::with_capacity(specs.len());
    for (i, spec) in specs.iter().enumerate() {
        let spec = spec
            .as_object()
            .ok_or_else(|| config(format!("filter {spec} is not a dict")))?;
        let id = spec
            .get("id")
            .and_then(Value::as_u64)
            .ok_or_else(|| config("a filter without an integer id".into()))?;
        let last = i + 1 == specs.len();
        let option = |key: &str, max: u32| -> Result<Option<u32>, CodecError> {
            match spec.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => match v.as_u64().and_then(|n| u32::try_from(n).ok()) {
                    Some(n) if n <= max => Ok(Some(n)),
                    _ => Err(config(format!(
                        "filter option {key} must be an integer up to {max}, not {v}"
                    ))),
                },
            }
        };
        let filter = match id {
            FILTER_LZMA1 | FILTER_LZMA2 => {
                if !last {
                    return Err(config("LZMA1 / LZMA2 must be the last filter".into()));
                }
                let dict_size = option("dict_size", u32::MAX)?;
                if dict_size.is_some_and(|d| u64::from(d) > MEMLIMIT) {
                    return Err(CodecError::Unsupported(format!(
                        "lzma dictionary over {} MiB",
                        MEMLIMIT >> 20
                    )));
                }
                RawFilter::Lzma {
                    lzma2: id == FILTER_LZMA2,
                    // LZMA_PRESET_EXTREME (1 << 31) may be or'ed into the level.
                    preset: option("preset", u32::MAX)?.unwrap_or(6),
                    dict_size,
                    lc: option("lc", 8)?,
                    lp: option("lp", 4)?,
                    pb: option("pb", 4)?,
                }
            }
            FILTER_DELTA => RawFilter::Delta {
                dist: option("dist", 256)?.unwrap_or(1).max(1),
            },
            id if FILTERS_BCJ.contains(&id) => RawFilter::Bcj {
                id,
                start_offset: option("start_offset", u32::MAX)?.unwrap_or(0),
            },
            other => return Err(CodecError::Unsupported(format!("lzma filter id {other}"))),
        };
        if last && !matches!(filter, RawFilter::Lzma { .. }) {
            return Err(config("a raw chain ends with LZMA1 or LZMA2".into()));
        }
        chain.push(filter);
    }
    // What liblzma refuses (a preset past 9) is the configuration's
    // fault, told now rather than as bad data of every chunk.
    liblzma_filters(&chain)
        .and_then(|filters| Stream::new_raw_decoder(&filters))
        .map_err(|e| config(format!("the raw filter chain is not one liblzma decodes: {e}")))?;
    Ok(chain)
}

/// liblzma's filter chain for a raw chain.
fn liblzma_filters(chain: &[RawFilter]) -> Result<Filters, liblzma::stream::Error> {
    let mut filters = Filters::new();
    for filter in chain {
        match filter {
            RawFilter::Lzma {
                lzma2,
                preset,
                dict_size,
                lc,
                lp,
                pb,
            } => {
                let mut options = LzmaOptions::new_preset(*preset)?;
                if let Some(d) = dict_size {
                    options.dict_size(*d);
                }
                if let Some(lc) = lc {
                    options.literal_context_bits(*lc);
                }
                if let Some(lp) = lp {
                    options.literal_position_bits(*lp);
                }
                if let Some(pb) = pb {
                    options.position_bits(*pb);
                }
                if *lzma2 {
                    filters.lzma2(&options);
                } else {
                    filters.lzma1(&options);
                }
            }
            // The delta filter's one property byte is the distance less one.
            RawFilter::Delta { dist } => {
                filters.delta_properties(&[(*dist - 1) as u8])?;
            }
            RawFilter::Bcj { id, start_offset } => {
                let offset = start_offset.to_le_bytes();
                let properties: &[u8] = if *start_offset == 0 { &[] } else { &offset };
                match id {
                    0x04 => filters.x86_properties(properties)?,
                    0x05 => filters.powerpc_properties(properties)?,
                    0x06 => filters.ia64_properties(properties)?,
                    0x07 => filters.arm_properties(properties)?,
                    0x08 => filters.arm_thumb_properties(properties)?,
                    _ => filters.sparc_properties(properties)?,
                };
            }
        }
    }
    Ok(filters)
}

impl Lzma {
    /// From a numcodecs dict: `{"id": "lzma", "format": 1, "check": -1, "preset": null,
    /// "filters": null}`, every key optional. `format` 0, 1, 2 or 3 (raw). The `filters` of the
    /// other formats are recorded in their headers, so they are only checked to be a list; a
    /// raw chain is read from them ([`raw_filters`]).
    pub fn from_v2(config: &Value) -> Result<Self, CodecError> {
        let options: Option<&Map<String, Value>> = numcodecs_object("lzma", config)?;
        let filters = options.and_then(|m| m.get("filters"));
        match filters {
            None | Some(Value::Null | Value::Array(_)) => {}
            Some(other) => return Err(CodecError::Config(format!("lzma: filters must be a list, not {other}"))),
        }
        let format = match optional_int("lzma", options, "format", 0..=3)? {
            Some(0) => LzmaFormat::Auto,
            None | Some(1) => LzmaFormat::Xz,
            Some(2) => LzmaFormat::Alone,
            _ => LzmaFormat::Raw(raw_filters(filters)?),
        };
        optional_int("lzma", options, "check", -1..=16)?;
        optional_int("lzma", options, "preset", 0..=i64::from(u32::MAX))?;
        Ok(Self { format })
    }

    fn stream(&self) -> Result<Stream, liblzma::stream::Error> {
        match &self.format {
            LzmaFormat::Auto => Stream::new_auto_decoder(MEMLIMIT, CONCATENATED),
            LzmaFormat::Xz => Stream::new_stream_decoder(MEMLIMIT, CONCATENATED),
            LzmaFormat::Alone => Stream::new_lzma_decoder(MEMLIMIT),
            LzmaFormat::Raw(chain) => Stream::new_raw_decoder(&liblzma_filters(chain)?),
        }
    }
}

/// Maps a decoder error: the memory limit is a limit of this server, anything else is bad data.
fn decode_error(e: std::io::Error) -> CodecError {
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<liblzma::stream::Error>())
    {
        Some(liblzma::stream::Error::MemLimit) => CodecError::Unsupported(format!(
            "lzma stream needing more than {} MiB to decode",
            MEMLIMIT >> 20
        )),
        _ => CodecError::Corrupt(format!("lzma: {e}")),
    }
}

impl BytesToBytes for Lzma {
    fn decode(&self, input: &[u8], limit: usize) -> Result<Vec<u8>, CodecError> {
        if input.is_empty() {
            return Err(CodecError::Corrupt("lzma: empty input".to_string()));
        }
        let stream = self
            .stream()
            .map_err(|e| CodecError::Corrupt(format!("lzma: decoder setup: {e}")))?;
        read_limited(
            XzDecoder::new_stream(input, stream),
            limit,
            input.len().saturating_mul(4),
            decode_error,
        )
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use liblzma::stream::{Check, LzmaOptions};
    use serde_json::json;

    use super::*;
    use crate::codec::test_vectors::{BOMB_LIMIT, expected, vector};

    const XZ: Lzma = Lzma { format: LzmaFormat::Xz };
    const ALONE: Lzma = Lzma {
        format: LzmaFormat::Alone,
    };
    const AUTO: Lzma = Lzma {
        format: LzmaFormat::Auto,
    };

    #[test]
    fn decodes_numcodecs_vectors() {
        for (codec, name) in [
            (XZ, "xz_default"),
            (XZ, "xz_crc32"),
            (ALONE, "alone"),
            (AUTO, "xz_default"),
            (AUTO, "alone"),
        ] {
            assert_eq!(
                codec.decode(&vector("lzma", name), 1 << 20).unwrap(),
                expected(),
                "{name} {codec:?}"
            );
        }
        // Written with a delta filter before LZMA2: the block header names the chain.
        assert_eq!(
            XZ.decode(&vector("lzma", "xz_delta_filter"), 1 << 20).unwrap(),
            expected()
        );
        let sha256 = compress(&expected(), Stream::new_easy_encoder(1, Check::Sha256).unwrap());
        assert_eq!(XZ.decode(&sha256, 1 << 20).unwrap(), expected());
        let mut two = vector("lzma", "xz_default");
        two.extend(vector("lzma", "xz_crc32"));
        assert_eq!(XZ.decode(&two, 1 << 20).unwrap(), [expected(), expected()].concat());
    }

    #[test]
    fn wrong_format_is_corrupt() {
        assert!(matches!(
            XZ.decode(&vector("lzma", "alone"), 1 << 20),
            Err(CodecError::Corrupt(_))
        ));
        assert!(matches!(
            ALONE.decode(&vector("lzma", "xz_default"), 1 << 20),
            Err(CodecError::Corrupt(_))
        ));
    }

    #[test]
    fn corrupt_and_truncated() {
        for (codec, name) in [(XZ, "xz_default"), (ALONE, "alone")] {
            let input = vector("lzma", name);
            for bad in [
                &input[..input.len() - 1],
                &input[..input.len() / 2],
                &input[..5],
                &[][..],
            ] {
                assert!(
                    matches!(codec.decode(bad, 1 << 20), Err(CodecError::Corrupt(_))),
                    "{name} {}",
                    bad.len()
                );
            }
        }
        let mut flipped = vector("lzma", "xz_default");
        flipped[100] ^= 0x10;
        assert!(matches!(XZ.decode(&flipped, 1 << 20), Err(CodecError::Corrupt(_))));
    }

    fn compress(data: &[u8], stream: Stream) -> Vec<u8> {
        let mut out = Vec::new();
        liblzma::bufread::XzEncoder::new_stream(data, stream)
            .read_to_end(&mut out)
            .unwrap();
        out
    }

    #[test]
    fn bomb_is_too_large() {
        // LZMA encodes zeros slowly; 16 times the limit makes the same point as BOMB_LEN.
        let zeros = vec![0u8; 16 * BOMB_LIMIT];
        let xz = compress(&zeros, Stream::new_easy_encoder(6, Check::Crc64).unwrap());
        assert!(xz.len() < 64 << 10);
        assert_eq!(
            XZ.decode(&xz, BOMB_LIMIT),
            Err(CodecError::TooLarge { limit: BOMB_LIMIT })
        );
        let alone = compress(
            &zeros,
            Stream::new_lzma_encoder(&LzmaOptions::new_preset(1).unwrap()).unwrap(),
        );
        assert_eq!(
            ALONE.decode(&alone, BOMB_LIMIT),
            Err(CodecError::TooLarge { limit: BOMB_LIMIT })
        );
    }

    #[test]
    fn huge_dictionary_is_unsupported() {
        // A 1 GiB dictionary is legal but beyond the memory limit.
        let mut options = LzmaOptions::new_preset(1).unwrap();
        options.dict_size(1 << 30);
        let alone = compress(b"tiny", Stream::new_lzma_encoder(&options).unwrap());
        assert!(matches!(ALONE.decode(&alone, 1 << 20), Err(CodecError::Unsupported(_))));
    }

    #[test]
    fn config() {
        assert_eq!(
            Lzma::from_v2(&json!({ "id": "lzma", "format": 1, "check": -1, "preset": null, "filters": null })),
            Ok(XZ)
        );
        assert_eq!(Lzma::from_v2(&json!({ "id": "lzma" })), Ok(XZ));
        assert_eq!(
            Lzma::from_v2(&json!({ "id": "lzma", "format": 2, "preset": 1 })),
            Ok(ALONE)
        );
        assert_eq!(Lzma::from_v2(&json!({ "id": "lzma", "format": 0 })), Ok(AUTO));
        let filters = json!({ "id": "lzma", "filters": [{ "id": 3, "dist": 4 }, { "id": 33, "preset": 1 }] });
        assert_eq!(Lzma::from_v2(&filters), Ok(XZ));
        let raw = json!({ "id": "lzma", "format": 3, "filters": [{ "id": 3, "dist": 2 }, { "id": 33 }] });
        let chain = vec![
            RawFilter::Delta { dist: 2 },
            RawFilter::Lzma {
                lzma2: true,
                preset: 6,
                dict_size: None,
                lc: None,
                lp: None,
                pb: None,
            },
        ];
        assert_eq!(
            Lzma::from_v2(&raw),
            Ok(Lzma {
                format: LzmaFormat::Raw(chain)
            })
        );
        for bad in [
            json!({ "id": "lzma", "format": 4 }),
            json!({ "id": "lzma", "filters": "lzma2" }),
            json!({ "id": "lzma", "check": "crc64" }),
            // Raw chains: given, 1 to 4 filters, ending with (and only there) LZMA1 or LZMA2.
            json!({ "id": "lzma", "format": 3 }),
            json!({ "id": "lzma", "format": 3, "filters": [] }),
            json!({ "id": "lzma", "format": 3, "filters": [{ "id": 3 }] }),
            json!({ "id": "lzma", "format": 3, "filters": [{ "id": 33 }, { "id": 3 }] }),
            json!({ "id": "lzma", "format": 3, "filters": [{ "id": 33 }, { "id": 33 }] }),
            json!({ "id": "lzma", "format": 3, "filters": [{ "dist": 1 }, { "id": 33 }] }),
            json!({ "id": "lzma", "format": 3, "filters": [{ "id": 3, "dist": 300 }, { "id": 33 }] }),
            json!({ "id": "lzma", "format": 3, "filters": [{ "id": 33, "lc": 9 }] }),
            json!({ "id": "lzma", "format": 3, "filters": [{ "id": 33, "preset": 10 }] }),
            json!({ "id": "lzma", "format": 3, "filters": [{ "id": 3 }, { "id": 3 }, { "id": 3 }, { "id": 3 }, { "id": 33 }] }),
        ] {
            assert!(matches!(Lzma::from_v2(&bad), Err(CodecError::Config(_))), "{bad}");
        }
        for unsupported in [
            json!({ "id": "lzma", "format": 3, "filters": [{ "id": 99 }, { "id": 33 }] }),
            json!({ "id": "lzma", "format": 3, "filters": [{ "id": 33, "dict_size": 1u64 << 30 }] }),
        ] {
            assert!(
                matches!(Lzma::from_v2(&unsupported), Err(CodecError::Unsupported(_))),
                "{unsupported}"
            );
        }
    }

    /// Raw streams decode with the chain numcodecs was given (the specs of
    /// make_codec_vectors.py): LZMA2 alone, LZMA1 with its own lc/lp/pb and dictionary, and
    /// LZMA2 after a delta or a BCJ filter; the wrong chain does not give the data.
    #[test]
    fn raw_streams_decode_with_their_filters() {
        let codec = |filters: Value| Lzma::from_v2(&json!({ "id": "lzma", "format": 3, "filters": filters })).unwrap();
        let lzma2 = codec(json!([{ "id": 33, "preset": 1 }]));
        for (name, codec) in [
            ("raw_lzma2", lzma2.clone()),
            (
                "raw_lzma1",
                codec(json!([{ "id": 4611686018427387905u64, "dict_size": 65536, "lc": 2, "lp": 1, "pb": 1 }])),
            ),
            ("raw_delta_lzma2", codec(json!([{ "id": 3, "dist": 4 }, { "id": 33 }]))),
            (
                "raw_x86_lzma2",
                codec(json!([{ "id": 4 }, { "id": 33, "preset": 2147483657u64 }])),
            ),
        ] {
            assert_eq!(
                codec.decode(&vector("lzma", name), 1 << 20).unwrap(),
                expected(),
                "{name}"
            );
        }
        let wrong = lzma2.decode(&vector("lzma", "raw_delta_lzma2"), 1 << 20);
        assert!(wrong.is_err() || wrong.is_ok_and(|d| d != expected()));
        assert!(matches!(
            lzma2.decode(&vector("lzma", "xz_default"), 1 << 20),
            Err(CodecError::Corrupt(_))
        ));
        let n = expected().len();
        assert_eq!(
            lzma2.decode(&vector("lzma", "raw_lzma2"), n - 1),
            Err(CodecError::TooLarge { limit: n - 1 })
        );
    }
}
