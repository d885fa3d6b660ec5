//! `lz4`: numcodecs [`lz4`](https://numcodecs.readthedocs.io/en/stable/compression/lz4.html), a
//! little-endian `u32` uncompressed size followed by one raw
//! [LZ4 block](https://github.com/lz4/lz4/blob/dev/doc/lz4_Block_format.md) (not the LZ4 frame
//! format). The size is checked against the limit before the output is allocated, and the block
//! must fill it exactly.

use serde_json::Value;

use super::{BytesToBytes, CodecError, numcodecs_object, optional_int};

/// The length of the size prefix numcodecs writes.
const PREFIX_LEN: usize = 4;

/// The numcodecs LZ4 decoder. `acceleration` does not matter for decoding, but is checked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Lz4;

impl Lz4 {
    /// From a numcodecs dict: `{"id": "lz4", "acceleration": 1}`; `acceleration` is optional.
    pub fn from_v2(config: &Value) -> Result<Self, CodecError> {
        optional_int(
            "lz4",
            numcodecs_object("lz4", config)?,
            "acceleration",
            i64::from(i32::MIN)..=i64::from(i32::MAX),
        )?;
        Ok(Self)
    }
}

impl BytesToBytes for Lz4 {
    fn decode(&self, input: &[u8], limit: usize) -> Result<Vec<u8>, CodecError> {
        let Some((prefix, block)) = input.split_first_chunk::<PREFIX_LEN>() else {
            return Err(CodecError::Corrupt(format!(
                "lz4: {} bytes, shorter than the size prefix",
                input.len()
            )));
        };
        let size = usize::try_from(u32::from_le_bytes(*prefix)).map_err(|_| CodecError::TooLarge { limit })?;
        if size > limit {
            return Err(CodecError::TooLarge { limit });
        }
        // An LZ4 block expands at most 255-fold (plus a few bytes): a bigger claim is a lie.
        if size / 255 > block.len() {
            return Err(CodecError::Corrupt(format!(
                "lz4: {} bytes cannot decode to {size}",
                block.len()
            )));
        }
        let mut out = crate::buffers::DECODED.take_zeroed(size);
        let written =
            lz4_flex::block::decompress_into(block, &mut out).map_err(|e| CodecError::Corrupt(format!("lz4: {e}")))?;
        if written != size {
            return Err(CodecError::Corrupt(format!(
                "lz4: block decoded to {written} bytes, prefix says {size}"
            )));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::codec::test_vectors::{BOMB_LEN, BOMB_LIMIT, expected, vector};

    /// What numcodecs writes: size prefix, then the block.
    fn encode(data: &[u8]) -> Vec<u8> {
        let mut out = u32::try_from(data.len()).unwrap().to_le_bytes().to_vec();
        out.extend(lz4_flex::block::compress(data));
        out
    }

    #[test]
    fn decodes_numcodecs_vector() {
        let input = vector("lz4", "accel1");
        assert_eq!(u32::from_le_bytes(input[..4].try_into().unwrap()), 1024);
        assert_eq!(Lz4.decode(&input, 1 << 20).unwrap(), expected());
        assert_eq!(Lz4.decode(&input, 1024).unwrap(), expected());
        assert_eq!(Lz4.decode(&input, 1023), Err(CodecError::TooLarge { limit: 1023 }));
    }

    #[test]
    fn empty_chunk() {
        // numcodecs writes this for an empty buffer (and then fails to decode it).
        assert_eq!(Lz4.decode(b"\x00\x00\x00\x00\x00", 0).unwrap(), Vec::<u8>::new());
    }

    #[test]
    fn corrupt_and_truncated() {
        let input = vector("lz4", "accel1");
        for bad in [&input[..input.len() - 1], &input[..10], &input[..3], &[][..]] {
            assert!(
                matches!(Lz4.decode(bad, 1 << 20), Err(CodecError::Corrupt(_))),
                "{bad:?}"
            );
        }
        // The prefix claims more (or less) than the block holds.
        for claim in [1025u32, 1023, 100_000] {
            let mut lying = input.clone();
            lying[..4].copy_from_slice(&claim.to_le_bytes());
            assert!(
                matches!(Lz4.decode(&lying, 1 << 20), Err(CodecError::Corrupt(_))),
                "{claim}"
            );
        }
        // Every single-byte flip fails cleanly or decodes to the claimed size.
        for i in PREFIX_LEN..input.len() {
            let mut flipped = input.clone();
            flipped[i] ^= 0x5a;
            if let Ok(out) = Lz4.decode(&flipped, 1 << 20) {
                assert_eq!(out.len(), 1024);
            }
        }
    }

    #[test]
    fn bomb_is_too_large() {
        let bomb = encode(&vec![0u8; BOMB_LEN]);
        assert_eq!(
            Lz4.decode(&bomb, BOMB_LIMIT),
            Err(CodecError::TooLarge { limit: BOMB_LIMIT })
        );
        // A 4 GiB claim in a tiny buffer is refused before allocating, whatever the limit.
        assert_eq!(
            Lz4.decode(b"\xff\xff\xff\xff\x00", 1 << 20),
            Err(CodecError::TooLarge { limit: 1 << 20 })
        );
        assert!(matches!(
            Lz4.decode(b"\xff\xff\xff\x7f\x00", usize::MAX),
            Err(CodecError::Corrupt(_))
        ));
    }

    #[test]
    fn config() {
        assert_eq!(Lz4::from_v2(&json!({ "id": "lz4", "acceleration": 1 })), Ok(Lz4));
        assert_eq!(Lz4::from_v2(&json!({})), Ok(Lz4));
        assert!(matches!(
            Lz4::from_v2(&json!({ "id": "lz4", "acceleration": "fast" })),
            Err(CodecError::Config(_))
        ));
        assert!(matches!(
            Lz4::from_v2(&json!({ "id": "zstd" })),
            Err(CodecError::Config(_))
        ));
    }
}
