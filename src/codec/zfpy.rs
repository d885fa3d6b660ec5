//! `zfpy`: numcodecs [`ZFPY`](https://numcodecs.readthedocs.io/en/stable/compression/zfpy.html),
//! [ZFP](https://zfp.readthedocs.io/) streams as `zfpy.compress_numpy` writes them, with a full
//! header (magic, field type and dimensions, compression mode), decoded by `zfp-rs` (a Rust
//! implementation of ZFP that reads the C library's streams bit for bit).
//!
//! Like [`pcodec`](super::pcodec) it encodes typed numbers: in Zarr v2 the compressor (or a
//! filter) of the type that reaches it, in Zarr v3 `numcodecs.zfpy`, an array->bytes codec.
//! zfpy holds int32, int64 (datetimes and timedeltas too), float32 and float64 in native byte
//! order; NumPy's shape is the field's dimensions reversed, so the field's memory order is the
//! chunk's C order. The header's type must be the array's; its dimensions are checked against
//! the decode limit before anything is allocated.

use serde_json::Value;
use zfp_rs::{ZfpBitStream, ZfpFieldMut, ZfpHeaderMask, ZfpScalar, ZfpScalarType};

use super::numeric::{LittleEndian, to_le_bytes};
use super::{BytesToBytes, CodecError, numcodecs_object, optional_int};
use crate::dtype::{DType, Kind};

/// The ZFP decoder for one element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Zfpy {
    scalar: ZfpScalarType,
}

impl Zfpy {
    /// From a numcodecs dict (`{"id": "zfpy", "mode": 4, "tolerance": 0.01, ...}`; the stream's
    /// header states the mode and its parameters, so only `mode` is checked) and the type of the
    /// elements the codec encodes (whose byte order [`super::typed_codec`] checks).
    pub fn new(config: &Value, dtype: &DType) -> Result<Self, CodecError> {
        // Any mode: numcodecs writes the metadata of modes zfp lacks (their chunks cannot be
        // written, so such an array reads as its fill value, as zarr-python reads it).
        optional_int("zfpy", numcodecs_object("zfpy", config)?, "mode", i64::MIN..=i64::MAX)?;
        let scalar = match &dtype.kind {
            Kind::Int(4) => ZfpScalarType::I32,
            Kind::Int(8) | Kind::DateTime(_) | Kind::TimeDelta(_) => ZfpScalarType::I64,
            Kind::Float(4) => ZfpScalarType::F32,
            Kind::Float(8) => ZfpScalarType::F64,
            _ => return Err(CodecError::Unsupported(format!("zfpy of {} elements", dtype.typestr()))),
        };
        Ok(Self { scalar })
    }
}

impl BytesToBytes for Zfpy {
    /// zfp codes blocks of 4^d values, each dimension padded to a multiple of four (a chunk of
    /// 1 x 1024 x 1024 is coded as 4 x 1024 x 1024), and may spend twice the type's bits on a
    /// value (a rate of 64 on float32, or full precision with its block headers): twice the
    /// padded values, rounded up to a whole multiple of the chunk.
    fn expansion(&self, shape: &[u64]) -> (usize, usize) {
        let real = shape.iter().product::<u64>().max(1);
        let padded = shape
            .iter()
            .fold(1u64, |acc, &n| acc.saturating_mul(n.div_ceil(4).saturating_mul(4)));
        let factor = padded.saturating_mul(2).div_ceil(real);
        (usize::try_from(factor).unwrap_or(usize::MAX), 1)
    }

    fn decode(&self, input: &[u8], limit: usize) -> Result<Vec<u8>, CodecError> {
        match self.scalar {
            ZfpScalarType::I32 => decode_as::<i32>(input, limit),
            ZfpScalarType::I64 => decode_as::<i64>(input, limit),
            ZfpScalarType::F32 => decode_as::<f32>(input, limit),
            ZfpScalarType::F64 => decode_as::<f64>(input, limit),
        }
    }
}

fn corrupt(what: impl std::fmt::Display) -> CodecError {
    CodecError::Corrupt(format!("zfpy: {what}"))
}

/// The field of the stream, as numbers of type `T`, in little-endian bytes of at most `limit`.
fn decode_as<T: ZfpScalar + LittleEndian>(input: &[u8], limit: usize) -> Result<Vec<u8>, CodecError> {
    let mut stream = ZfpBitStream::from_bytes(input).map_err(corrupt)?;
    let header = stream.read_header(ZfpHeaderMask::FULL).map_err(corrupt)?;
    let (Some(meta), Some(config)) = (header.metadata, header.config) else {
        return Err(corrupt("the header has no field or mode"));
    };
    if meta.scalar_type != T::SCALAR_TYPE {
        return Err(corrupt(format!(
            "the stream holds {:?} numbers, the array {:?}",
            meta.scalar_type,
            T::SCALAR_TYPE
        )));
    }
    let count = meta
        .dims
        .iter()
        .filter(|&&n| n > 0)
        .try_fold(1usize, |acc, &n| acc.checked_mul(n));
    let size = std::mem::size_of::<T>();
    let count = match count {
        Some(c) if c.checked_mul(size).is_some_and(|b| b <= limit) => c,
        _ => return Err(CodecError::TooLarge { limit }),
    };
    let mut numbers = vec![T::default(); count];
    let mut field = ZfpFieldMut::new(&mut numbers, meta.dims).map_err(corrupt)?;
    stream.decompress(&config, &mut field).map_err(corrupt)?;
    Ok(to_le_bytes(&numbers))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::codec::test_vectors::vector;

    fn codec(dtype: &str) -> Zfpy {
        Zfpy::new(
            &json!({"id": "zfpy", "mode": 4}),
            &DType::from_v2(&json!(dtype)).unwrap(),
        )
        .unwrap()
    }

    fn out(name: &str) -> Vec<u8> {
        let path = format!("{}/tests/fixtures/codecs/zfpy/{name}.out", env!("CARGO_MANIFEST_DIR"));
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// Each vector decodes to exactly what numcodecs (the zfp C library) decodes from it, in
    /// every mode, type and dimensionality zfpy writes.
    #[test]
    fn decodes_as_numcodecs_does() {
        for (dtype, name) in [
            ("<f8", "f8_1d_accuracy"),
            ("<f4", "f4_3d_rate"),
            ("<i4", "i4_2d_precision"),
            ("<i8", "i8_4d_default"),
            ("<f8", "f8_2d_default"),
        ] {
            assert_eq!(
                codec(dtype).decode(&vector("zfpy", name), 1 << 20).unwrap(),
                out(name),
                "{name}"
            );
        }
        // Datetimes are stored as int64.
        assert_eq!(
            codec("<M8[ms]")
                .decode(&vector("zfpy", "i8_4d_default"), 1 << 20)
                .unwrap(),
            out("i8_4d_default")
        );
    }

    #[test]
    fn limit_is_checked_before_decoding() {
        let input = vector("zfpy", "f8_2d_default");
        assert_eq!(codec("<f8").decode(&input, 2048).unwrap().len(), 2048);
        assert_eq!(
            codec("<f8").decode(&input, 2047),
            Err(CodecError::TooLarge { limit: 2047 })
        );
    }

    #[test]
    fn corrupt_truncated_and_mistyped() {
        let input = vector("zfpy", "f8_1d_accuracy");
        for bad in [
            &input[..input.len() - 16],
            &input[..input.len() / 2],
            &input[..8],
            &b"zfp"[..],
            &[][..],
        ] {
            assert!(
                matches!(codec("<f8").decode(bad, 1 << 20), Err(CodecError::Corrupt(_))),
                "{} bytes",
                bad.len()
            );
        }
        let mut magic = input.clone();
        magic[3] = 4;
        assert!(matches!(
            codec("<f8").decode(&magic, 1 << 20),
            Err(CodecError::Corrupt(_))
        ));
        // A float64 stream read as an int64 or float32 array.
        for other in ["<i8", "<f4"] {
            assert!(
                matches!(codec(other).decode(&input, 1 << 20), Err(CodecError::Corrupt(_))),
                "{other}"
            );
        }
    }

    #[test]
    fn types_and_options() {
        for dtype in ["<f2", "<u4", "|i1", "<c8", ">f4", ">i8"] {
            let dtype = DType::from_v2(&json!(dtype)).unwrap();
            assert!(matches!(
                crate::codec::typed_codec("zfpy", &json!({}), Some(&dtype)),
                Err(CodecError::Unsupported(_))
            ));
        }
        // Big-endian datetimes are int64 numbers to numcodecs.
        for dtype in [">M8[s]", ">m8[ms]"] {
            let dtype = DType::from_v2(&json!(dtype)).unwrap();
            assert_eq!(Zfpy::new(&json!({}), &dtype).unwrap().scalar, ZfpScalarType::I64);
            assert!(crate::codec::typed_codec("zfpy", &json!({}), Some(&dtype)).is_ok());
        }
        let f4 = DType::from_v2(&json!("<f4")).unwrap();
        assert!(Zfpy::new(&json!({"mode": 6}), &f4).is_ok());
        for config in [json!({"id": "pcodec"}), json!({"mode": "rate"})] {
            assert!(
                matches!(Zfpy::new(&config, &f4), Err(CodecError::Config(_))),
                "{config}"
            );
        }
        let numcodecs = json!({"id": "zfpy", "mode": 4, "compression_kwargs": {"tolerance": -1},
            "tolerance": -1, "rate": -1, "precision": -1});
        assert!(Zfpy::new(&numcodecs, &f4).is_ok());
    }
}
