//! CSV output for 0-, 1- and 2-D regions: one row per line (a 1-D region is one column),
//! values as in JSON except that strings are CSV-quoted, NaN/Infinity unquoted, complex
//! numbers `re+imj` and NaT `NaT`.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;

use super::{FormatError, Region, Text, push_scalar};
use crate::dtype::elements::Elements;
use crate::dtype::{DType, Kind};

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

/// Whether a result of this shape and type has a CSV form.
pub fn check(shape: &[u64], dtype: &DType) -> Result<(), FormatError> {
    if shape.len() > 2 {
        return Err(FormatError::BadRequest(format!(
            "csv holds 0-, 1- or 2-D results; this one is {}-D (select fewer)",
            shape.len()
        )));
    }
    if matches!(dtype.kind, Kind::Structured(_) | Kind::Object) {
        return Err(FormatError::Unsupported(
            "csv cannot hold structured or object elements; use json".into(),
        ));
    }
    Ok(())
}

/// Values per line of a result of this shape: a 1-D result is one column.
pub fn columns(shape: &[u64]) -> u64 {
    match shape {
        [_, cols] => *cols,
        _ => 1,
    }
}

/// What follows the `index`-th value of a result of `cols` values a line: a comma, or at the
/// end of its line a line break.
fn push_separator(out: &mut Vec<u8>, index: u64, cols: u64) {
    out.push(if (index + 1).is_multiple_of(cols.max(1)) {
        b'\n'
    } else {
        b','
    });
}

/// Appends one value (what `write` writes) and its separator. An empty value alone on its line
/// is written `""`: a blank line reads as no row at all (pandas and `numpy.loadtxt` skip it).
fn push_value(out: &mut Vec<u8>, index: u64, cols: u64, write: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    write(out);
    if out.len() == start && cols <= 1 {
        out.extend_from_slice(b"\"\"");
    }
    push_separator(out, index, cols);
}

/// Appends fixed-size elements (C-order little-endian `bytes`), the first of them the
/// `first`-th of the result, each followed by its separator. A result streamed in pieces is
/// the one [`encode`] writes whole.
pub fn push_fixed(out: &mut Vec<u8>, dtype: &DType, bytes: &[u8], first: u64, cols: u64) {
    let item = dtype.item_size().unwrap_or(0).max(1);
    for (k, b) in bytes.chunks_exact(item).enumerate() {
        push_value(out, first + k as u64, cols, |out| push_scalar(out, dtype, b, Text::Csv));
    }
}

/// Encodes a region as CSV.
pub fn encode(region: &Region) -> Result<Vec<u8>, FormatError> {
    check(&region.shape, &region.dtype)?;
    let cols = columns(&region.shape);
    let n = region.shape.iter().product::<u64>() as usize;
    let mut out = Vec::with_capacity(n * 8);
    match &region.elements {
        Elements::Fixed(b) => push_fixed(&mut out, &region.dtype, b, 0, cols),
        Elements::Strings(v) => {
            for (i, s) in v.iter().enumerate().take(n) {
                push_value(&mut out, i as u64, cols, |out| {
                    push_field(out, s.as_deref().unwrap_or(""))
                });
            }
        }
        Elements::Bytes(v) => {
            for (i, b) in v.iter().enumerate().take(n) {
                push_value(&mut out, i as u64, cols, |out| {
                    out.extend_from_slice(BASE64.encode(b.as_deref().unwrap_or(&[])).as_bytes())
                });
            }
        }
        Elements::Objects(_) => {
            return Err(FormatError::Unsupported(
                "csv cannot hold structured or object elements; use json".into(),
            ));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    /// An empty value alone on its line is `""`, not a blank line (which CSV readers skip, and
    /// the rows after it would move up); in a row of several values it stays empty.
    #[test]
    fn empty_values_alone_on_a_line_are_quoted() {
        let strings = |shape: Vec<u64>, v: &[&str]| Region {
            shape,
            dtype: DType::new(Kind::String),
            elements: Elements::Strings(v.iter().map(|s| Some(s.to_string())).collect()),
            fill: None,
        };
        let text = |r: &Region| String::from_utf8(encode(r).unwrap()).unwrap();
        assert_eq!(text(&strings(vec![3], &["a", "", "b"])), "a\n\"\"\nb\n");
        assert_eq!(text(&strings(vec![2, 2], &["a", "", "", ""])), "a,\n,\n");
        let fixed = Region {
            shape: vec![2],
            dtype: DType::new(Kind::FixedBytes(2)),
            elements: Elements::Fixed(b"ab\0\0".to_vec()),
            fill: None,
        };
        let lines: Vec<String> = text(&fixed).lines().map(str::to_owned).collect();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert_eq!(lines[1], "\"\"");
    }

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

    /// Complex numbers as NumPy and Python's `complex()` read them: the imaginary part's own
    /// sign, `-0.0` included (`1.0+-0.0j` is not a number to them).
    #[test]
    fn complex_signs() {
        let r = Region {
            shape: vec![3],
            dtype: DType::new(Kind::Complex(16)),
            elements: Elements::Fixed(
                [(1.0f64, -0.0f64), (1.0, 0.0), (-2.5, -3.0)]
                    .iter()
                    .flat_map(|(re, im)| re.to_le_bytes().into_iter().chain(im.to_le_bytes()))
                    .collect(),
            ),
            fill: None,
        };
        assert_eq!(
            String::from_utf8(encode(&r).unwrap()).unwrap(),
            "1.0-0.0j\n1.0+0.0j\n-2.5-3.0j\n"
        );
    }
}
