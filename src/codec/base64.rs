//! `base64`: the bytes as standard Base64 text (RFC 4648 alphabet, with padding).
//!
//! numcodecs [`base64`](https://numcodecs.readthedocs.io/en/stable/other/base64.html) (v2 id; v3
//! `numcodecs.base64`), which has no options.

use base64::Engine;
use serde_json::Value;

use super::{BytesToBytes, CodecError, numcodecs_object};

/// The Base64 codec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Base64;

impl Base64 {
    /// From a numcodecs dict: `{"id": "base64"}`.
    pub fn from_v2(config: &Value) -> Result<Self, CodecError> {
        numcodecs_object("base64", config)?;
        Ok(Self)
    }
}

impl BytesToBytes for Base64 {
    fn decode(&self, input: &[u8], limit: usize) -> Result<Vec<u8>, CodecError> {
        // Every 4 characters are at most 3 bytes: refuse before decoding what cannot fit.
        if input.len() / 4 * 3 > limit.saturating_add(2) {
            return Err(CodecError::TooLarge { limit });
        }
        let out = base64::engine::general_purpose::STANDARD
            .decode(input)
            .map_err(|e| CodecError::Corrupt(format!("base64: {e}")))?;
        if out.len() > limit {
            return Err(CodecError::TooLarge { limit });
        }
        Ok(out)
    }

    fn expansion(&self, _shape: &[u64]) -> (usize, usize) {
        (4, 3)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::codec::test_vectors::{expected, vector};

    #[test]
    fn decodes_numcodecs_vector() {
        let input = vector("base64", "input");
        assert_eq!(Base64.decode(&input, 1 << 20).unwrap(), expected());
        assert_eq!(Base64.decode(&input, 1024).unwrap(), expected());
        assert_eq!(Base64.decode(&input, 1023), Err(CodecError::TooLarge { limit: 1023 }));
        assert_eq!(Base64.decode(&input, 10), Err(CodecError::TooLarge { limit: 10 }));
        assert_eq!(Base64.decode(b"", 0).unwrap(), Vec::<u8>::new());
        assert_eq!(Base64.decode(b"emFycg==", 4).unwrap(), b"zarr");
    }

    #[test]
    fn bad_text_is_corrupt() {
        for bad in [&b"emFycg="[..], b"emFy cg==", b"emF\xffcg==", b"e"] {
            assert!(
                matches!(Base64.decode(bad, 100), Err(CodecError::Corrupt(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn config() {
        assert_eq!(Base64::from_v2(&json!({ "id": "base64" })), Ok(Base64));
        assert!(matches!(
            Base64::from_v2(&json!({ "id": "zlib" })),
            Err(CodecError::Config(_))
        ));
    }
}
