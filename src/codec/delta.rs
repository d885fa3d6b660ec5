//! numcodecs `delta` (v2 filter; v3 `numcodecs.delta`): stores differences of consecutive
//! elements, optionally in a narrower `astype`; decoding is a running sum in `dtype`.
//! Spec: <https://numcodecs.readthedocs.io/en/stable/filter/delta.html>

use serde_json::Value;

use super::numeric::{Scalar, count};
use super::{BytesToBytes, CodecError};

/// The delta filter.
#[derive(Debug, Clone)]
pub struct Delta {
    dtype: Scalar,
    astype: Scalar,
}

impl Delta {
    /// From `{"id": "delta", "dtype": "<i4", "astype": "<i2"}` (astype defaults to dtype).
    pub fn from_config(config: &Value) -> Result<Self, CodecError> {
        let dtype = Scalar::parse(config, "dtype")?;
        let astype = match config.get("astype") {
            Some(Value::Null) | None => dtype.clone(),
            Some(_) => Scalar::parse(config, "astype")?,
        };
        Ok(Self { dtype, astype })
    }

    /// The type of the stored elements.
    pub fn encoded(&self) -> &Scalar {
        &self.astype
    }
}

impl BytesToBytes for Delta {
    fn decode(&self, input: &[u8], limit: usize) -> Result<Vec<u8>, CodecError> {
        let n = count(input, &self.astype)?;
        let size = self.dtype.size();
        if n * size > limit {
            return Err(CodecError::TooLarge { limit });
        }
        let mut out = vec![0u8; n * size];
        let mut acc = None;
        for (src, dst) in input.chunks_exact(self.astype.size()).zip(out.chunks_exact_mut(size)) {
            let d = self.astype.read(src);
            let v = match acc {
                None => self.dtype.add(super::numeric::Num::Int(0), d),
                Some(prev) => self.dtype.add(prev, d),
            };
            self.dtype.write(v, dst);
            acc = Some(v);
        }
        Ok(out)
    }

    fn expansion(&self) -> (usize, usize) {
        (self.astype.size().max(1), self.dtype.size().max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn running_sum_in_dtype() {
        let d = Delta::from_config(&json!({"id": "delta", "dtype": "<i8", "astype": "<i2"})).unwrap();
        let enc: Vec<u8> = [10i16, 1, 1, -5].iter().flat_map(|v| v.to_le_bytes()).collect();
        let dec = d.decode(&enc, 1 << 10).unwrap();
        let vals: Vec<i64> = dec
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(vals, [10, 11, 12, 7]);
        assert!(d.decode(&[1, 2, 3], 1 << 10).is_err());
        assert_eq!(d.decode(&enc, 8), Err(CodecError::TooLarge { limit: 8 }));
        assert!(Delta::from_config(&json!({"id": "delta"})).is_err());
    }
}
