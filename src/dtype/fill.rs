//! Fill values: what a missing chunk (or an empty inner chunk of a shard) reads as.
//!
//! v2 encodes them per the v2 spec (NaN/Infinity as strings, base64 for `|S` and structured
//! types, `[re, im]` for complex, `null` allowed); v3 per the v3 core spec and its data type
//! extensions (hex bit patterns for floats too). Fixed-size fills become one little-endian
//! element, ready to be repeated into a chunk buffer.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::Value;

use super::MetaError;
use super::{DType, Kind};

/// A parsed fill value.
#[derive(Debug, Clone, PartialEq)]
pub enum FillValue {
    /// One element of a fixed-size type, little-endian.
    Fixed(Vec<u8>),
    /// For variable-length strings. A null fill reads as "", as zarr-python 3 reads it.
    String(String),
    /// For variable-length bytes. A null fill reads as empty bytes, as zarr-python 3 reads it.
    Bytes(Vec<u8>),
    /// For object arrays: any JSON value.
    Object(Value),
}

fn invalid(value: &Value, dtype: &DType) -> MetaError {
    MetaError::Invalid(format!("fill_value {value} does not fit data type {}", dtype.typestr()))
}

fn parse_float(value: &Value) -> Option<f64> {
    match value {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => match s.as_str() {
            "NaN" => Some(f64::NAN),
            "Infinity" => Some(f64::INFINITY),
            "-Infinity" => Some(f64::NEG_INFINITY),
            // Any other text Python's `float()` reads ("1.5", "inf", "nan", "1e3"), as
            // zarr-python 3 reads it (`check_json_floatish_str`).
            text => python_number(text)?.parse().ok(),
        },
        _ => None,
    }
}

/// `text` as Python's `int()` and `float()` read numbers: surrounding whitespace dropped, and
/// underscores between digits ("1_000"); `None` for an underscore elsewhere.
fn python_number(text: &str) -> Option<std::borrow::Cow<'_, str>> {
    let text = text.trim();
    if !text.contains('_') {
        return Some(text.into());
    }
    let bytes = text.as_bytes();
    let between_digits =
        |i: usize| i > 0 && bytes[i - 1].is_ascii_digit() && bytes.get(i + 1).is_some_and(u8::is_ascii_digit);
    (0..bytes.len())
        .filter(|&i| bytes[i] == b'_')
        .all(between_digits)
        .then(|| text.replace('_', "").into())
}

/// A float fill of `size` bytes; v3 also allows the bit pattern as a hex string. A pattern of
/// another width than `size` (4, 8 or 16 digits: a float16, 32 or 64) is that float's value,
/// converted, as zarr-python reads it.
fn float_bytes(value: &Value, size: usize) -> Option<Vec<u8>> {
    let x = match value.as_str().and_then(|s| s.strip_prefix("0x")) {
        Some(hex) => {
            let bits = u64::from_str_radix(hex, 16).ok()?;
            if hex.len() == 2 * size {
                return Some(bits.to_le_bytes()[..size].to_vec());
            }
            match hex.len() {
                4 => half::f16::from_bits(bits as u16).to_f64(),
                8 => f64::from(f32::from_bits(bits as u32)),
                16 => f64::from_bits(bits),
                _ => return None,
            }
        }
        None => parse_float(value)?,
    };
    Some(match size {
        2 => super::f16_from_f64(x).to_le_bytes().to_vec(),
        4 => (x as f32).to_le_bytes().to_vec(),
        8 => x.to_le_bytes().to_vec(),
        _ => return None,
    })
}

/// An integer fill: a JSON integer, a float with no fraction, or (`text`) a string Python's
/// `int()` reads ("42"), as zarr-python 3 reads them (`check_json_intish_str`).
fn int_bytes(value: &Value, size: usize, signed: bool, text: bool) -> Option<Vec<u8>> {
    let wide: i128 = match value {
        Value::String(s) if text => python_number(s)?.parse().ok()?,
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => i as i128,
            (None, Some(u), _) => u as i128,
            (None, None, Some(f)) if f.fract() == 0.0 => f as i128,
            _ => return None,
        },
        Value::Bool(b) => *b as i128,
        _ => return None,
    };
    let bits = 8 * size as u32;
    let (lo, hi) = if signed {
        (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
    } else {
        (0, (1i128 << bits) - 1)
    };
    if wide < lo || wide > hi {
        return None;
    }
    Some(wide.to_le_bytes()[..size].to_vec())
}

/// A JSON number as Python's `str()` writes it (`0`, `0.0`, `1e-05`, `1e+16`), which is what
/// NumPy puts in a string element cast from it.
fn python_text(value: &Value) -> String {
    let Value::Number(n) = value else {
        return String::new();
    };
    if n.is_i64() || n.is_u64() {
        return n.to_string();
    }
    let f = n.as_f64().unwrap_or_default();
    let magnitude = f.abs();
    if magnitude != 0.0 && !(1e-4..1e16).contains(&magnitude) {
        // Python: the shortest digits, an exponent of at least two digits with its sign.
        let text = format!("{f:e}");
        let (mantissa, exponent) = text.split_once('e').unwrap_or((&text, "0"));
        let (sign, digits) = exponent.strip_prefix('-').map_or(("+", exponent), |d| ("-", d));
        return format!("{mantissa}e{sign}{digits:0>2}");
    }
    let text = f.to_string();
    if text.contains('.') { text } else { format!("{text}.0") }
}

/// The fill of a v2 `|S` or `<U` array stored as a number, as text that zarr-python 3 takes
/// and that zarr-python 2 reads as the same value it reads the number as: base64 of the bytes
/// for `|S` (`0` -> `"MA=="`, b"0"), the string for `<U` (`"0"`). `None` for any other array.
/// zarr 3 refuses the number, and with it a whole consolidated group that names the array.
pub fn v2_numeric_string_fill(dtype: &Value, fill: &Value) -> Option<Value> {
    if !fill.is_number() {
        return None;
    }
    match DType::from_v2(dtype).ok()?.kind {
        Kind::FixedBytes(n) => {
            let mut text = python_text(fill).into_bytes();
            text.truncate(n);
            Some(Value::String(BASE64.encode(text)))
        }
        Kind::FixedUnicode(n) => Some(Value::String(python_text(fill).chars().take(n).collect())),
        _ => None,
    }
}

fn base64_or_bytes(value: &Value) -> Option<Vec<u8>> {
    match value {
        Value::String(s) => BASE64.decode(s).ok(),
        Value::Array(items) => items
            .iter()
            .map(|v| v.as_u64().and_then(|b| u8::try_from(b).ok()))
            .collect(),
        _ => None,
    }
}

impl FillValue {
    /// Parses a stored fill value for `dtype` (the stored type, with its byte order).
    /// `zarr_format` selects the encoding rules of that spec version.
    pub fn parse(value: &Value, dtype: &DType, zarr_format: u8) -> Result<FillValue, MetaError> {
        let bad = || invalid(value, dtype);
        if zarr_format == 3 && value.is_null() {
            // v2 lets a fill be null (no fill); v3 requires one, as zarr-python checks.
            return Err(MetaError::Invalid(
                "fill_value is null; Zarr v3 requires a fill value".into(),
            ));
        }
        match &dtype.kind {
            Kind::String => {
                return match value {
                    Value::Null => Ok(FillValue::String(String::new())),
                    Value::String(s) => Ok(FillValue::String(s.clone())),
                    _ => Err(bad()),
                };
            }
            Kind::Bytes => {
                return match value {
                    Value::Null => Ok(FillValue::Bytes(Vec::new())),
                    // v3 writers use "" (or base64) for bytes; an array of byte values is also allowed.
                    v => base64_or_bytes(v).map(FillValue::Bytes).ok_or_else(bad),
                };
            }
            Kind::Object => return Ok(FillValue::Object(value.clone())),
            _ => {}
        }
        let size = dtype.item_size().ok_or_else(bad)?;
        if value.is_null() {
            // Null on a fixed-size type reads as zarr-python 3 reads it: NaT for datetimes and
            // timedeltas, zeros otherwise.
            return Ok(FillValue::Fixed(match dtype.kind {
                Kind::DateTime(_) | Kind::TimeDelta(_) => i64::MIN.to_le_bytes().to_vec(),
                _ => vec![0; size],
            }));
        }
        let bytes = match &dtype.kind {
            Kind::Bool => match value {
                Value::Bool(b) => vec![*b as u8],
                Value::Number(n) => vec![(n.as_f64().ok_or_else(bad)? != 0.0) as u8],
                _ => return Err(bad()),
            },
            Kind::Int(n) => int_bytes(value, *n, true, true).ok_or_else(bad)?,
            Kind::UInt(n) => int_bytes(value, *n, false, true).ok_or_else(bad)?,
            Kind::Float(n) => float_bytes(value, *n).ok_or_else(bad)?,
            Kind::Complex(n) => {
                let half = n / 2;
                let parts = match value {
                    Value::Array(p) if p.len() == 2 => p,
                    // Some v2 writers store complex fills as base64 of the raw element.
                    Value::String(_) if zarr_format == 2 => {
                        let raw = base64_or_bytes(value).filter(|b| b.len() == *n).ok_or_else(bad)?;
                        return Ok(FillValue::Fixed(swapped(dtype, raw)));
                    }
                    _ => return Err(bad()),
                };
                let mut out = float_bytes(&parts[0], half).ok_or_else(bad)?;
                out.extend(float_bytes(&parts[1], half).ok_or_else(bad)?);
                out
            }
            Kind::DateTime(_) | Kind::TimeDelta(_) => match value {
                Value::String(s) if s == "NaT" => i64::MIN.to_le_bytes().to_vec(),
                v => int_bytes(v, 8, true, false).ok_or_else(bad)?,
            },
            // zarr-python 2 wrote 0 as the fill of `|S` and `<U` arrays by default, and reads a
            // number as NumPy casts it to the type: its text ("0"), cut to the width.
            Kind::FixedBytes(n) if zarr_format == 2 && value.is_number() => {
                let mut raw = python_text(value).into_bytes();
                raw.resize(*n, 0);
                raw
            }
            Kind::FixedUnicode(n) if zarr_format == 2 && value.is_number() => {
                let mut raw: Vec<u8> = python_text(value)
                    .chars()
                    .take(*n)
                    .flat_map(|c| (c as u32).to_le_bytes())
                    .collect();
                raw.resize(4 * n, 0);
                raw
            }
            Kind::FixedBytes(n) | Kind::Raw(n) => {
                let mut raw = base64_or_bytes(value).ok_or_else(bad)?;
                raw.resize(*n, 0);
                raw
            }
            Kind::FixedUnicode(n) => {
                let s = value.as_str().ok_or_else(bad)?;
                let mut raw: Vec<u8> = s.chars().take(*n).flat_map(|c| (c as u32).to_le_bytes()).collect();
                raw.resize(4 * n, 0);
                raw
            }
            Kind::Structured(_) => {
                let raw = base64_or_bytes(value).filter(|b| b.len() == size).ok_or_else(bad)?;
                return Ok(FillValue::Fixed(swapped(dtype, raw)));
            }
            Kind::String | Kind::Bytes | Kind::Object => unreachable!("handled above"),
        };
        Ok(FillValue::Fixed(bytes))
    }
}

impl FillValue {
    /// The fill as elements of the decoded type: v2 object arrays store their fill as a JSON
    /// value, while their decoded elements are strings or bytes. As zarr-python 3 reads them:
    /// null is "" (or no bytes), and another value is its text (0 is "0").
    pub fn for_decoded(self, decoded: &DType) -> FillValue {
        let text = |v: Value| match v {
            Value::Null => String::new(),
            Value::String(s) => s,
            v => v.to_string(),
        };
        match (self, &decoded.kind) {
            (FillValue::Object(v), Kind::String) => FillValue::String(text(v)),
            // Written as base64 (zarr-python 3); a string that is not base64 is its bytes.
            (FillValue::Object(v), Kind::Bytes) => {
                let s = text(v);
                FillValue::Bytes(BASE64.decode(&s).unwrap_or_else(|_| s.into_bytes()))
            }
            (fill, _) => fill,
        }
    }
}

/// Raw bytes in the stored order of `dtype`, made little-endian.
fn swapped(dtype: &DType, mut raw: Vec<u8>) -> Vec<u8> {
    dtype.to_little_endian(&mut raw);
    raw
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fixed(v: Value, t: &str) -> Vec<u8> {
        match FillValue::parse(&v, &DType::from_v2(&json!(t)).unwrap(), 2).unwrap() {
            FillValue::Fixed(b) => b,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn numbers() {
        assert_eq!(fixed(json!(-2), "<i2"), (-2i16).to_le_bytes());
        assert_eq!(
            fixed(json!(-2), ">i2"),
            (-2i16).to_le_bytes(),
            "fills are little-endian whatever the dtype"
        );
        assert_eq!(fixed(json!(255), "|u1"), [255]);
        assert!(FillValue::parse(&json!(256), &DType::new(Kind::UInt(1)), 2).is_err());
        assert!(f32::from_le_bytes(fixed(json!("NaN"), "<f4").try_into().unwrap()).is_nan());
        assert_eq!(fixed(json!("-Infinity"), "<f8"), f64::NEG_INFINITY.to_le_bytes());
        assert_eq!(fixed(json!(1.5), "<f2"), half::f16::from_f32(1.5).to_le_bytes());
        assert_eq!(
            fixed(json!([1.0, -2.0]), "<c8"),
            [1f32.to_le_bytes(), (-2f32).to_le_bytes()].concat()
        );
        assert_eq!(fixed(json!("NaT"), "<M8[s]"), i64::MIN.to_le_bytes());
        assert_eq!(fixed(json!(null), "<i4"), [0, 0, 0, 0]);
        // zarr-python 3 reads a null fill of a v2 datetime or timedelta as NaT.
        assert_eq!(fixed(json!(null), "<M8[ns]"), i64::MIN.to_le_bytes());
        assert_eq!(fixed(json!(null), ">m8[s]"), i64::MIN.to_le_bytes());
        assert_eq!(fixed(json!(true), "|b1"), [1]);
    }

    #[test]
    fn v3_hex_floats() {
        let v = FillValue::parse(&json!("0x7fc00000"), &DType::new(Kind::Float(4)), 3).unwrap();
        assert_eq!(v, FillValue::Fixed(0x7fc0_0000u32.to_le_bytes().to_vec()));
        // Patterns of another width are their float's value (as zarr-python reads them).
        let float = |hex: &str, size: usize| -> f64 {
            match FillValue::parse(&json!(hex), &DType::new(Kind::Float(size)), 3).unwrap() {
                FillValue::Fixed(b) if size == 8 => f64::from_le_bytes(b.try_into().unwrap()),
                FillValue::Fixed(b) if size == 4 => f64::from(f32::from_le_bytes(b.try_into().unwrap())),
                FillValue::Fixed(b) => half::f16::from_le_bytes(b.try_into().unwrap()).to_f64(),
                other => panic!("{other:?}"),
            }
        };
        assert!(float("0x7fc00000", 8).is_nan());
        assert_eq!(float("0x3ff0000000000000", 4), 1.0);
        assert_eq!(float("0x3c00", 4), 1.0);
        assert_eq!(float("0x40000000", 2), 2.0);
        assert!(FillValue::parse(&json!("0x3c0"), &DType::new(Kind::Float(4)), 3).is_err());
    }

    /// zarr-python 3 writes the fill of a v2 vlen-bytes array as base64.
    #[test]
    fn vlen_bytes_fills_are_base64() {
        let bytes = DType::new(Kind::Bytes);
        let fill = |v: Value| FillValue::Object(v).for_decoded(&bytes);
        assert_eq!(fill(json!("YWI=")), FillValue::Bytes(b"ab".to_vec()));
        assert_eq!(fill(json!("not base64!")), FillValue::Bytes(b"not base64!".to_vec()));
        assert_eq!(fill(json!(null)), FillValue::Bytes(vec![]));
        let strings = DType::new(Kind::String);
        let fill = |v: Value| FillValue::Object(v).for_decoded(&strings);
        assert_eq!(fill(json!(null)), FillValue::String(String::new()));
        assert_eq!(fill(json!(0)), FillValue::String("0".into()));
        assert_eq!(fill(json!("x")), FillValue::String("x".into()));
    }

    #[test]
    fn strings_and_bytes() {
        assert_eq!(fixed(json!("ZmlsbA=="), "|S5"), b"fill\0");
        assert_eq!(fixed(json!("zz"), "<U3"), [b'z', 0, 0, 0, b'z', 0, 0, 0, 0, 0, 0, 0]);
        let st = DType::from_v2(&json!([["x", ">i2"], ["y", "<u1"]])).unwrap();
        let v = FillValue::parse(&json!(BASE64.encode([0x01, 0x02, 0x03])), &st, 2).unwrap();
        assert_eq!(v, FillValue::Fixed(vec![0x02, 0x01, 0x03]));
        let s = FillValue::parse(&json!(null), &DType::new(Kind::String), 2).unwrap();
        assert_eq!(s, FillValue::String(String::new()));
        assert!(FillValue::parse(&json!([1]), &DType::new(Kind::String), 3).is_err());
    }

    /// A number as the fill of a v2 `|S` or `<U` array (zarr-python 2's default was 0) is its
    /// text, as zarr 2.18 reads it: 0 -> b"0", 0.0 -> b"0.0", cut to the width ("0." in <U2).
    #[test]
    fn numbers_as_fills_of_v2_strings() {
        assert_eq!(fixed(json!(0), "|S1"), b"0");
        assert_eq!(fixed(json!(0), "|S3"), b"0\0\0");
        assert_eq!(fixed(json!(1), "|S3"), b"1\0\0");
        assert_eq!(fixed(json!(0.0), "|S3"), b"0.0");
        assert_eq!(fixed(json!(0.0), "<U2"), [b'0', 0, 0, 0, b'.', 0, 0, 0]);
        assert_eq!(fixed(json!(0), ">U1"), [b'0', 0, 0, 0]);
        for (number, text) in [
            (1e-5, "1e-05"),
            (1e16, "1e+16"),
            (2.5e-7, "2.5e-07"),
            (0.1, "0.1"),
            (-3.0, "-3.0"),
        ] {
            assert_eq!(python_text(&json!(number)), text);
        }
        assert_eq!(v2_numeric_string_fill(&json!("|S1"), &json!(0)), Some(json!("MA==")));
        assert_eq!(v2_numeric_string_fill(&json!("|S2"), &json!(0.0)), Some(json!("MC4=")));
        assert_eq!(v2_numeric_string_fill(&json!("<U2"), &json!(0.0)), Some(json!("0.")));
        assert_eq!(v2_numeric_string_fill(&json!("<U2"), &json!("x")), None);
        assert_eq!(v2_numeric_string_fill(&json!("<i4"), &json!(0)), None);
        // v3 has no such reading: its fixed-width types do not exist, and zarr 3 refuses it.
        let v3 = FillValue::parse(&json!(0), &DType::from_v2(&json!("|S1")).unwrap(), 3);
        assert!(v3.is_err());
    }
}
