//! `bz2`: numcodecs [`bz2`](https://numcodecs.readthedocs.io/en/stable/compression/bz2.html),
//! written by Python's `bz2.compress` ([format](https://sourceware.org/bzip2/)). Like
//! `bz2.decompress`, decoding reads concatenated streams. The block CRCs and the stream CRC are
//! checked.

use bzip2::bufread::MultiBzDecoder;
use serde_json::Value;

use super::{BytesToBytes, CodecError, numcodecs_object, optional_int, read_limited};

/// The bzip2 decoder. The compression level does not matter for decoding, but is checked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bz2;

impl Bz2 {
    /// From a numcodecs dict: `{"id": "bz2", "level": 1}`; `level` is optional, 1..=9.
    pub fn from_v2(config: &Value) -> Result<Self, CodecError> {
        optional_int("bz2", numcodecs_object("bz2", config)?, "level", 1..=9)?;
        Ok(Self)
    }
}

impl BytesToBytes for Bz2 {
    fn decode(&self, input: &[u8], limit: usize) -> Result<Vec<u8>, CodecError> {
        if input.is_empty() {
            return Err(CodecError::Corrupt("bz2: empty input".to_string()));
        }
        read_limited(MultiBzDecoder::new(input), limit, input.len().saturating_mul(4), |e| {
            CodecError::Corrupt(format!("bz2: {e}"))
        })
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use bzip2::{Compression, write::BzEncoder};
    use serde_json::json;

    use super::*;
    use crate::codec::test_vectors::{BOMB_LEN, BOMB_LIMIT, expected, vector};

    #[test]
    fn decodes_numcodecs_vector() {
        assert_eq!(Bz2.decode(&vector("bz2", "level1"), 1 << 20).unwrap(), expected());
        let mut two = vector("bz2", "level1");
        two.extend(vector("bz2", "level1"));
        assert_eq!(Bz2.decode(&two, 1 << 20).unwrap(), [expected(), expected()].concat());
    }

    #[test]
    fn corrupt_and_truncated() {
        let input = vector("bz2", "level1");
        for bad in [
            &input[..input.len() - 1],
            &input[..20],
            &input[..3],
            &b"BZh9 but not really"[..],
            &[][..],
        ] {
            assert!(
                matches!(Bz2.decode(bad, 1 << 20), Err(CodecError::Corrupt(_))),
                "{bad:?}"
            );
        }
        let mut flipped = input.clone();
        flipped[40] ^= 0x01;
        assert!(matches!(Bz2.decode(&flipped, 1 << 20), Err(CodecError::Corrupt(_))));
    }

    #[test]
    fn bomb_is_too_large() {
        let mut encoder = BzEncoder::new(Vec::new(), Compression::best());
        encoder.write_all(&vec![0u8; BOMB_LEN]).unwrap();
        let bomb = encoder.finish().unwrap();
        assert!(bomb.len() < 64 << 10);
        assert_eq!(
            Bz2.decode(&bomb, BOMB_LIMIT),
            Err(CodecError::TooLarge { limit: BOMB_LIMIT })
        );
    }

    #[test]
    fn config() {
        assert_eq!(Bz2::from_v2(&json!({ "id": "bz2", "level": 9 })), Ok(Bz2));
        assert_eq!(Bz2::from_v2(&json!({ "id": "bz2" })), Ok(Bz2));
        assert!(matches!(
            Bz2::from_v2(&json!({ "id": "bz2", "level": 0 })),
            Err(CodecError::Config(_))
        ));
        assert!(matches!(
            Bz2::from_v2(&json!({ "id": "bz2", "level": "9" })),
            Err(CodecError::Config(_))
        ));
    }
}
