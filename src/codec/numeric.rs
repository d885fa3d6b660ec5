//! Typed scalar reads and writes shared by the numcodecs filters (delta, fixedscaleoffset,
//! quantize, astype), with NumPy's `astype` casting rules: floats truncate toward zero into
//! integers, integers wrap into narrower integers.

use serde_json::Value;

use super::CodecError;
use crate::dtype::{DType, Kind};

/// A scalar value in a wide representation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Num {
    /// Any integer (or bool) value.
    Int(i128),
    /// Any floating-point value.
    Float(f64),
}

impl Num {
    /// As a float.
    pub fn as_f64(self) -> f64 {
        match self {
            Num::Int(i) => i as f64,
            Num::Float(f) => f,
        }
    }
}

pub use crate::dtype::f16_from_f64;

/// A number that codecs decoding typed numbers (pcodec, zfpy) write out: decoded chunks hold
/// little-endian elements.
pub trait LittleEndian: Copy + Default {
    /// Appends the number's little-endian bytes.
    fn put_le(self, out: &mut Vec<u8>);
}

macro_rules! little_endian {
    ($($t:ty),*) => {$(
        impl LittleEndian for $t {
            fn put_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}

little_endian!(u8, u16, u32, u64, i8, i16, i32, i64, half::f16, f32, f64);

/// `numbers` as little-endian bytes.
pub fn to_le_bytes<T: LittleEndian>(numbers: &[T]) -> Vec<u8> {
    let mut out = Vec::with_capacity(std::mem::size_of_val(numbers));
    for &x in numbers {
        x.put_le(&mut out);
    }
    out
}

/// A numeric element type as the filters declare it (`"<i4"`, `">f8"`, `"|u1"`, `"|b1"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scalar(DType);

impl Scalar {
    /// Parses a filter's dtype option; only numeric and bool types are accepted.
    pub fn parse(config: &Value, key: &str) -> Result<Scalar, CodecError> {
        let value = config
            .get(key)
            .ok_or_else(|| CodecError::Config(format!("missing option '{key}'")))?;
        // v2 filters name NumPy type strings; v3 `numcodecs.*` codecs may use v3 names ("int32").
        let dtype = DType::from_v2(value)
            .or_else(|_| DType::from_v3(value))
            .map_err(|e| CodecError::Config(e.to_string()))?;
        Scalar::new(dtype)
    }

    /// Wraps a numeric type.
    pub fn new(dtype: DType) -> Result<Scalar, CodecError> {
        match dtype.kind {
            Kind::Bool | Kind::Int(_) | Kind::UInt(_) | Kind::Float(_) => Ok(Scalar(dtype)),
            _ => Err(CodecError::Unsupported(format!(
                "filter on non-numeric dtype {}",
                dtype.typestr()
            ))),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> &DType {
        &self.0
    }

    /// Bytes per element.
    pub fn size(&self) -> usize {
        self.0.item_size().unwrap_or(1)
    }

    /// Whether this is a floating-point type.
    pub fn is_float(&self) -> bool {
        matches!(self.0.kind, Kind::Float(_))
    }

    /// Reads one element.
    pub fn read(&self, bytes: &[u8]) -> Num {
        let mut buf = [0u8; 8];
        let n = bytes.len().min(8);
        buf[..n].copy_from_slice(&bytes[..n]);
        if self.0.big_endian {
            buf[..n].reverse();
        }
        match self.0.kind {
            Kind::Float(2) => Num::Float(half::f16::from_le_bytes([buf[0], buf[1]]).to_f64()),
            Kind::Float(4) => Num::Float(f32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as f64),
            Kind::Float(_) => Num::Float(f64::from_le_bytes(buf)),
            Kind::Int(s) => {
                let shift = 64 - 8 * s as u32;
                Num::Int(((i64::from_le_bytes(buf) << shift) >> shift) as i128)
            }
            _ => Num::Int(u64::from_le_bytes(buf) as i128),
        }
    }

    /// Writes one element, casting like NumPy's `astype`.
    pub fn write(&self, value: Num, out: &mut [u8]) {
        let size = self.size();
        let mut buf = [0u8; 8];
        match self.0.kind {
            Kind::Float(2) => buf[..2].copy_from_slice(&f16_from_f64(value.as_f64()).to_le_bytes()),
            // An integer is rounded once, straight to float32 (not through a float64 first).
            Kind::Float(4) => {
                let x = match value {
                    Num::Int(i) => i as f32,
                    Num::Float(f) => f as f32,
                };
                buf[..4].copy_from_slice(&x.to_le_bytes());
            }
            Kind::Float(_) => buf.copy_from_slice(&value.as_f64().to_le_bytes()),
            Kind::Bool => {
                buf[0] = match value {
                    Num::Int(i) => (i != 0) as u8,
                    Num::Float(f) => (f != 0.0) as u8,
                }
            }
            _ => {
                let wide: i128 = match value {
                    Num::Int(i) => i,
                    Num::Float(f) => f.trunc() as i128,
                };
                buf.copy_from_slice(&(wide as i64).to_le_bytes());
            }
        }
        if self.0.big_endian {
            buf[..size].reverse();
        }
        out[..size].copy_from_slice(&buf[..size]);
    }

    /// Converts a run of elements of type `from` into this type.
    pub fn convert_from(&self, from: &Scalar, input: &[u8], limit: usize) -> Result<Vec<u8>, CodecError> {
        let n = count(input, from)?;
        let out_len = n * self.size();
        if out_len > limit {
            return Err(CodecError::TooLarge { limit });
        }
        let mut out = vec![0u8; out_len];
        for (src, dst) in input.chunks_exact(from.size()).zip(out.chunks_exact_mut(self.size())) {
            self.write(from.read(src), dst);
        }
        Ok(out)
    }

    /// The type NumPy computes in when an operation mixes arrays of this type and `other`
    /// (`numpy.result_type`): the wider of two floats or of two integers of one signedness; a
    /// signed integer wide enough for both for mixed signedness (a float64 past int64); a float
    /// that holds the integer exactly otherwise (float16 up to 8 bits, float32 up to 16, float64
    /// beyond). The byte order is this type's.
    pub fn promoted(&self, other: &Scalar) -> Scalar {
        /// (float, signed, bytes) of a kind; bool is an unsigned integer of no width.
        fn class(kind: &Kind) -> (bool, bool, usize) {
            match *kind {
                Kind::Float(n) => (true, true, n),
                Kind::Int(n) => (false, true, n),
                Kind::UInt(n) => (false, false, n),
                _ => (false, false, 0),
            }
        }
        let kind = match (class(&self.0.kind), class(&other.0.kind)) {
            ((true, _, a), (true, _, b)) => Kind::Float(a.max(b)),
            ((true, _, f), (false, _, i)) | ((false, _, i), (true, _, f)) => Kind::Float(match i {
                0 => f,
                1 => f.max(2),
                2 => f.max(4),
                _ => 8,
            }),
            ((false, sa, a), (false, sb, b)) if sa == sb => match (sa, a.max(b)) {
                (_, 0) => Kind::Bool,
                (true, n) => Kind::Int(n),
                (false, n) => Kind::UInt(n),
            },
            ((false, sa, a), (false, _, b)) => {
                let (signed, unsigned) = if sa { (a, b) } else { (b, a) };
                match (signed, unsigned) {
                    (s, u) if s > u => Kind::Int(s),
                    (_, u) if u < 8 => Kind::Int(2 * u),
                    _ => Kind::Float(8),
                }
            }
        };
        Scalar(DType {
            kind,
            big_endian: self.0.big_endian,
        })
    }

    /// Adds two values in this type's arithmetic (wrapping integers, float precision).
    pub fn add(&self, a: Num, b: Num) -> Num {
        if self.is_float() {
            let sum = a.as_f64() + b.as_f64();
            Num::Float(match self.0.kind {
                Kind::Float(4) => sum as f32 as f64,
                Kind::Float(2) => f16_from_f64(sum).to_f64(),
                _ => sum,
            })
        } else {
            let bits = 8 * self.size() as u32;
            let (a, b) = match (a, b) {
                (Num::Int(a), Num::Int(b)) => (a, b),
                (a, b) => (a.as_f64().trunc() as i128, b.as_f64().trunc() as i128),
            };
            let sum = a.wrapping_add(b) & ((1i128 << bits) - 1);
            let signed = matches!(self.0.kind, Kind::Int(_));
            Num::Int(if signed && sum >= 1i128 << (bits - 1) {
                sum - (1i128 << bits)
            } else {
                sum
            })
        }
    }
}

/// The number of elements of `ty` in `input`, which must be a whole number of them.
pub fn count(input: &[u8], ty: &Scalar) -> Result<usize, CodecError> {
    if !input.len().is_multiple_of(ty.size()) {
        return Err(CodecError::Corrupt(format!(
            "{} bytes is not a whole number of {} elements",
            input.len(),
            ty.dtype().typestr()
        )));
    }
    Ok(input.len() / ty.size())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sc(t: &str) -> Scalar {
        Scalar::parse(&json!({ "d": t }), "d").unwrap()
    }

    #[test]
    fn reads_and_writes_with_numpy_casts() {
        assert_eq!(sc("<i2").read(&(-5i16).to_le_bytes()), Num::Int(-5));
        assert_eq!(sc(">i2").read(&(-5i16).to_be_bytes()), Num::Int(-5));
        assert_eq!(sc("<u8").read(&u64::MAX.to_le_bytes()), Num::Int(u64::MAX as i128));
        let mut out = [0u8; 2];
        sc("<i2").write(Num::Float(-2.9), &mut out);
        assert_eq!(i16::from_le_bytes(out), -2, "truncation toward zero");
        sc("<i2").write(Num::Int(70000), &mut out);
        assert_eq!(i16::from_le_bytes(out), 70000i32 as i16, "integers wrap");
        let mut f = [0u8; 4];
        sc(">f4").write(Num::Float(1.5), &mut f);
        assert_eq!(f32::from_be_bytes(f), 1.5);
        assert_eq!(sc("<i1").add(Num::Int(127), Num::Int(1)), Num::Int(-128));
        assert_eq!(sc("|u1").add(Num::Int(255), Num::Int(2)), Num::Int(1));
        assert!(Scalar::parse(&json!({"d": "<U3"}), "d").is_err());
        assert!(count(&[0; 3], &sc("<i2")).is_err());
    }

    /// `numpy.result_type` of each pair (NumPy 2.3).
    #[test]
    fn promotes_as_numpy() {
        for (a, b, numpy) in [
            ("i1", "u1", "<i2"),
            ("u2", "i1", "<i4"),
            ("u8", "i8", "<f8"),
            ("i8", "f4", "<f8"),
            ("i2", "f2", "<f4"),
            ("u1", "f2", "<f2"),
            ("f2", "f4", "<f4"),
            ("i4", "u2", "<i4"),
            ("b1", "i2", "<i2"),
            ("b1", "f2", "<f2"),
            ("u4", "u1", "<u4"),
            ("b1", "b1", "|b1"),
            ("u4", "i8", "<i8"),
            ("i4", "f2", "<f8"),
            ("u8", "u1", "<u8"),
            ("b1", "u2", "<u2"),
            ("f8", "f2", "<f8"),
        ] {
            let (a, b) = (sc(&format!("<{a}")), sc(&format!("<{b}")));
            assert_eq!(a.promoted(&b).dtype().typestr(), numpy, "{a:?} {b:?}");
            assert_eq!(b.promoted(&a).dtype().typestr(), numpy, "{b:?} {a:?}");
        }
    }

    /// The float16 nearest a float64, ties to even, checked against the midpoints of
    /// neighbouring float16s (exact in float64) around every finite float16.
    #[test]
    fn float64_to_float16_rounds_once() {
        let h = |bits: u16| f64::from(half::f16::from_bits(bits));
        let to = |x: f64| f16_from_f64(x).to_bits();
        // Just past a tie, the tie, and the value through a float32 first would give.
        assert_eq!(to(1.0 + 2f64.powi(-11) + 2f64.powi(-40)), 0x3c01);
        assert_eq!(to(1.0 + 2f64.powi(-11)), 0x3c00);
        assert_eq!(to(1.0 + 3.0 * 2f64.powi(-11)), 0x3c02);
        assert_eq!(to(2049.0000001), half::f16::from_f64(2050.0).to_bits());
        assert_eq!(to(2f64.powi(-25)), 0, "a tie with zero goes to zero");
        assert_eq!(to(2f64.powi(-25) + 2f64.powi(-60)), 1);
        assert_eq!(to(-0.0), 0x8000);
        assert_eq!(to(65519.99), 0x7bff);
        assert_eq!(to(65520.0), 0x7c00);
        assert_eq!(to(-1e300), 0xfc00);
        assert!(f16_from_f64(f64::NAN).is_nan());
        for bits in (0u16..0x7bff).chain(0x8000..0xfbff) {
            let (lo, hi) = (h(bits), h(bits + 1));
            let mid = (lo + hi) / 2.0;
            let even = if bits % 2 == 0 { bits } else { bits + 1 };
            for (x, want) in [
                (mid, even),
                (mid.next_up(), if hi > lo { bits + 1 } else { bits }),
                (mid.next_down(), if hi > lo { bits } else { bits + 1 }),
                (lo, bits),
            ] {
                assert_eq!(to(x), want, "{x:e} between {lo:e} and {hi:e}");
            }
        }
    }

    /// An integer is rounded into a float32 once (through a float64, 2^53 + 1 + 2^29 would be
    /// rounded twice).
    #[test]
    fn integers_round_into_float32_once() {
        let mut f = [0u8; 4];
        let n = (1i128 << 53) + (1 << 29) + 1;
        sc("<f4").write(Num::Int(n), &mut f);
        assert_eq!(f32::from_le_bytes(f), n as f32);
        assert_ne!(n as f32, n as f64 as f32);
    }
}
