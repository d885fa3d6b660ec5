//! `lzma`: numcodecs [`lzma`](https://numcodecs.readthedocs.io/en/stable/compression/lzma.html),
//! written by Python's `lzma.compress` in one of its formats: `.xz`
//! ([format](https://tukaani.org/xz/xz-file-format.txt), numcodecs' default, `format: 1`), legacy
//! `.lzma` ("alone", `format: 2`), or raw LZMA (`format: 3`, not decodable without the filter
//! chain; [`CodecError::Unsupported`]). liblzma (built from source) decodes, verifying the
//! integrity check of `.xz` (CRC32, CRC64, SHA-256). Concatenated `.xz` streams are read, as
//! Python's `lzma.decompress` does.

use liblzma::bufread::XzDecoder;
use liblzma::stream::{CONCATENATED, Stream};
use serde_json::Value;

use super::{BytesToBytes, CodecError, numcodecs_object, optional_int, read_limited};

/// The memory the decoder may use, dictionary included. `xz -9` needs 65 MiB whatever the data
/// size, so this cannot follow the output limit; liblzma commits the dictionary only as it is
/// written.
const MEMLIMIT: u64 = 256 << 20;

/// The container format, numcodecs' `format` (Python's `lzma.FORMAT_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LzmaFormat {
    /// `FORMAT_AUTO` (0): `.xz` or `.lzma`, told apart by the magic bytes.
    Auto,
    /// `FORMAT_XZ` (1), the default.
    Xz,
    /// `FORMAT_ALONE` (2): the legacy `.lzma` format.
    Alone,
}

/// The LZMA decoder for one container format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lzma {
    /// The container format.
    pub format: LzmaFormat,
}

impl Lzma {
    /// From a numcodecs dict: `{"id": "lzma", "format": 1, "check": -1, "preset": null,
    /// "filters": null}`, every key optional. `format` 0, 1 or 2; 3 (raw) is
    /// [`CodecError::Unsupported`]. `filters` are recorded in `.xz` and `.lzma` headers, so they
    /// are only checked to be a list.
    pub fn from_v2(config: &Value) -> Result<Self, CodecError> {
        let options = numcodecs_object("lzma", config)?;
        let format = match optional_int("lzma", options, "format", 0..=3)? {
            Some(0) => LzmaFormat::Auto,
            None | Some(1) => LzmaFormat::Xz,
            Some(2) => LzmaFormat::Alone,
            _ => return Err(CodecError::Unsupported("lzma format 3 (raw)".to_string())),
        };
        optional_int("lzma", options, "check", -1..=16)?;
        optional_int("lzma", options, "preset", 0..=i64::from(u32::MAX))?;
        match options.and_then(|m| m.get("filters")) {
            None | Some(Value::Null | Value::Array(_)) => {}
            Some(other) => return Err(CodecError::Config(format!("lzma: filters must be a list, not {other}"))),
        }
        Ok(Self { format })
    }

    fn stream(&self) -> Result<Stream, liblzma::stream::Error> {
        match self.format {
            LzmaFormat::Auto => Stream::new_auto_decoder(MEMLIMIT, CONCATENATED),
            LzmaFormat::Xz => Stream::new_stream_decoder(MEMLIMIT, CONCATENATED),
            LzmaFormat::Alone => Stream::new_lzma_decoder(MEMLIMIT),
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
        let raw = json!({ "id": "lzma", "format": 3, "filters": [{ "id": 33 }] });
        assert!(matches!(Lzma::from_v2(&raw), Err(CodecError::Unsupported(_))));
        for bad in [
            json!({ "id": "lzma", "format": 4 }),
            json!({ "id": "lzma", "filters": "lzma2" }),
            json!({ "id": "lzma", "check": "crc64" }),
        ] {
            assert!(matches!(Lzma::from_v2(&bad), Err(CodecError::Config(_))), "{bad}");
        }
    }
}
