//! numcodecs `astype` and `quantize`: both store elements in another type (`astype` as
//! `encode_dtype`; `quantize` after rounding to `digits`) and decode by casting back.
//! Specs: <https://numcodecs.readthedocs.io/en/stable/filter/astype.html>,
//! <https://numcodecs.readthedocs.io/en/stable/filter/quantize.html>

use serde_json::Value;

use super::numeric::Scalar;
use super::{BytesToBytes, CodecError};

/// A decode-side cast from the stored type to the array type.
#[derive(Debug, Clone)]
pub struct AsType {
    decoded: Scalar,
    encoded: Scalar,
}

impl AsType {
    /// From `{"id": "astype", "encode_dtype": "|i1", "decode_dtype": "<i4"}`.
    pub fn from_astype(config: &Value) -> Result<Self, CodecError> {
        Ok(Self {
            decoded: Scalar::parse(config, "decode_dtype")?,
            encoded: Scalar::parse(config, "encode_dtype")?,
        })
    }

    /// From `{"id": "quantize", "digits": 2, "dtype": "<f4", "astype": "<f4"}`.
    pub fn from_quantize(config: &Value) -> Result<Self, CodecError> {
        let decoded = Scalar::parse(config, "dtype")?;
        let encoded = match config.get("astype") {
            Some(Value::Null) | None => decoded.clone(),
            Some(_) => Scalar::parse(config, "astype")?,
        };
        Ok(Self { decoded, encoded })
    }

    /// The type of the stored elements.
    pub fn encoded(&self) -> &Scalar {
        &self.encoded
    }
}

impl BytesToBytes for AsType {
    fn decode(&self, input: &[u8], limit: usize) -> Result<Vec<u8>, CodecError> {
        self.decoded.convert_from(&self.encoded, input, limit)
    }

    fn expansion(&self, _shape: &[u64]) -> (usize, usize) {
        (self.encoded.size().max(1), self.decoded.size().max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn casts_back() {
        let c = AsType::from_astype(&json!({"encode_dtype": "|i1", "decode_dtype": "<i4"})).unwrap();
        let dec = c.decode(&[0xff, 3], 64).unwrap();
        assert_eq!(dec, [(-1i32).to_le_bytes(), 3i32.to_le_bytes()].concat());
        let q = AsType::from_quantize(&json!({"digits": 2, "dtype": "<f8", "astype": "<f4"})).unwrap();
        let dec = q.decode(&1.25f32.to_le_bytes(), 64).unwrap();
        assert_eq!(dec, 1.25f64.to_le_bytes());
        assert!(AsType::from_astype(&json!({"encode_dtype": "|i1"})).is_err());
    }
}
