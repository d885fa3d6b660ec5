//! numcodecs `fixedscaleoffset`: stores `round((x - offset) * scale)` in `astype`; decodes as
//! `enc / scale + offset`, computed in `astype` when that is a float and in float64 otherwise,
//! then cast to `dtype`, as NumPy computes it.
//! Spec: <https://numcodecs.readthedocs.io/en/stable/filter/fixedscaleoffset.html>

use serde_json::Value;

use super::numeric::{Num, Scalar, count, f16_from_f64};
use super::{BytesToBytes, CodecError};
use crate::dtype::Kind;

/// The fixed scale/offset filter.
#[derive(Debug, Clone)]
pub struct FixedScaleOffset {
    scale: f64,
    offset: f64,
    dtype: Scalar,
    astype: Scalar,
}

impl FixedScaleOffset {
    /// From `{"id": "fixedscaleoffset", "scale": 1000, "offset": 0, "dtype": "<f4", "astype": "<i2"}`.
    pub fn from_config(config: &Value) -> Result<Self, CodecError> {
        let number = |k: &str| {
            config
                .get(k)
                .and_then(Value::as_f64)
                .ok_or_else(|| CodecError::Config(format!("fixedscaleoffset needs a number '{k}'")))
        };
        let scale = number("scale")?;
        if scale == 0.0 {
            return Err(CodecError::Config("fixedscaleoffset scale must not be 0".into()));
        }
        let dtype = Scalar::parse(config, "dtype")?;
        let astype = match config.get("astype") {
            Some(Value::Null) | None => dtype.clone(),
            Some(_) => Scalar::parse(config, "astype")?,
        };
        Ok(Self {
            scale,
            offset: number("offset")?,
            dtype,
            astype,
        })
    }

    /// The type of the stored elements.
    pub fn encoded(&self) -> &Scalar {
        &self.astype
    }
}

impl BytesToBytes for FixedScaleOffset {
    fn decode(&self, input: &[u8], limit: usize) -> Result<Vec<u8>, CodecError> {
        let n = count(input, &self.astype)?;
        if n * self.dtype.size() > limit {
            return Err(CodecError::TooLarge { limit });
        }
        let mut out = vec![0u8; n * self.dtype.size()];
        for (src, dst) in input
            .chunks_exact(self.astype.size())
            .zip(out.chunks_exact_mut(self.dtype.size()))
        {
            let stored = self.astype.read(src).as_f64();
            // NumPy computes `enc / scale + offset` in the stored type when that is a float
            // (the Python numbers scale and offset do not widen it), in float64 otherwise.
            let x = match self.astype.dtype().kind {
                Kind::Float(4) => f64::from(stored as f32 / self.scale as f32 + self.offset as f32),
                Kind::Float(2) => {
                    let half = |x: f64| f16_from_f64(x).to_f64();
                    half(half(stored / half(self.scale)) + half(self.offset))
                }
                _ => stored / self.scale + self.offset,
            };
            self.dtype.write(Num::Float(x), dst);
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

    #[test]
    fn decodes_scaled_integers() {
        let c = FixedScaleOffset::from_config(&json!({"scale": 10, "offset": 1000, "dtype": "<f8", "astype": "|u1"}))
            .unwrap();
        let dec = c.decode(&[0, 5, 255], 1 << 10).unwrap();
        let vals: Vec<f64> = dec
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(vals, [1000.0, 1000.5, 1025.5]);
        assert!(FixedScaleOffset::from_config(&json!({"scale": 0, "offset": 0, "dtype": "<f8"})).is_err());
    }
}
