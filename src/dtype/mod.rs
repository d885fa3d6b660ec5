//! Data types of Zarr v1/v2 (NumPy type strings and structured descriptions) and v3 (names,
//! plus the extension types zarr-python writes), parsed into one model.
//!
//! Decoded chunks hold fixed-size elements in little-endian order: the array->bytes codec swaps
//! big-endian data once, so everything downstream (assembly, output formats) sees one layout.

use serde_json::Value;
use std::borrow::Cow;

pub mod elements;
pub mod fill;

/// Errors in metadata documents.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetaError {
    /// The document is not valid JSON or misses/garbles a required field.
    #[error("invalid metadata: {0}")]
    Invalid(String),
    /// A data type, codec or feature this server cannot read.
    #[error("unsupported: {0}")]
    Unsupported(String),
}

/// The largest element (in bytes) of a data type this server reads.
pub const MAX_ITEM_SIZE: usize = 1 << 24;

/// What an element is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// `|b1` / `bool`: one byte, 0 or 1.
    Bool,
    /// Signed integer of 1, 2, 4 or 8 bytes.
    Int(usize),
    /// Unsigned integer of 1, 2, 4 or 8 bytes.
    UInt(usize),
    /// IEEE float of 2, 4 or 8 bytes.
    Float(usize),
    /// Complex of 8 or 16 bytes (two floats).
    Complex(usize),
    /// `M8[unit]`: int64 counts of `unit` since the epoch; NaT is i64::MIN.
    DateTime(String),
    /// `m8[unit]`: int64 counts of `unit`.
    TimeDelta(String),
    /// `|S n` (v3 `null_terminated_bytes`): n bytes, NUL-padded; a value ends at its trailing NULs,
    /// as NumPy reads it.
    FixedBytes(usize),
    /// `|V n` / v3 `r*` (`raw_bytes`): n opaque bytes, all of them the value.
    Raw(usize),
    /// `<U n`: n UTF-32 code units.
    FixedUnicode(usize),
    /// A NumPy structured type: fields at packed offsets.
    Structured(Vec<Field>),
    /// Variable-length UTF-8 strings (v2 `|O` + vlen-utf8, v3 `string`).
    String,
    /// Variable-length bytes (v2 `|O` + vlen-bytes, v3 `bytes` / `binary` / `variable_length_bytes`).
    Bytes,
    /// Arbitrary objects (v2 `|O` + json2): JSON values.
    Object,
}

/// One field of a structured type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    /// Field name.
    pub name: String,
    /// Field type.
    pub dtype: DType,
    /// Subarray shape (empty for a scalar field).
    pub shape: Vec<usize>,
}

/// A data type with the byte order of its stored form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DType {
    /// The element kind.
    pub kind: Kind,
    /// Stored big-endian (meaningful for multi-byte scalars only).
    pub big_endian: bool,
}

impl DType {
    /// A little-endian type of this kind.
    pub fn new(kind: Kind) -> Self {
        Self {
            kind,
            big_endian: false,
        }
    }

    /// Bytes per element for fixed-size kinds; `None` for variable-length kinds.
    pub fn item_size(&self) -> Option<usize> {
        Some(match &self.kind {
            Kind::Bool => 1,
            Kind::Int(n) | Kind::UInt(n) | Kind::Float(n) | Kind::Complex(n) | Kind::FixedBytes(n) | Kind::Raw(n) => *n,
            Kind::DateTime(_) | Kind::TimeDelta(_) => 8,
            Kind::FixedUnicode(n) => 4 * n,
            Kind::Structured(fields) => {
                let mut total = 0usize;
                for f in fields {
                    total += f.dtype.item_size()? * f.shape.iter().product::<usize>();
                }
                total
            }
            Kind::String | Kind::Bytes | Kind::Object => return None,
        })
    }

    /// Whether elements are variable-length (strings, bytes, objects).
    pub fn is_variable(&self) -> bool {
        matches!(self.kind, Kind::String | Kind::Bytes | Kind::Object)
    }

    /// The same type in little-endian order (what decoded chunks hold).
    pub fn little_endian(&self) -> DType {
        let kind = match &self.kind {
            Kind::Structured(fields) => Kind::Structured(
                fields
                    .iter()
                    .map(|f| Field {
                        name: f.name.clone(),
                        dtype: f.dtype.little_endian(),
                        shape: f.shape.clone(),
                    })
                    .collect(),
            ),
            k => k.clone(),
        };
        DType {
            kind,
            big_endian: false,
        }
    }

    /// Swaps every multi-byte scalar in `buf` (a run of elements of this type) from the stored
    /// byte order to little-endian. A no-op for little-endian types.
    pub fn to_little_endian(&self, buf: &mut [u8]) {
        if !self.needs_swap() {
            return;
        }
        let Some(size) = self.item_size().filter(|s| *s > 0) else {
            return;
        };
        for element in buf.chunks_exact_mut(size) {
            self.swap_element(element);
        }
    }

    fn needs_swap(&self) -> bool {
        match &self.kind {
            Kind::Structured(fields) => fields.iter().any(|f| f.dtype.needs_swap()),
            _ => self.big_endian && self.scalar_size() > 1,
        }
    }

    /// Size of the scalars that are byte-swapped as a unit.
    fn scalar_size(&self) -> usize {
        match &self.kind {
            Kind::Int(n) | Kind::UInt(n) | Kind::Float(n) => *n,
            Kind::Complex(n) => n / 2,
            Kind::DateTime(_) | Kind::TimeDelta(_) => 8,
            Kind::FixedUnicode(_) => 4,
            _ => 1,
        }
    }

    fn swap_element(&self, element: &mut [u8]) {
        match &self.kind {
            Kind::Structured(fields) => {
                let mut offset = 0;
                for f in fields {
                    let size = f.dtype.item_size().unwrap_or(0);
                    for _ in 0..f.shape.iter().product::<usize>() {
                        if let Some(part) = element.get_mut(offset..offset + size)
                            && f.dtype.needs_swap()
                        {
                            f.dtype.swap_element(part);
                        }
                        offset += size;
                    }
                }
            }
            _ if self.big_endian => {
                let s = self.scalar_size();
                if s > 1 {
                    for scalar in element.chunks_exact_mut(s) {
                        scalar.reverse();
                    }
                }
            }
            _ => {}
        }
    }

    /// Parses a v1/v2 `dtype`: a NumPy type string or a structured description (a list).
    pub fn from_v2(value: &Value) -> Result<Self, MetaError> {
        match value {
            Value::String(s) => parse_typestr(s)?.bounded(),
            Value::Array(fields) => {
                let mut out = Vec::with_capacity(fields.len());
                for (index, f) in fields.iter().enumerate() {
                    let parts = f.as_array().ok_or_else(|| bad_dtype(value))?;
                    let name = parts.first().and_then(Value::as_str).ok_or_else(|| bad_dtype(value))?;
                    // A field without a name (the padding of an aligned struct, `["", "|V3"]`)
                    // is named as NumPy names it when zarr-python builds the dtype: `f{index}`.
                    let name = match name {
                        "" => format!("f{index}"),
                        named => named.to_owned(),
                    };
                    let dtype = DType::from_v2(parts.get(1).ok_or_else(|| bad_dtype(value))?)?;
                    let shape = match parts.get(2) {
                        None => Vec::new(),
                        Some(Value::Array(dims)) => dims
                            .iter()
                            .map(|d| d.as_u64().map(|d| d as usize))
                            .collect::<Option<Vec<_>>>()
                            .ok_or_else(|| bad_dtype(value))?,
                        Some(Value::Number(n)) => vec![n.as_u64().ok_or_else(|| bad_dtype(value))? as usize],
                        Some(_) => return Err(bad_dtype(value)),
                    };
                    if dtype.is_variable() {
                        return Err(MetaError::Unsupported(format!(
                            "object field '{name}' in a structured type"
                        )));
                    }
                    out.push(Field { name, dtype, shape });
                }
                structured(out)?.bounded()
            }
            _ => Err(bad_dtype(value)),
        }
    }

    /// Parses a v3 `data_type` (a name, or `{"name", "configuration"}` for extension types).
    /// The byte order comes from the `bytes` codec, not from here.
    pub fn from_v3(value: &Value) -> Result<Self, MetaError> {
        let (name, config) = match value {
            Value::String(s) => (s.as_str(), None),
            Value::Object(o) => (
                o.get("name").and_then(Value::as_str).ok_or_else(|| bad_dtype(value))?,
                o.get("configuration"),
            ),
            _ => return Err(bad_dtype(value)),
        };
        let cfg_usize = |key: &str| -> Result<usize, MetaError> {
            config
                .and_then(|c| c.get(key))
                .and_then(Value::as_u64)
                .map(|n| n as usize)
                .ok_or_else(|| MetaError::Invalid(format!("data type {name} needs configuration.{key}")))
        };
        let unit = || -> Result<String, MetaError> {
            let unit = config
                .and_then(|c| c.get("unit"))
                .and_then(Value::as_str)
                .ok_or_else(|| MetaError::Invalid(format!("data type {name} needs configuration.unit")))?;
            let scale = config
                .and_then(|c| c.get("scale_factor"))
                .and_then(Value::as_u64)
                .unwrap_or(1);
            let unit = ascii_time_unit(&if scale == 1 {
                unit.to_owned()
            } else {
                format!("{scale}{unit}")
            });
            if !is_time_unit(&unit) {
                return Err(MetaError::Invalid(format!(
                    "data type {name}: '{unit}' is not a NumPy time unit"
                )));
            }
            Ok(unit)
        };
        let kind = match name {
            "bool" => Kind::Bool,
            "int8" => Kind::Int(1),
            "int16" => Kind::Int(2),
            "int32" => Kind::Int(4),
            "int64" => Kind::Int(8),
            "uint8" => Kind::UInt(1),
            "uint16" => Kind::UInt(2),
            "uint32" => Kind::UInt(4),
            "uint64" => Kind::UInt(8),
            "float16" => Kind::Float(2),
            "float32" => Kind::Float(4),
            "float64" => Kind::Float(8),
            "complex64" => Kind::Complex(8),
            "complex128" => Kind::Complex(16),
            "string" => Kind::String,
            "bytes" | "binary" | "variable_length_bytes" => Kind::Bytes,
            "numpy.datetime64" => Kind::DateTime(unit()?),
            "numpy.timedelta64" => Kind::TimeDelta(unit()?),
            "fixed_length_utf32" => match cfg_usize("length_bytes")? {
                n if n % 4 == 0 => Kind::FixedUnicode(n / 4),
                n => {
                    return Err(MetaError::Invalid(format!(
                        "fixed_length_utf32 length_bytes {n} is not a multiple of 4"
                    )));
                }
            },
            "null_terminated_bytes" | "fixed_length_bytes" | "fixed_length_ascii" => {
                Kind::FixedBytes(cfg_usize("length_bytes")?)
            }
            "raw_bytes" => Kind::Raw(cfg_usize("length_bytes")?),
            // zarr-python's extension: `{"fields": [[name, data type], ...]}`, packed, each field
            // in the byte order of the bytes codec.
            "structured" => {
                let bad = || MetaError::Invalid(format!("data type structured: bad fields in {value}"));
                let fields = config
                    .and_then(|c| c.get("fields"))
                    .and_then(Value::as_array)
                    .ok_or_else(bad)?;
                let mut out = Vec::with_capacity(fields.len());
                for field in fields {
                    let [name, dtype] = field.as_array().map(Vec::as_slice).ok_or_else(bad)? else {
                        return Err(bad());
                    };
                    let name = name.as_str().ok_or_else(bad)?.to_owned();
                    let dtype = DType::from_v3(dtype)?;
                    if dtype.is_variable() {
                        return Err(MetaError::Unsupported(format!(
                            "variable-length field '{name}' in a structured type"
                        )));
                    }
                    out.push(Field {
                        name,
                        dtype,
                        shape: Vec::new(),
                    });
                }
                structured(out)?.kind
            }
            r if r.starts_with('r') && r.len() > 1 && r[1..].bytes().all(|b| b.is_ascii_digit()) => {
                let bits: usize = r[1..].parse().map_err(|_| bad_dtype(value))?;
                if bits == 0 || !bits.is_multiple_of(8) {
                    return Err(MetaError::Unsupported(format!("raw data type {r} (not whole bytes)")));
                }
                Kind::Raw(bits / 8)
            }
            other => return Err(MetaError::Unsupported(format!("data type '{other}'"))),
        };
        DType::new(kind).bounded()
    }

    /// Refuses element sizes that overflow or exceed [`MAX_ITEM_SIZE`]: the fill value and
    /// every buffer hold whole elements, so a type like `|S100000000000` (or a structured field
    /// of shape `[2^64 - 1]`) would otherwise allocate what it claims, or overflow `item_size`.
    fn bounded(self) -> Result<Self, MetaError> {
        fn size(dtype: &DType) -> Option<usize> {
            match &dtype.kind {
                Kind::FixedUnicode(n) => n.checked_mul(4),
                Kind::Structured(fields) => fields.iter().try_fold(0usize, |total, f| {
                    let count = f.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))?;
                    total.checked_add(size(&f.dtype)?.checked_mul(count)?)
                }),
                _ => Some(dtype.item_size().unwrap_or(0)),
            }
        }
        match size(&self) {
            // A fixed-size type of no bytes (`|S0`, `|V0`, a structured type without fields)
            // would make every selection size 0 and pass every size limit, whatever its count.
            Some(0) if self.item_size().is_some() => {
                Err(MetaError::Unsupported("a data type of 0 bytes per element".into()))
            }
            Some(n) if n <= MAX_ITEM_SIZE => Ok(self),
            _ => Err(MetaError::Unsupported(format!(
                "a data type of more than {MAX_ITEM_SIZE} bytes per element"
            ))),
        }
    }

    /// The NumPy type string of this type as decoded (little-endian), e.g. `<f4`, `|b1`,
    /// `<M8[s]`, `|S5`, `<U4`, `|V12` for structured types, `|O` for variable-length ones.
    /// Borrowed for the numeric types, whose strings are few (no allocation for a slice's
    /// `X-Zarr-Dtype` header of them).
    pub fn typestr(&self) -> Cow<'static, str> {
        Cow::Borrowed(match &self.kind {
            Kind::Bool => "|b1",
            Kind::Int(1) => "|i1",
            Kind::UInt(1) => "|u1",
            Kind::Int(2) => "<i2",
            Kind::Int(4) => "<i4",
            Kind::Int(8) => "<i8",
            Kind::UInt(2) => "<u2",
            Kind::UInt(4) => "<u4",
            Kind::UInt(8) => "<u8",
            Kind::Float(2) => "<f2",
            Kind::Float(4) => "<f4",
            Kind::Float(8) => "<f8",
            Kind::Complex(8) => "<c8",
            Kind::Complex(16) => "<c16",
            Kind::String | Kind::Bytes | Kind::Object => "|O",
            Kind::Int(n) => return format!("<i{n}").into(),
            Kind::UInt(n) => return format!("<u{n}").into(),
            Kind::Float(n) => return format!("<f{n}").into(),
            Kind::Complex(n) => return format!("<c{n}").into(),
            Kind::DateTime(u) => return format!("<M8[{u}]").into(),
            Kind::TimeDelta(u) => return format!("<m8[{u}]").into(),
            Kind::FixedBytes(n) => return format!("|S{n}").into(),
            Kind::Raw(n) => return format!("|V{n}").into(),
            Kind::FixedUnicode(n) => return format!("<U{n}").into(),
            Kind::Structured(_) => return format!("|V{}", self.item_size().unwrap_or(0)).into(),
        })
    }

    /// The NumPy `descr` of this type as decoded: the type string, or for structured types a
    /// list of `[name, descr(, shape)]`.
    pub fn descr(&self) -> Value {
        match &self.kind {
            Kind::Structured(fields) => Value::Array(
                fields
                    .iter()
                    .map(|f| {
                        let mut entry = vec![Value::from(f.name.clone()), f.dtype.descr()];
                        if !f.shape.is_empty() {
                            entry.push(Value::from(f.shape.clone()));
                        }
                        Value::Array(entry)
                    })
                    .collect(),
            ),
            _ => Value::from(self.typestr()),
        }
    }
}

/// A structured type of `fields`, whose names must differ (NumPy refuses a repeated one, and
/// JSON would write a key twice and lose a value).
fn structured(fields: Vec<Field>) -> Result<DType, MetaError> {
    let mut names = std::collections::HashSet::new();
    if let Some(twice) = fields.iter().find(|f| !names.insert(f.name.as_str())) {
        return Err(MetaError::Invalid(format!(
            "structured type with two fields named '{}'",
            twice.name
        )));
    }
    Ok(DType::new(Kind::Structured(fields)))
}

fn bad_dtype(value: &Value) -> MetaError {
    MetaError::Invalid(format!("invalid dtype {value}"))
}

/// The type string of a NumPy type name or one-character code that NumPy (and so zarr-python)
/// accepts in place of one (`int32`, `float64`, `bool`, `<q`, `d`, `double`), for NumPy 2 on
/// 64-bit Linux (`l`, `long` and `int` are 8 bytes).
fn alias(name: &str) -> Option<&'static str> {
    Some(match name {
        "bool" | "?" => "b1",
        "int8" | "b" => "i1",
        "uint8" | "B" => "u1",
        "int16" | "h" => "i2",
        "uint16" | "H" => "u2",
        "int32" | "i" => "i4",
        "uint32" | "I" => "u4",
        "int64" | "l" | "q" | "p" => "i8",
        "uint64" | "L" | "Q" | "P" => "u8",
        "float16" | "e" => "f2",
        "float32" | "f" => "f4",
        "float64" | "d" => "f8",
        "complex64" | "F" | "csingle" => "c8",
        "complex128" | "D" | "complex" | "cdouble" => "c16",
        "bool_" => "b1",
        "byte" => "i1",
        "ubyte" => "u1",
        "short" => "i2",
        "ushort" => "u2",
        "intc" => "i4",
        "uintc" => "u4",
        "int" | "int_" | "intp" | "long" | "longlong" => "i8",
        "uint" | "uintp" | "ulong" | "ulonglong" => "u8",
        "half" => "f2",
        "single" => "f4",
        "float" | "double" => "f8",
        // A datetime64 / timedelta64 without a unit: NumPy's generic unit.
        "M8" | "M" | "datetime64" => "M8[generic]",
        "m8" | "m" | "timedelta64" => "m8[generic]",
        _ => return None,
    })
}

/// Parses a NumPy type string such as `<i4`, `>f8`, `|b1`, `<M8[ns]`, `|S5`, `<U4`, `|O`, or a
/// NumPy type name or code standing for one ([`alias`]).
fn parse_typestr(s: &str) -> Result<DType, MetaError> {
    let bad = || MetaError::Invalid(format!("invalid dtype '{s}'"));
    let mut chars = s.chars();
    let order = chars.next().ok_or_else(bad)?;
    let (big_endian, rest) = match order {
        '<' | '|' | '=' => (false, &s[1..]),
        '>' => (true, &s[1..]),
        _ => (false, s),
    };
    let rest = alias(rest).unwrap_or(rest);
    let code = rest.chars().next().ok_or_else(bad)?;
    let tail = &rest[code.len_utf8()..];
    let size = || tail.parse::<usize>().map_err(|_| bad());
    let unit = || -> Result<String, MetaError> {
        let inner = tail
            .strip_prefix('8')
            .and_then(|t| t.strip_prefix('['))
            .and_then(|t| t.strip_suffix(']'))
            .ok_or_else(bad)?;
        let unit = ascii_time_unit(inner);
        if !is_time_unit(&unit) {
            return Err(bad());
        }
        Ok(unit)
    };
    let kind = match code {
        'b' if tail == "1" => Kind::Bool,
        '?' if tail.is_empty() => Kind::Bool,
        'i' => match size()? {
            n @ (1 | 2 | 4 | 8) => Kind::Int(n),
            _ => return Err(bad()),
        },
        'u' => match size()? {
            n @ (1 | 2 | 4 | 8) => Kind::UInt(n),
            _ => return Err(bad()),
        },
        'f' => match size()? {
            n @ (2 | 4 | 8) => Kind::Float(n),
            n => return Err(MetaError::Unsupported(format!("float of {n} bytes ('{s}')"))),
        },
        'c' => match size()? {
            n @ (8 | 16) => Kind::Complex(n),
            n => return Err(MetaError::Unsupported(format!("complex of {n} bytes ('{s}')"))),
        },
        'M' => Kind::DateTime(unit()?),
        'm' => Kind::TimeDelta(unit()?),
        'S' | 'a' => Kind::FixedBytes(size()?),
        'V' => Kind::Raw(size()?),
        'U' => Kind::FixedUnicode(size()?),
        'O' if tail.is_empty() => Kind::Object,
        _ => return Err(MetaError::Unsupported(format!("dtype '{s}'"))),
    };
    Ok(DType { kind, big_endian })
}

/// A NumPy datetime64 / timedelta64 unit: an optional positive multiple and one of NumPy's
/// units (`s`, `10ms`; not `1.5s`, which NumPy refuses, so an .npy of it could not be read).
fn is_time_unit(unit: &str) -> bool {
    if unit == "generic" {
        return true;
    }
    let digits = unit.bytes().take_while(u8::is_ascii_digit).count();
    let (multiple, name) = unit.split_at(digits);
    // NumPy's multiples are C ints.
    let multiple_ok = multiple.is_empty() || multiple.parse::<i32>().is_ok_and(|m| m > 0);
    multiple_ok
        && matches!(
            name,
            "Y" | "M" | "W" | "D" | "h" | "m" | "s" | "ms" | "us" | "ns" | "ps" | "fs" | "as"
        )
}

/// A time unit as zarrgate names it: NumPy's `μs` spelled `us` (the name goes into an HTTP
/// header, X-Zarr-Dtype, which is ASCII).
fn ascii_time_unit(unit: &str) -> String {
    match unit.strip_suffix("\u{3bc}s") {
        Some(multiple) => format!("{multiple}us"),
        None => unit.to_owned(),
    }
}

/// The float16 nearest `x` (ties to even), as NumPy rounds a float64 into a float16. Not
/// `half::f16::from_f64`: with F16C it goes through a float32 first, and without it drops the
/// low 32 bits of the mantissa; either way a value just past a tie (1 + 2^-11 + 2^-40) is
/// rounded twice and lands on the wrong side. Here the float32 step rounds to odd (toward zero,
/// then the last bit set when inexact), which no second rounding to 11 bits can be misled by.
pub fn f16_from_f64(x: f64) -> half::f16 {
    let mut near = x as f32;
    if near.is_finite() && f64::from(near) != x {
        if f64::from(near).abs() > x.abs() {
            // One step toward zero: the magnitude's bits less one.
            near = f32::from_bits(near.to_bits() - 1);
        }
        near = f32::from_bits(near.to_bits() | 1);
    }
    half::f16::from_f32(near)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn numpy_names_and_codes_stand_for_type_strings() {
        for (alias, typestr) in [
            ("int32", "<i4"),
            ("float64", "<f8"),
            ("bool", "|b1"),
            ("<q", "<i8"),
            ("<d", "<f8"),
            ("|b", "|i1"),
            ("B", "|u1"),
            ("complex128", "<c16"),
            ("<M8", "<M8[generic]"),
            ("float16", "<f2"),
            ("int", "<i8"),
            ("float", "<f8"),
            ("complex", "<c16"),
            ("uint", "<u8"),
            ("double", "<f8"),
            ("half", "<f2"),
            ("short", "<i2"),
            ("bool_", "|b1"),
            ("longlong", "<i8"),
        ] {
            let parsed = DType::from_v2(&json!(alias)).unwrap_or_else(|e| panic!("{alias}: {e}"));
            assert_eq!(parsed.typestr(), typestr, "{alias}");
            assert!(!parsed.big_endian, "{alias}");
        }
        let big = DType::from_v2(&json!(">d")).unwrap();
        assert!(big.big_endian && big.kind == Kind::Float(8));
        for bad in ["int31", "foo", "<x4", ""] {
            assert!(DType::from_v2(&json!(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn v3_structured_types() {
        let ok = json!({"name": "structured", "configuration": {"fields": [
            ["a", "int32"], ["c", {"name": "null_terminated_bytes", "configuration": {"length_bytes": 3}}]
        ]}});
        let parsed = DType::from_v3(&ok).unwrap();
        assert_eq!(parsed.item_size(), Some(7));
        assert_eq!(parsed.descr(), json!([["a", "<i4"], ["c", "|S3"]]));
        for bad in [
            json!({"name": "structured"}),
            json!({"name": "structured", "configuration": {"fields": [["a"]]}}),
            json!({"name": "structured", "configuration": {"fields": [[1, "int8"]]}}),
        ] {
            assert!(matches!(DType::from_v3(&bad), Err(MetaError::Invalid(_))), "{bad}");
        }
        let vlen = json!({"name": "structured", "configuration": {"fields": [["s", "string"]]}});
        assert!(matches!(DType::from_v3(&vlen), Err(MetaError::Unsupported(_))));
    }

    #[test]
    fn repeated_field_names_are_invalid() {
        for doc in [json!([["a", "<i4"], ["a", "<f8"]]), json!([["f1", "<i4"], ["", "<i4"]])] {
            assert!(matches!(DType::from_v2(&doc), Err(MetaError::Invalid(_))), "{doc}");
        }
        let v3 = json!({"name": "structured", "configuration": {"fields": [["a", "int8"], ["a", "int8"]]}});
        assert!(matches!(DType::from_v3(&v3), Err(MetaError::Invalid(_))));
    }

    #[test]
    fn unnamed_fields_are_named_as_numpy_names_them() {
        let padded = json!([["a", "|u1"], ["", "|V3"], ["b", "<i4"], ["c", "|u1"], ["", "|V3"]]);
        let Kind::Structured(fields) = DType::from_v2(&padded).unwrap().kind else {
            panic!("not structured");
        };
        let names: Vec<&str> = fields.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["a", "f1", "b", "c", "f4"]);
    }

    #[test]
    fn element_sizes_are_bounded() {
        // Found by fuzz/metadata_v2: a structured field of shape [2^64 - 1] overflowed
        // item_size (a panic in debug builds); and a null fill of `|S100000000000` allocated
        // 100 GB at parse time (an abort of the whole process).
        let field = json!([["m", "<f4", [u64::MAX]], ["n", ">i2"]]);
        assert!(matches!(DType::from_v2(&field), Err(MetaError::Unsupported(_))));
        let nested = json!([["a", [["b", "<U1000", [1000]]], [1000]]]);
        assert!(matches!(DType::from_v2(&nested), Err(MetaError::Unsupported(_))));
        for big in ["|S100000000000", "<U4611686018427387904", "|V16777217"] {
            assert!(
                matches!(DType::from_v2(&json!(big)), Err(MetaError::Unsupported(_))),
                "{big}"
            );
        }
        let v3 = json!({"name": "fixed_length_bytes", "configuration": {"length_bytes": 100_000_000_000u64}});
        assert!(matches!(DType::from_v3(&v3), Err(MetaError::Unsupported(_))));
        assert!(matches!(
            DType::from_v3(&json!("r134217736")),
            Err(MetaError::Unsupported(_))
        ));
        // Nor of no bytes: a selection of any count would weigh nothing against the limits.
        for empty in [json!("|S0"), json!("|V0"), json!("<U0"), json!([])] {
            assert!(
                matches!(DType::from_v2(&empty), Err(MetaError::Unsupported(_))),
                "{empty}"
            );
        }
        let v3 = json!({"name": "fixed_length_bytes", "configuration": {"length_bytes": 0}});
        assert!(matches!(DType::from_v3(&v3), Err(MetaError::Unsupported(_))));
        assert!(matches!(DType::from_v3(&json!("r0")), Err(MetaError::Unsupported(_))));
        // Up to the bound, and every ordinary type, as before.
        assert_eq!(
            DType::from_v2(&json!("|S16777216")).unwrap().item_size(),
            Some(MAX_ITEM_SIZE)
        );
        assert_eq!(
            DType::from_v2(&json!([["x", "<f8", [2, 3]]])).unwrap().item_size(),
            Some(48)
        );
        assert_eq!(DType::from_v3(&json!("float64")).unwrap().item_size(), Some(8));
    }

    /// The numeric types' type strings are static (no allocation), visible ASCII (a header
    /// value `from_static` takes), and the little-endian form of what was read.
    #[test]
    fn numeric_typestrs_are_static() {
        for (read, written) in [
            ("|b1", "|b1"),
            ("|i1", "|i1"),
            ("|u1", "|u1"),
            (">i2", "<i2"),
            ("<i4", "<i4"),
            ("<i8", "<i8"),
            ("<u2", "<u2"),
            (">u4", "<u4"),
            ("<u8", "<u8"),
            ("<f2", "<f2"),
            ("<f4", "<f4"),
            (">f8", "<f8"),
            ("<c8", "<c8"),
            ("<c16", "<c16"),
        ] {
            let typestr = DType::from_v2(&json!(read)).unwrap().typestr();
            assert!(matches!(typestr, Cow::Borrowed(_)), "{read}");
            assert_eq!(typestr, written);
            assert!(typestr.bytes().all(|b| b.is_ascii_graphic()), "{read}");
        }
        assert!(matches!(
            DType::from_v2(&json!("<M8[s]")).unwrap().typestr(),
            Cow::Owned(_)
        ));
    }

    #[test]
    fn typestrs() {
        assert_eq!(DType::from_v2(&json!("<i4")).unwrap(), DType::new(Kind::Int(4)));
        let be = DType::from_v2(&json!(">f8")).unwrap();
        assert!(be.big_endian);
        assert_eq!(be.typestr(), "<f8");
        assert_eq!(DType::from_v2(&json!("|b1")).unwrap().kind, Kind::Bool);
        assert_eq!(
            DType::from_v2(&json!("<M8[ns]")).unwrap().kind,
            Kind::DateTime("ns".into())
        );
        assert_eq!(DType::from_v2(&json!("<m8[10s]")).unwrap().typestr(), "<m8[10s]");
        assert_eq!(DType::from_v2(&json!("|S5")).unwrap().item_size(), Some(5));
        assert_eq!(DType::from_v2(&json!(">U4")).unwrap().item_size(), Some(16));
        assert_eq!(DType::from_v2(&json!("|O")).unwrap().kind, Kind::Object);
        // Time units NumPy reads: a positive multiple and one of its units.
        assert_eq!(DType::from_v2(&json!("<m8[5\u{3bc}s]")).unwrap().typestr(), "<m8[5us]");
        assert_eq!(
            DType::from_v2(&json!("<M8[generic]")).unwrap().typestr(),
            "<M8[generic]"
        );
        for bad in [
            "<M8[1.5s]",
            "<M8[0s]",
            "<M8[5000000000s]",
            "<m8[xs]",
            "<M8[]",
            "<M8[s]]",
            "<M8[2generic]",
        ] {
            assert!(DType::from_v2(&json!(bad)).is_err(), "{bad}");
        }
        let v3 = |unit: &str, scale: u64| {
            DType::from_v3(&json!({"name": "numpy.datetime64", "configuration": {"unit": unit, "scale_factor": scale}}))
        };
        assert_eq!(v3("ms", 10).unwrap().typestr(), "<M8[10ms]");
        assert!(v3("1.5s", 1).is_err() && v3("s", 0).is_err());
        assert_eq!(v3("generic", 1).unwrap().typestr(), "<M8[generic]");
        for bad in ["", "<i3", "<x4", "<M8[", "<f16x"] {
            assert!(DType::from_v2(&json!(bad)).is_err(), "{bad}");
        }
        assert!(matches!(DType::from_v2(&json!("<f16")), Err(MetaError::Unsupported(_))));
    }

    #[test]
    fn structured_sizes_and_swaps() {
        let d = DType::from_v2(&json!([
            ["a", "<i4"],
            ["b", ">f8", [2]],
            ["c", [["x", "|u1"], ["y", ">i2"]]]
        ]))
        .unwrap();
        assert_eq!(d.item_size(), Some(4 + 16 + 3));
        let mut el: Vec<u8> = (0..23).collect();
        d.to_little_endian(&mut el);
        let mut want: Vec<u8> = (0..23).collect();
        want[4..12].reverse();
        want[12..20].reverse();
        want[21..23].reverse();
        assert_eq!(el, want);
        assert_eq!(
            d.descr(),
            json!([["a", "<i4"], ["b", "<f8", [2]], ["c", [["x", "|u1"], ["y", "<i2"]]]])
        );
    }

    #[test]
    fn v3_names() {
        assert_eq!(DType::from_v3(&json!("uint16")).unwrap().kind, Kind::UInt(2));
        assert_eq!(DType::from_v3(&json!("r24")).unwrap().kind, Kind::Raw(3));
        assert_eq!(
            DType::from_v3(&json!("variable_length_bytes")).unwrap().kind,
            Kind::Bytes
        );
        let dt = json!({"name": "numpy.datetime64", "configuration": {"unit": "s", "scale_factor": 1}});
        assert_eq!(DType::from_v3(&dt).unwrap().kind, Kind::DateTime("s".into()));
        let u = json!({"name": "fixed_length_utf32", "configuration": {"length_bytes": 16}});
        assert_eq!(DType::from_v3(&u).unwrap().kind, Kind::FixedUnicode(4));
        let odd = json!({"name": "fixed_length_utf32", "configuration": {"length_bytes": 6}});
        assert!(DType::from_v3(&odd).unwrap_err().to_string().contains("multiple of 4"));
        assert!(matches!(
            DType::from_v3(&json!("float128")),
            Err(MetaError::Unsupported(_))
        ));
        assert!(DType::from_v3(&json!(7)).is_err());
    }
}
