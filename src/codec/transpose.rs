//! v3 `transpose` (and v2 `order: "F"`, which is the reversed permutation): the stored array is
//! the chunk with its axes permuted, encoded axis i being decoded axis `order[i]`.
//! Spec: <https://zarr-specs.readthedocs.io/en/latest/v3/codecs/transpose/index.html>

use serde_json::Value;

use super::CodecError;
use crate::zarr::elements::Elements;

/// Parses `configuration.order` for an array of `ndim` dimensions: a permutation of
/// `0..ndim` (the legacy strings "C" and "F" are accepted too).
pub fn parse_order(config: Option<&Value>, ndim: usize) -> Result<Vec<usize>, CodecError> {
    let order = config
        .and_then(|c| c.get("order"))
        .ok_or_else(|| CodecError::Config("transpose needs configuration.order".into()))?;
    let perm: Vec<usize> = match order {
        Value::String(s) if s == "C" => (0..ndim).collect(),
        Value::String(s) if s == "F" => (0..ndim).rev().collect(),
        Value::Array(items) => items
            .iter()
            .map(|v| v.as_u64().map(|v| v as usize))
            .collect::<Option<_>>()
            .ok_or_else(|| CodecError::Config("transpose order must be integers".into()))?,
        _ => return Err(CodecError::Config("transpose order must be a list".into())),
    };
    let mut seen = vec![false; ndim];
    if perm.len() != ndim || perm.iter().any(|&p| p >= ndim || std::mem::replace(&mut seen[p], true)) {
        return Err(CodecError::Config(format!(
            "{perm:?} is not a permutation of {ndim} axes"
        )));
    }
    Ok(perm)
}

/// The shape of the encoded (permuted) array.
pub fn encoded_shape(shape: &[u64], order: &[usize]) -> Vec<u64> {
    order.iter().map(|&i| shape[i]).collect()
}

/// Undoes the permutation: `encoded` has shape `encoded_shape`; the result is in decoded order.
pub fn decode(encoded: Elements, encoded_shape: &[u64], order: &[usize], item: usize) -> Result<Elements, CodecError> {
    let ndim = order.len();
    if order.iter().enumerate().all(|(i, &p)| i == p) {
        return Ok(encoded);
    }
    let mut decoded_shape = vec![0u64; ndim];
    for (i, &p) in order.iter().enumerate() {
        decoded_shape[p] = encoded_shape[i];
    }
    let n: u64 = encoded_shape.iter().product();
    if encoded.count(item) as u64 != n {
        return Err(CodecError::Corrupt(
            "transpose: element count does not match the shape".into(),
        ));
    }
    // Strides of the decoded array, seen from the encoded axes.
    let mut dec_strides = vec![1usize; ndim];
    for d in (0..ndim.saturating_sub(1)).rev() {
        dec_strides[d] = dec_strides[d + 1] * decoded_shape[d + 1] as usize;
    }
    let enc_axis_stride: Vec<usize> = order.iter().map(|&p| dec_strides[p]).collect();
    let mut target = Vec::with_capacity(n as usize);
    let mut idx = vec![0u64; ndim];
    let mut offset = 0usize;
    for _ in 0..n {
        target.push(offset);
        for d in (0..ndim).rev() {
            idx[d] += 1;
            offset += enc_axis_stride[d];
            if idx[d] < encoded_shape[d] {
                break;
            }
            offset -= enc_axis_stride[d] * idx[d] as usize;
            idx[d] = 0;
        }
    }
    fn scatter<T: Clone>(src: Vec<T>, target: &[usize], fill: T) -> Vec<T> {
        let mut out = vec![fill; src.len()];
        for (v, &t) in src.into_iter().zip(target) {
            out[t] = v;
        }
        out
    }
    Ok(match encoded {
        Elements::Fixed(bytes) => {
            let mut out = vec![0u8; bytes.len()];
            for (i, &t) in target.iter().enumerate() {
                out[t * item..(t + 1) * item].copy_from_slice(&bytes[i * item..(i + 1) * item]);
            }
            Elements::Fixed(out)
        }
        Elements::Strings(v) => Elements::Strings(scatter(v, &target, None)),
        Elements::Bytes(v) => Elements::Bytes(scatter(v, &target, None)),
        Elements::Objects(v) => Elements::Objects(scatter(v, &target, Value::Null)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn undoes_a_3d_permutation() {
        // Decoded array a[i][j][k] = 100i + 10j + k, shape (2, 3, 4); order [2, 0, 1].
        let shape = [2u64, 3, 4];
        let order = [2usize, 0, 1];
        let enc_shape = encoded_shape(&shape, &order);
        assert_eq!(enc_shape, [4, 2, 3]);
        let mut enc = Vec::new();
        for k in 0..4u8 {
            for i in 0..2u8 {
                for j in 0..3u8 {
                    enc.push(100 * i + 10 * j + k);
                }
            }
        }
        let Elements::Fixed(dec) = decode(Elements::Fixed(enc), &enc_shape, &order, 1).unwrap() else {
            unreachable!()
        };
        let want: Vec<u8> = (0..2u8)
            .flat_map(|i| (0..3u8).flat_map(move |j| (0..4u8).map(move |k| 100 * i + 10 * j + k)))
            .collect();
        assert_eq!(dec, want);
    }

    #[test]
    fn orders_parse() {
        assert_eq!(parse_order(Some(&json!({"order": [1, 0]})), 2).unwrap(), [1, 0]);
        assert_eq!(parse_order(Some(&json!({"order": "F"})), 3).unwrap(), [2, 1, 0]);
        assert!(parse_order(Some(&json!({"order": [0, 0]})), 2).is_err());
        assert!(parse_order(Some(&json!({"order": [0, 2]})), 2).is_err());
        assert!(parse_order(None, 2).is_err());
    }
}
