//! Binary outputs: raw C-order little-endian bytes (`bin`, with `X-Zarr-Shape` and
//! `X-Zarr-Dtype` headers) and NumPy `.npy` files (format version 1.0, or 2.0 when the header
//! needs it). Variable-length strings become fixed width (`<U{max}`), variable-length bytes
//! `|S{max}`; arbitrary objects have no binary form.
//! Spec: <https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html>

use serde_json::Value;

use super::{FormatError, Region};
use crate::dtype::elements::Elements;
use crate::dtype::{DType, Kind};

/// The type and bytes of a region in binary form (fixed-size elements are moved, not copied).
pub fn fixed_width(region: Region) -> Result<(DType, Vec<u8>), FormatError> {
    Ok(match region.elements {
        Elements::Fixed(b) => (region.dtype, b),
        Elements::Strings(v) => {
            let width = v
                .iter()
                .map(|s| s.as_ref().map_or(0, |s| s.chars().count()))
                .max()
                .unwrap_or(0)
                .max(1);
            let mut out = Vec::with_capacity(v.len() * width * 4);
            for s in v {
                let start = out.len();
                out.extend(
                    s.as_deref()
                        .unwrap_or("")
                        .chars()
                        .flat_map(|c| (c as u32).to_le_bytes()),
                );
                out.resize(start + width * 4, 0);
            }
            (DType::new(Kind::FixedUnicode(width)), out)
        }
        Elements::Bytes(v) => {
            let width = v
                .iter()
                .map(|b| b.as_ref().map_or(0, Vec::len))
                .max()
                .unwrap_or(0)
                .max(1);
            let mut out = Vec::with_capacity(v.len() * width);
            for b in v {
                let start = out.len();
                out.extend_from_slice(b.as_deref().unwrap_or(&[]));
                out.resize(start + width, 0);
            }
            (DType::new(Kind::FixedBytes(width)), out)
        }
        Elements::Objects(_) => return Err(no_binary_form()),
    })
}

fn no_binary_form() -> FormatError {
    FormatError::Unsupported("object arrays have no binary form; ask for format=json".into())
}

/// Whether bin (and npy) can hold elements of `dtype`: all but objects (JSON-encoded values),
/// refused before anything is read.
pub fn check_bin(dtype: &DType) -> Result<(), FormatError> {
    match dtype.kind {
        Kind::Object => Err(no_binary_form()),
        _ => Ok(()),
    }
}

/// A Python string literal of `s` in ASCII: quotes and backslashes escaped, anything else
/// outside printable ASCII as `\x`, `\u` or `\U` escapes. NumPy reads headers of versions 1
/// and 2 as latin-1 and evaluates the dict as a literal, so every name comes back as written.
fn python_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\'"),
            ' '..='~' => out.push(c),
            c if (c as u32) < 0x100 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push('\'');
    out
}

/// A Python literal of a NumPy descr (type string, or list of field tuples).
fn python_descr(descr: &Value) -> String {
    match descr {
        Value::String(s) => python_str(s),
        Value::Array(fields) => {
            let items: Vec<String> = fields
                .iter()
                .map(|f| {
                    let parts = f.as_array().cloned().unwrap_or_default();
                    let name = parts.first().and_then(Value::as_str).unwrap_or("");
                    let ty = parts.get(1).map(python_descr).unwrap_or_default();
                    match parts.get(2).and_then(Value::as_array) {
                        Some(shape) => {
                            let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
                            format!("({}, {ty}, ({},))", python_str(name), dims.join(", "))
                        }
                        None => format!("({}, {ty})", python_str(name)),
                    }
                })
                .collect();
            format!("[{}]", items.join(", "))
        }
        _ => "'|V0'".into(),
    }
}

/// The longest header dictionary `numpy.load` reads without `max_header_size` (NumPy 1.24+;
/// a safeguard against slow parsing of untrusted files).
const NUMPY_MAX_HEADER: usize = 10_000;

/// Whether a `.npy` of this type and shape is one `numpy.load(path, allow_pickle=False)`
/// reads: structured types of hundreds of fields have a header longer than it takes.
pub fn check_npy(dtype: &DType, shape: &[u64]) -> Result<(), FormatError> {
    check_bin(dtype)?;
    // Magic, version and a 2- or 4-byte length come before the dictionary.
    let header = npy_header(dtype, shape);
    let dict = header
        .len()
        .saturating_sub(if header.get(6) == Some(&1) { 10 } else { 12 });
    if dict > NUMPY_MAX_HEADER {
        return Err(FormatError::Unsupported(format!(
            "the npy header of this type is {dict} bytes, more than the {NUMPY_MAX_HEADER} numpy.load \
             reads without max_header_size; use format=bin (with X-Zarr-Dtype) or json"
        )));
    }
    Ok(())
}

/// The .npy header for `dtype` and `shape` (magic, version, length, padded dict).
pub fn npy_header(dtype: &DType, shape: &[u64]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
    let shape_text = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let dict = format!(
        "{{'descr': {}, 'fortran_order': False, 'shape': {shape_text}, }}",
        python_descr(&dtype.descr())
    );
    // Total header length (magic + version + length field + dict + newline) is a multiple of 64.
    let build = |len_field: usize, version: u8| -> Option<Vec<u8>> {
        let unpadded = 6 + 2 + len_field + dict.len() + 1;
        let padded = unpadded.div_ceil(64) * 64;
        let dict_len = padded - 6 - 2 - len_field;
        let mut out = Vec::with_capacity(padded);
        out.extend_from_slice(b"\x93NUMPY");
        out.extend_from_slice(&[version, 0]);
        if len_field == 2 {
            out.extend_from_slice(&u16::try_from(dict_len).ok()?.to_le_bytes());
        } else {
            out.extend_from_slice(&(dict_len as u32).to_le_bytes());
        }
        out.extend_from_slice(dict.as_bytes());
        out.resize(padded - 1, b' ');
        out.push(b'\n');
        Some(out)
    };
    build(2, 1).or_else(|| build(4, 2)).unwrap_or_default()
}

/// A whole .npy file, with the type it holds.
pub fn encode_npy(region: Region) -> Result<(DType, Vec<u8>), FormatError> {
    let shape = region.shape.clone();
    let (dtype, data) = fixed_width(region)?;
    let mut out = npy_header(&dtype, &shape);
    out.extend_from_slice(&data);
    Ok((dtype, out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// numpy.load refuses headers over 10,000 bytes without max_header_size: a type that needs
    /// one is refused (422) before anything is read, a usual one is not.
    #[test]
    fn npy_headers_numpy_loads() {
        let fields = |n: usize| {
            let list: Vec<Value> = (0..n).map(|i| json!([format!("temperature_{i:03}"), "<f4"])).collect();
            DType::from_v2(&Value::Array(list)).unwrap()
        };
        assert!(check_npy(&fields(10), &[5]).is_ok());
        assert!(check_npy(&DType::new(Kind::Float(8)), &[u64::MAX, u64::MAX]).is_ok());
        let e = check_npy(&fields(400), &[5]).unwrap_err();
        assert!(
            matches!(&e, FormatError::Unsupported(m) if m.contains("format=bin")),
            "{e:?}"
        );
    }

    #[test]
    fn field_names_are_python_literals_in_ascii() {
        assert_eq!(python_str("plain"), "'plain'");
        assert_eq!(python_str("a\\"), r"'a\\'");
        assert_eq!(python_str("q'"), r"'q\''");
        assert_eq!(python_str("b\n"), r"'b\x0a'");
        assert_eq!(python_str("é"), r"'\xe9'");
        assert_eq!(python_str("日"), r"'\u65e5'");
        assert_eq!(python_str("🙂"), r"'\U0001f642'");
    }

    #[test]
    fn npy_headers_are_aligned_and_literal() {
        let h = npy_header(&DType::new(Kind::Float(4)), &[10, 20]);
        assert_eq!(h.len() % 64, 0);
        let text = std::str::from_utf8(&h[10..]).unwrap();
        assert!(
            text.starts_with("{'descr': '<f4', 'fortran_order': False, 'shape': (10, 20), }"),
            "{text}"
        );
        assert!(text.ends_with('\n'));
        let h1 = npy_header(&DType::new(Kind::Int(2)), &[7]);
        assert!(std::str::from_utf8(&h1[10..]).unwrap().contains("'shape': (7,)"));
        let h0 = npy_header(&DType::new(Kind::Bool), &[]);
        let t0 = std::str::from_utf8(&h0[10..]).unwrap();
        assert!(t0.contains("'descr': '|b1'") && t0.contains("'shape': ()"), "{t0}");
        let st = DType::from_v2(&json!([["a", "<i4"], ["b", "<f8", [2]]])).unwrap();
        let hs = npy_header(&st, &[3]);
        assert!(
            std::str::from_utf8(&hs[10..])
                .unwrap()
                .contains("[('a', '<i4'), ('b', '<f8', (2,))]")
        );
    }

    #[test]
    fn strings_become_fixed_width() {
        let r = Region {
            shape: vec![2],
            dtype: DType::new(Kind::String),
            elements: Elements::Strings(vec![Some("ab".into()), None]),
            fill: None,
        };
        let (dt, data) = fixed_width(r.clone()).unwrap();
        assert_eq!(dt.typestr(), "<U2");
        assert_eq!(data, [b'a', 0, 0, 0, b'b', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        let o = Region {
            elements: Elements::Objects(vec![json!(1)]),
            ..r
        };
        assert!(fixed_width(o).is_err());
    }
}
