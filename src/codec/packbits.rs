//! numcodecs `packbits`: booleans packed eight to a byte (most significant bit first) after one
//! byte that counts the padding bits at the end.
//! Spec: <https://numcodecs.readthedocs.io/en/stable/filter/packbits.html>

use super::{BytesToBytes, CodecError};

/// The packbits filter.
#[derive(Debug, Clone, Default)]
pub struct PackBits;

impl BytesToBytes for PackBits {
    fn decode(&self, input: &[u8], limit: usize) -> Result<Vec<u8>, CodecError> {
        let (&padding, packed) = input
            .split_first()
            .ok_or_else(|| CodecError::Corrupt("packbits: empty input".into()))?;
        let bits = packed.len() * 8;
        if padding > 7 || usize::from(padding) > bits {
            return Err(CodecError::Corrupt(format!("packbits: {padding} padding bits")));
        }
        let n = bits - usize::from(padding);
        if n > limit {
            return Err(CodecError::TooLarge { limit });
        }
        Ok((0..n).map(|i| (packed[i / 8] >> (7 - i % 8)) & 1).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpacks_msb_first() {
        assert_eq!(PackBits.decode(&[5, 0b1010_0000], 64).unwrap(), [1, 0, 1]);
        assert_eq!(PackBits.decode(&[0, 0xff], 64).unwrap(), [1; 8]);
        assert!(PackBits.decode(&[], 64).is_err());
        assert!(PackBits.decode(&[9, 0], 64).is_err());
        assert_eq!(PackBits.decode(&[0, 0xff], 4), Err(CodecError::TooLarge { limit: 4 }));
    }
}
