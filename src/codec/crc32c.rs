//! `crc32c`: a CRC32C (Castagnoli) checksum appended to the bytes.
//!
//! Zarr v3 [`crc32c` codec](https://zarr-specs.readthedocs.io/en/latest/v3/codecs/crc32c/index.html):
//! the last 4 bytes are the little-endian CRC32C of the rest. numcodecs
//! [`crc32c`](https://numcodecs.readthedocs.io/en/stable/checksum32.html) writes the same by
//! default (`location: "end"`) and can put the checksum first instead (`location: "start"`).
//! Decoding checks the checksum and drops it.

use serde_json::Value;

pub use super::checksum32::ChecksumLocation;
use super::checksum32::verified;
use super::{BytesToBytes, CodecError, config_object};

/// The CRC32C checksum codec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crc32c {
    /// Where the checksum sits.
    pub location: ChecksumLocation,
}

impl Crc32c {
    /// From a numcodecs dict: `{"id": "crc32c", "location": "end"}`; `location` is optional,
    /// `"start"` or `"end"`.
    pub fn from_v2(config: &Value) -> Result<Self, CodecError> {
        Ok(Self {
            location: ChecksumLocation::from_v2("crc32c", config, ChecksumLocation::End)?,
        })
    }

    /// From a v3 configuration, which has no options: absent, `null` or `{}`.
    pub fn from_v3(configuration: Option<&Value>) -> Result<Self, CodecError> {
        if let Some(options) = config_object("crc32c", configuration)?
            && let Some(key) = options.keys().next()
        {
            return Err(CodecError::Config(format!("crc32c: unknown option {key:?}")));
        }
        Ok(Self {
            location: ChecksumLocation::End,
        })
    }
}

impl BytesToBytes for Crc32c {
    fn decode(&self, input: &[u8], limit: usize) -> Result<Vec<u8>, CodecError> {
        verified("crc32c", input, self.location, limit, crc32c::crc32c)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::codec::test_vectors::{expected, vector};

    const END: Crc32c = Crc32c {
        location: ChecksumLocation::End,
    };

    #[test]
    fn decodes_numcodecs_vector() {
        let input = vector("crc32c", "input");
        assert_eq!(END.decode(&input, 1 << 20).unwrap(), expected());
        assert_eq!(END.decode(&input, 1024).unwrap(), expected());
        assert_eq!(END.decode(&input, 1023), Err(CodecError::TooLarge { limit: 1023 }));
    }

    #[test]
    fn known_value_and_start_location() {
        // The CRC32C check value of the spec's test string.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        let mut at_end = b"123456789".to_vec();
        at_end.extend(0xe306_9283u32.to_le_bytes());
        assert_eq!(END.decode(&at_end, 100).unwrap(), b"123456789");
        let mut at_start = 0xe306_9283u32.to_le_bytes().to_vec();
        at_start.extend(b"123456789");
        let start = Crc32c {
            location: ChecksumLocation::Start,
        };
        assert_eq!(start.decode(&at_start, 100).unwrap(), b"123456789");
        // Empty data has checksum 0.
        assert_eq!(END.decode(&[0; 4], 0).unwrap(), Vec::<u8>::new());
    }

    #[test]
    fn mismatch_and_truncated_are_corrupt() {
        let input = vector("crc32c", "input");
        for i in [0, 500, input.len() - 1] {
            let mut flipped = input.clone();
            flipped[i] ^= 0x01;
            assert!(
                matches!(END.decode(&flipped, 1 << 20), Err(CodecError::Corrupt(_))),
                "{i}"
            );
        }
        for bad in [&input[..input.len() - 1], &input[..3], &[][..]] {
            assert!(
                matches!(END.decode(bad, 1 << 20), Err(CodecError::Corrupt(_))),
                "{}",
                bad.len()
            );
        }
    }

    #[test]
    fn config() {
        assert_eq!(Crc32c::from_v3(None), Ok(END));
        assert_eq!(Crc32c::from_v3(Some(&json!({}))), Ok(END));
        assert!(matches!(
            Crc32c::from_v3(Some(&json!({ "location": "end" }))),
            Err(CodecError::Config(_))
        ));
        assert!(matches!(Crc32c::from_v3(Some(&json!("x"))), Err(CodecError::Config(_))));
        assert_eq!(Crc32c::from_v2(&json!({ "id": "crc32c" })), Ok(END));
        let start = Crc32c::from_v2(&json!({ "id": "crc32c", "location": "start" }));
        assert_eq!(
            start,
            Ok(Crc32c {
                location: ChecksumLocation::Start
            })
        );
        assert!(matches!(
            Crc32c::from_v2(&json!({ "id": "crc32c", "location": "middle" })),
            Err(CodecError::Config(_))
        ));
    }
}
