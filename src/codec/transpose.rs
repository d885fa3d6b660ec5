//! v3 `transpose` (and v2 `order: "F"`, which is the reversed permutation): the stored array is
//! the chunk with its axes permuted, encoded axis i being decoded axis `order[i]`.
//! Spec: <https://zarr-specs.readthedocs.io/en/latest/v3/codecs/transpose/index.html>

use serde_json::Value;

use super::CodecError;
use crate::dtype::elements::Elements;

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
    let targets = Targets {
        shape: encoded_shape.iter().map(|&n| n as usize).collect(),
        strides: order.iter().map(|&p| dec_strides[p]).collect(),
        idx: vec![0; ndim],
        offset: 0,
        left: n as usize,
    };
    fn scatter<T: Clone>(src: Vec<T>, targets: Targets, fill: T) -> Vec<T> {
        let mut out = vec![fill; src.len()];
        for (v, t) in src.into_iter().zip(targets) {
            out[t] = v;
        }
        out
    }
    Ok(match encoded {
        Elements::Fixed(bytes) => {
            let mut out = vec![0u8; bytes.len()];
            match item {
                1 => permute::<1>(&bytes, &mut out, targets),
                2 => permute::<2>(&bytes, &mut out, targets),
                4 => permute::<4>(&bytes, &mut out, targets),
                8 => permute::<8>(&bytes, &mut out, targets),
                16 => permute::<16>(&bytes, &mut out, targets),
                _ => {
                    for (i, t) in targets.enumerate() {
                        out[t * item..(t + 1) * item].copy_from_slice(&bytes[i * item..(i + 1) * item]);
                    }
                }
            }
            Elements::Fixed(out)
        }
        Elements::Strings(v) => Elements::Strings(scatter(v, targets, None)),
        Elements::Bytes(v) => Elements::Bytes(scatter(v, targets, None)),
        Elements::Objects(v) => Elements::Objects(scatter(v, targets, Value::Null)),
    })
}

/// Elements of `N` bytes of `src`, in encoded order, to where `targets` puts them in `out`.
fn permute<const N: usize>(src: &[u8], out: &mut [u8], targets: Targets) {
    for (element, t) in src.chunks_exact(N).zip(targets) {
        out[t * N..t * N + N].copy_from_slice(element);
    }
}

/// The decoded position of each element, in encoded order: an odometer over the encoded axes,
/// worked out as it goes (a table of positions took 8 bytes per element, eight times a chunk
/// of bytes).
struct Targets {
    shape: Vec<usize>,
    /// Per encoded axis, the decoded stride.
    strides: Vec<usize>,
    idx: Vec<usize>,
    offset: usize,
    left: usize,
}

impl Iterator for Targets {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let here = self.offset;
        for d in (0..self.shape.len()).rev() {
            self.idx[d] += 1;
            self.offset += self.strides[d];
            if self.idx[d] < self.shape[d] {
                break;
            }
            self.offset -= self.strides[d] * self.idx[d];
            self.idx[d] = 0;
        }
        Some(here)
    }
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

    /// Every element size, and variable-length elements, land where the permutation says.
    #[test]
    fn every_element_size_lands_in_place() {
        let shape = [3u64, 5];
        let order = [1usize, 0];
        let enc_shape = encoded_shape(&shape, &order);
        for item in [1usize, 2, 3, 4, 8, 16] {
            // Encoded (F order): element (i, j) at j * 3 + i, holding bytes of 10 i + j.
            let mut enc = vec![0u8; 15 * item];
            for i in 0..3 {
                for j in 0..5 {
                    enc[(j * 3 + i) * item..][..item].fill((10 * i + j) as u8);
                }
            }
            let Elements::Fixed(dec) = decode(Elements::Fixed(enc), &enc_shape, &order, item).unwrap() else {
                unreachable!()
            };
            let want: Vec<u8> = (0..3u8)
                .flat_map(|i| (0..5u8).flat_map(move |j| std::iter::repeat_n(10 * i + j, item)))
                .collect();
            assert_eq!(dec, want, "{item}-byte elements");
        }
        let enc: Vec<Option<String>> = (0..15).map(|k| Some(format!("{}{}", k % 3, k / 3))).collect();
        let Elements::Strings(dec) = decode(Elements::Strings(enc), &enc_shape, &order, 0).unwrap() else {
            unreachable!()
        };
        let want: Vec<Option<String>> = (0..3)
            .flat_map(|i| (0..5).map(move |j| Some(format!("{i}{j}"))))
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
