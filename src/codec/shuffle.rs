//! `shuffle`: numcodecs' byte [`shuffle`](https://numcodecs.readthedocs.io/en/stable/filter/shuffle.html)
//! filter.
//!
//! Encoding groups bytes by their position within an `elementsize`-byte element: all first
//! bytes, then all second bytes, and so on (byte `b` of element `i` goes to `b * n + i` for `n`
//! whole elements). Decoding puts them back. numcodecs refuses buffers that are not whole
//! elements (recent versions) or leaves the tail unshuffled (its kernel); this keeps trailing
//! bytes where they are, as blosc's shuffle does. An `elementsize` of 0 or 1 is a copy.

use serde_json::Value;

use super::{BytesToBytes, CodecError, numcodecs_object, optional_int};

/// numcodecs' default element size.
const DEFAULT_ELEMENTSIZE: usize = 4;

/// The byte unshuffle for one element size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shuffle {
    /// Bytes per element.
    pub elementsize: usize,
}

impl Shuffle {
    /// From a numcodecs dict: `{"id": "shuffle", "elementsize": 4}`; `elementsize` is optional
    /// (default 4), a non-negative integer.
    pub fn from_v2(config: &Value) -> Result<Self, CodecError> {
        let options = numcodecs_object("shuffle", config)?;
        let elementsize = match optional_int("shuffle", options, "elementsize", 0..=i64::from(u32::MAX))? {
            None => DEFAULT_ELEMENTSIZE,
            Some(n) => usize::try_from(n).map_err(|_| CodecError::Config(format!("shuffle: elementsize {n}")))?,
        };
        Ok(Self { elementsize })
    }
}

impl BytesToBytes for Shuffle {
    fn decode(&self, input: &[u8], limit: usize) -> Result<Vec<u8>, CodecError> {
        if input.len() > limit {
            return Err(CodecError::TooLarge { limit });
        }
        let size = self.elementsize;
        if size <= 1 {
            return Ok(input.to_vec());
        }
        let count = input.len() / size;
        let whole = count * size;
        let mut out = vec![0u8; input.len()];
        for (b, lane) in input[..whole].chunks_exact(count.max(1)).enumerate().take(size) {
            for (element, &byte) in out.chunks_exact_mut(size).zip(lane) {
                element[b] = byte;
            }
        }
        out[whole..].copy_from_slice(&input[whole..]);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::codec::test_vectors::{expected, vector};

    #[test]
    fn decodes_numcodecs_vectors() {
        for (size, name) in [(4, "elementsize4"), (8, "elementsize8")] {
            let input = vector("shuffle", name);
            assert_ne!(input, expected());
            assert_eq!(
                Shuffle { elementsize: size }.decode(&input, 1 << 20).unwrap(),
                expected(),
                "{name}"
            );
        }
    }

    #[test]
    fn small_cases() {
        let two = Shuffle { elementsize: 2 };
        assert_eq!(two.decode(&[1, 3, 5, 2, 4, 6], 6).unwrap(), [1, 2, 3, 4, 5, 6]);
        // numcodecs' kernel shuffles 10 bytes with elementsize 4 as [0 4 1 5 2 6 3 7] + tail.
        let four = Shuffle { elementsize: 4 };
        assert_eq!(
            four.decode(&[0, 4, 1, 5, 2, 6, 3, 7, 8, 9], 10).unwrap(),
            [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
        );
        // Fewer bytes than one element: all tail.
        assert_eq!(four.decode(&[9, 8, 7], 10).unwrap(), [9, 8, 7]);
        assert_eq!(four.decode(&[], 0).unwrap(), Vec::<u8>::new());
        for size in [0, 1] {
            assert_eq!(Shuffle { elementsize: size }.decode(&[3, 2, 1], 3).unwrap(), [3, 2, 1]);
        }
        assert_eq!(four.decode(&[0; 8], 7), Err(CodecError::TooLarge { limit: 7 }));
    }

    #[test]
    fn config() {
        assert_eq!(
            Shuffle::from_v2(&json!({ "id": "shuffle", "elementsize": 8 })),
            Ok(Shuffle { elementsize: 8 })
        );
        assert_eq!(
            Shuffle::from_v2(&json!({ "id": "shuffle" })),
            Ok(Shuffle { elementsize: 4 })
        );
        for bad in [
            json!({ "id": "shuffle", "elementsize": -1 }),
            json!({ "id": "shuffle", "elementsize": "4" }),
        ] {
            assert!(matches!(Shuffle::from_v2(&bad), Err(CodecError::Config(_))), "{bad}");
        }
    }
}
