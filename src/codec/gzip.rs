//! `gzip`: deflate in gzip members ([RFC 1952](https://www.rfc-editor.org/rfc/rfc1952)).
//!
//! Zarr v3 [`gzip` codec](https://zarr-specs.readthedocs.io/en/latest/v3/codecs/gzip/index.html)
//! and numcodecs [`gzip`](https://numcodecs.readthedocs.io/en/stable/compression/gzip.html), which
//! writes with Python's `gzip.GzipFile`: the header carries the current time as mtime, so equal
//! chunks are not equal bytes. Decoding ignores the header fields and reads every member in turn,
//! and zero bytes after the last one, as `GzipFile` does.

use std::io::Read;

use flate2::bufread::GzDecoder;
use serde_json::Value;

use super::{BytesToBytes, CodecError, config_object, numcodecs_object, optional_int, read_limited};

/// The gzip decoder. The compression level does not matter for decoding, but is checked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Gzip;

impl Gzip {
    /// From a numcodecs dict: `{"id": "gzip", "level": 1}`; `level` is optional, -1..=9.
    pub fn from_v2(config: &Value) -> Result<Self, CodecError> {
        optional_int("gzip", numcodecs_object("gzip", config)?, "level", -1..=9)?;
        Ok(Self)
    }

    /// From a v3 configuration: `{"level": 0..=9}`; a missing `level` is accepted.
    pub fn from_v3(configuration: Option<&Value>) -> Result<Self, CodecError> {
        optional_int("gzip", config_object("gzip", configuration)?, "level", 0..=9)?;
        Ok(Self)
    }
}

impl BytesToBytes for Gzip {
    fn decode(&self, input: &[u8], limit: usize) -> Result<Vec<u8>, CodecError> {
        if input.is_empty() {
            return Err(CodecError::Corrupt("gzip: empty input".to_string()));
        }
        read_limited(Members::new(input), limit, input.len().saturating_mul(4), |e| {
            CodecError::Corrupt(format!("gzip: {e}"))
        })
    }
}

/// The data of the gzip members of `input` one after another; zero bytes after a member are
/// padding, skipped as Python's `gzip` skips them, and anything else must be another member.
struct Members<'a> {
    member: Option<GzDecoder<&'a [u8]>>,
}

impl<'a> Members<'a> {
    fn new(input: &'a [u8]) -> Self {
        Self {
            member: Some(GzDecoder::new(input)),
        }
    }
}

impl Read for Members<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while let Some(member) = self.member.as_mut() {
            let n = member.read(buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            // The member has ended: zero bytes of padding may follow, then another member.
            let rest = self.member.take().map(GzDecoder::into_inner).unwrap_or_default();
            if let Some(next) = rest.iter().position(|&b| b != 0) {
                self.member = Some(GzDecoder::new(&rest[next..]));
            }
        }
        Ok(0)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use flate2::{Compression, write::GzEncoder};
    use serde_json::json;

    use super::*;
    use crate::codec::test_vectors::{BOMB_LEN, BOMB_LIMIT, expected, vector};

    #[test]
    fn decodes_numcodecs_vectors() {
        for name in ["level1", "two_members"] {
            assert_eq!(
                Gzip.decode(&vector("gzip", name), 1 << 20).unwrap(),
                expected(),
                "{name}"
            );
        }
    }

    #[test]
    fn zero_padding_after_the_members_is_skipped() {
        let mut padded = vector("gzip", "two_members");
        padded.extend_from_slice(&[0; 13]);
        assert_eq!(Gzip.decode(&padded, 1 << 20).unwrap(), expected());
        // Padding between members, and after the last.
        let one = vector("gzip", "level1");
        let between = [&one[..], &[0; 5], &one, &[0; 3]].concat();
        assert_eq!(
            Gzip.decode(&between, 1 << 20).unwrap(),
            [expected(), expected()].concat()
        );
        // Other bytes after a member are a member, or bad data.
        let mut garbage = vector("gzip", "level1");
        garbage.extend_from_slice(b"\0\0junk");
        assert!(matches!(Gzip.decode(&garbage, 1 << 20), Err(CodecError::Corrupt(_))));
    }

    #[test]
    fn mtime_is_ignored() {
        let mut input = vector("gzip", "level1");
        assert_eq!(&input[4..8], &1_700_000_000u32.to_le_bytes());
        input[4..8].copy_from_slice(&[0xff; 4]);
        assert_eq!(Gzip.decode(&input, 1 << 20).unwrap(), expected());
    }

    #[test]
    fn exact_limit_is_allowed() {
        let n = expected().len();
        assert_eq!(Gzip.decode(&vector("gzip", "level1"), n).unwrap().len(), n);
        assert_eq!(
            Gzip.decode(&vector("gzip", "level1"), n - 1),
            Err(CodecError::TooLarge { limit: n - 1 })
        );
    }

    #[test]
    fn corrupt_and_truncated() {
        let input = vector("gzip", "level1");
        for bad in [
            &input[..input.len() - 3],
            &input[..10],
            &input[..1],
            &b"not gzip at all"[..],
            &[][..],
        ] {
            assert!(
                matches!(Gzip.decode(bad, 1 << 20), Err(CodecError::Corrupt(_))),
                "{bad:?}"
            );
        }
        let mut flipped = input.clone();
        let last = flipped.len() - 5;
        flipped[last] ^= 0xff; // the CRC32 of the trailer
        assert!(matches!(Gzip.decode(&flipped, 1 << 20), Err(CodecError::Corrupt(_))));
    }

    #[test]
    fn bomb_is_too_large() {
        let mut encoder = GzEncoder::new(Vec::new(), Compression::best());
        encoder.write_all(&vec![0u8; BOMB_LEN]).unwrap();
        let bomb = encoder.finish().unwrap();
        assert!(bomb.len() < BOMB_LIMIT / 4);
        assert_eq!(
            Gzip.decode(&bomb, BOMB_LIMIT),
            Err(CodecError::TooLarge { limit: BOMB_LIMIT })
        );
    }

    #[test]
    fn config() {
        assert_eq!(Gzip::from_v2(&json!({ "id": "gzip", "level": 1 })), Ok(Gzip));
        assert_eq!(Gzip::from_v2(&json!({ "id": "gzip" })), Ok(Gzip));
        assert_eq!(Gzip::from_v3(Some(&json!({ "level": 9 }))), Ok(Gzip));
        assert_eq!(Gzip::from_v3(None), Ok(Gzip));
        for bad in [
            json!({ "id": "gzip", "level": 10 }),
            json!({ "id": "gzip", "level": "1" }),
            json!({ "id": "zlib" }),
        ] {
            assert!(matches!(Gzip::from_v2(&bad), Err(CodecError::Config(_))), "{bad}");
        }
        assert!(matches!(
            Gzip::from_v3(Some(&json!({ "level": -1 }))),
            Err(CodecError::Config(_))
        ));
        assert!(matches!(Gzip::from_v3(Some(&json!(5))), Err(CodecError::Config(_))));
    }
}
