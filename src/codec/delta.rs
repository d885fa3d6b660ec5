//! numcodecs `delta` (v2 filter; v3 `numcodecs.delta`): stores differences of consecutive
//! elements, optionally in a narrower `astype`; decoding is a running sum, cast to `dtype`.
//! Spec: <https://numcodecs.readthedocs.io/en/stable/filter/delta.html>

use serde_json::Value;

use super::numeric::{Num, Scalar, count};
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
        // numcodecs decodes with `numpy.cumsum(enc, out=dec)`: the running sum is kept in the
        // type both promote to, and each element is cast to `dtype` as it is written (a sum of
        // int64 steps into float32 is not rounded to float32 along the way).
        let sum = self.astype.promoted(&self.dtype);
        // The sum starts from the additive identity: for floats that is -0.0, which keeps the
        // sign of a first element of -0.0 (0.0 + -0.0 is 0.0).
        let mut acc = if sum.is_float() { Num::Float(-0.0) } else { Num::Int(0) };
        for (src, dst) in input.chunks_exact(self.astype.size()).zip(out.chunks_exact_mut(size)) {
            acc = sum.add(acc, self.astype.read(src));
            self.dtype.write(acc, dst);
        }
        Ok(out)
    }

    fn expansion(&self, _shape: &[u64]) -> (usize, usize) {
        (self.astype.size().max(1), self.dtype.size().max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The sum of float64 steps into float32 is kept in float64: NumPy gives [1e8, 1e8, 1].
    #[test]
    fn running_sum_in_the_promoted_type() {
        let d = Delta::from_config(&json!({"id": "delta", "dtype": "<f4", "astype": "<f8"})).unwrap();
        let enc: Vec<u8> = [1e8f64, 1.0, -1e8].iter().flat_map(|v| v.to_le_bytes()).collect();
        let dec = d.decode(&enc, 1 << 10).unwrap();
        let got: Vec<f32> = dec
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(got, [1e8, 1e8, 1.0]);
    }

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

    /// numcodecs decodes with NumPy's cumsum, whose first element is the first stored one:
    /// a chunk that starts with -0.0 keeps its sign, in float32 and float64.
    #[test]
    fn a_leading_negative_zero_keeps_its_sign() {
        let d = Delta::from_config(&json!({"id": "delta", "dtype": "<f8"})).unwrap();
        let enc: Vec<u8> = [-0.0f64, 1.0, -1.0, -0.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let dec: Vec<f64> = d
            .decode(&enc, 1 << 10)
            .unwrap()
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(
            dec.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            [-0.0f64, 1.0, 0.0, 0.0].map(f64::to_bits)
        );
        let d = Delta::from_config(&json!({"id": "delta", "dtype": "<f4"})).unwrap();
        let dec = d.decode(&(-0.0f32).to_le_bytes(), 1 << 10).unwrap();
        assert_eq!(dec, (-0.0f32).to_le_bytes());
    }
}
