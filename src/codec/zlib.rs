//! `zlib`: a zlib stream ([RFC 1950](https://www.rfc-editor.org/rfc/rfc1950)).
//!
//! numcodecs [`zlib`](https://numcodecs.readthedocs.io/en/stable/compression/zlib.html) writes
//! `zlib.compress(buf, level)`. Like Python's `zlib.decompress`, decoding stops at the end of the
//! stream; the Adler-32 trailer is checked.

use flate2::bufread::ZlibDecoder;
use serde_json::Value;

use super::{BytesToBytes, CodecError, numcodecs_object, optional_int, read_limited};

/// The zlib decoder. The compression level does not matter for decoding, but is checked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Zlib;

impl Zlib {
    /// From a numcodecs dict: `{"id": "zlib", "level": 1}`; `level` is optional, -1..=9.
    pub fn from_v2(config: &Value) -> Result<Self, CodecError> {
        optional_int("zlib", numcodecs_object("zlib", config)?, "level", -1..=9)?;
        Ok(Self)
    }
}

impl BytesToBytes for Zlib {
    fn decode(&self, input: &[u8], limit: usize) -> Result<Vec<u8>, CodecError> {
        read_limited(ZlibDecoder::new(input), limit, input.len().saturating_mul(4), |e| {
            CodecError::Corrupt(format!("zlib: {e}"))
        })
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use flate2::{Compression, write::ZlibEncoder};
    use serde_json::json;

    use super::*;
    use crate::codec::test_vectors::{BOMB_LEN, BOMB_LIMIT, expected, vector};

    #[test]
    fn decodes_numcodecs_vector() {
        assert_eq!(Zlib.decode(&vector("zlib", "level1"), 1 << 20).unwrap(), expected());
    }

    #[test]
    fn corrupt_and_truncated() {
        let input = vector("zlib", "level1");
        for bad in [
            &input[..input.len() - 2],
            &input[..20],
            &input[..1],
            &b"\x78\x9cgarbage!"[..],
            &[][..],
        ] {
            assert!(
                matches!(Zlib.decode(bad, 1 << 20), Err(CodecError::Corrupt(_))),
                "{bad:?}"
            );
        }
        let mut flipped = input.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 0xff; // the Adler-32 trailer
        assert!(matches!(Zlib.decode(&flipped, 1 << 20), Err(CodecError::Corrupt(_))));
    }

    #[test]
    fn bomb_is_too_large() {
        let mut encoder = ZlibEncoder::new(Vec::new(), Compression::best());
        encoder.write_all(&vec![0u8; BOMB_LEN]).unwrap();
        let bomb = encoder.finish().unwrap();
        assert_eq!(
            Zlib.decode(&bomb, BOMB_LIMIT),
            Err(CodecError::TooLarge { limit: BOMB_LIMIT })
        );
    }

    #[test]
    fn config() {
        assert_eq!(Zlib::from_v2(&json!({ "id": "zlib", "level": -1 })), Ok(Zlib));
        assert_eq!(Zlib::from_v2(&json!({ "level": 9 })), Ok(Zlib));
        for bad in [
            json!({ "id": "zlib", "level": 10 }),
            json!({ "id": "zlib", "level": 1.5 }),
            json!("zlib"),
        ] {
            assert!(matches!(Zlib::from_v2(&bad), Err(CodecError::Config(_))), "{bad}");
        }
    }
}
