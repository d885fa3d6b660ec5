//! CSV output for 0-, 1- and 2-D regions: one row per line (a 1-D region is one column),
//! values as in JSON except that strings are CSV-quoted, NaN/Infinity unquoted, complex
//! numbers `re+imj` and NaT `NaT`.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;

use super::{FormatError, Region, Text, push_scalar};
use crate::zarr::dtype::Kind;
use crate::zarr::elements::Elements;

/// Appends one CSV field, quoted when it holds a separator, quote or line break.
pub(crate) fn push_field(out: &mut Vec<u8>, s: &str) {
    if s.contains([',', '"', '\n', '\r']) {
        out.push(b'"');
        out.extend_from_slice(s.replace('"', "\"\"").as_bytes());
        out.push(b'"');
    } else {
        out.extend_from_slice(s.as_bytes());
    }
}

/// Encodes a region as CSV.
pub fn encode(region: &Region) -> Result<Vec<u8>, FormatError> {
    if region.shape.len() > 2 {
        return Err(FormatError::BadRequest(format!(
            "csv holds 0-, 1- or 2-D results; this one has {} dimensions (select fewer)",
            region.shape.len()
        )));
    }
    if matches!(region.dtype.kind, Kind::Structured(_)) || matches!(region.elements, Elements::Objects(_)) {
        return Err(FormatError::Unsupported(
            "csv cannot hold structured or object elements; use json".into(),
        ));
    }
    let cols = match region.shape.len() {
        2 => region.shape[1] as usize,
        _ => 1,
    };
    let n = region.shape.iter().product::<u64>() as usize;
    let item = region.dtype.item_size().unwrap_or(0);
    let mut out = Vec::with_capacity(n * 8);
    for i in 0..n {
        match &region.elements {
            Elements::Fixed(b) => push_scalar(&mut out, &region.dtype, &b[i * item..(i + 1) * item], Text::Csv),
            Elements::Strings(v) => push_field(&mut out, v[i].as_deref().unwrap_or("")),
            Elements::Bytes(v) => out.extend_from_slice(BASE64.encode(v[i].as_deref().unwrap_or(&[])).as_bytes()),
            Elements::Objects(_) => {}
        }
        out.push(if (i + 1) % cols == 0 { b'\n' } else { b',' });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zarr::dtype::DType;

    #[test]
    fn rows_and_quoting() {
        let r = Region {
            shape: vec![2, 2],
            dtype: DType::new(Kind::Float(8)),
            elements: Elements::Fixed(
                [1.0f64, f64::NAN, -2.5, 1e300]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
            ),
            fill: None,
        };
        assert_eq!(String::from_utf8(encode(&r).unwrap()).unwrap(), "1.0,NaN\n-2.5,1e300\n");
        let s = Region {
            shape: vec![2],
            dtype: DType::new(Kind::String),
            elements: Elements::Strings(vec![Some("a,b".into()), Some("q\"".into())]),
            fill: None,
        };
        assert_eq!(String::from_utf8(encode(&s).unwrap()).unwrap(), "\"a,b\"\n\"q\"\"\"\n");
        let three = Region {
            shape: vec![1, 1, 1],
            ..r.clone()
        };
        assert!(matches!(encode(&three), Err(FormatError::BadRequest(_))));
        let scalar = Region {
            shape: vec![],
            elements: Elements::Fixed(7.0f64.to_le_bytes().to_vec()),
            ..r
        };
        assert_eq!(String::from_utf8(encode(&scalar).unwrap()).unwrap(), "7.0\n");
    }
}
