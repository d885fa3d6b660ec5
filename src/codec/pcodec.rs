//! `pcodec`: numcodecs [`PCodec`](https://numcodecs.readthedocs.io/en/stable/compression/pcodec.html),
//! the [pco](https://github.com/pcodec/pcodec) standalone format of numbers, decoded by the `pco`
//! crate (the format's own implementation; its Python package wraps the same code).
//!
//! In Zarr v2 it is the compressor (or a filter) and encodes the elements of the type that
//! reaches it; in Zarr v3 zarr-python writes it as `numcodecs.pcodec`, an array->bytes codec in
//! place of `bytes`. Either way it decodes to the little-endian elements of that type: numcodecs
//! encodes native-order NumPy arrays only, and stores datetimes and timedeltas as int64.
//!
//! A stored file is a header, then chunks that each state their number type and count, then a
//! termination byte. Each chunk's count is checked against the decode limit before its numbers
//! are allocated; a chunk of another number type than the array's is corrupt data.

use pco::data_types::Number;
use pco::standalone::{DecompressorItem, FileDecompressor};
use serde_json::Value;

use super::numeric::{LittleEndian, to_le_bytes};
use super::{BytesToBytes, CodecError, numcodecs_object, optional_int};
use crate::dtype::{DType, Kind};

/// The pco decoder for one element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pcodec {
    numbers: Numbers,
}

/// The number types pco stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Numbers {
    U8,
    U16,
    U32,
    U64,
    I8,
    I16,
    I32,
    I64,
    F16,
    F32,
    F64,
}

impl Pcodec {
    /// From a numcodecs dict (`{"id": "pcodec", "level": 8, "mode_spec": "auto", ...}`; only
    /// `level` is checked, the other options steer the encoder alone) and the type of the
    /// elements the codec encodes (whose byte order [`super::typed_codec`] checks).
    pub fn new(config: &Value, dtype: &DType) -> Result<Self, CodecError> {
        optional_int("pcodec", numcodecs_object("pcodec", config)?, "level", 0..=12)?;
        let numbers = match &dtype.kind {
            Kind::UInt(1) => Numbers::U8,
            Kind::UInt(2) => Numbers::U16,
            Kind::UInt(4) => Numbers::U32,
            Kind::UInt(8) => Numbers::U64,
            Kind::Int(1) => Numbers::I8,
            Kind::Int(2) => Numbers::I16,
            Kind::Int(4) => Numbers::I32,
            Kind::Int(8) | Kind::DateTime(_) | Kind::TimeDelta(_) => Numbers::I64,
            Kind::Float(2) => Numbers::F16,
            Kind::Float(4) => Numbers::F32,
            Kind::Float(8) => Numbers::F64,
            _ => {
                return Err(CodecError::Unsupported(format!(
                    "pcodec of {} elements",
                    dtype.typestr()
                )));
            }
        };
        Ok(Self { numbers })
    }
}

impl BytesToBytes for Pcodec {
    fn decode(&self, input: &[u8], limit: usize) -> Result<Vec<u8>, CodecError> {
        match self.numbers {
            Numbers::U8 => decode_as::<u8>(input, limit),
            Numbers::U16 => decode_as::<u16>(input, limit),
            Numbers::U32 => decode_as::<u32>(input, limit),
            Numbers::U64 => decode_as::<u64>(input, limit),
            Numbers::I8 => decode_as::<i8>(input, limit),
            Numbers::I16 => decode_as::<i16>(input, limit),
            Numbers::I32 => decode_as::<i32>(input, limit),
            Numbers::I64 => decode_as::<i64>(input, limit),
            Numbers::F16 => decode_as::<half::f16>(input, limit),
            Numbers::F32 => decode_as::<f32>(input, limit),
            Numbers::F64 => decode_as::<f64>(input, limit),
        }
    }
}

fn corrupt(e: pco::errors::PcoError) -> CodecError {
    CodecError::Corrupt(format!("pcodec: {e}"))
}

/// Every chunk of the file, as numbers of type `T`, in little-endian bytes of at most `limit`.
fn decode_as<T: Number + LittleEndian>(input: &[u8], limit: usize) -> Result<Vec<u8>, CodecError> {
    let (file, mut src) = FileDecompressor::new(input).map_err(corrupt)?;
    let room = limit / std::mem::size_of::<T>();
    let mut numbers: Vec<T> = Vec::new();
    loop {
        match file.chunk_decompressor::<T, &[u8]>(src).map_err(corrupt)? {
            // Bytes after the end are ignored, as numcodecs ignores them.
            DecompressorItem::EndOfData(_) => break,
            DecompressorItem::Chunk(mut chunk) => {
                let n = chunk.n();
                if n > room - numbers.len() {
                    return Err(CodecError::TooLarge { limit });
                }
                let start = numbers.len();
                numbers.resize(start + n, T::default());
                let progress = chunk.read(&mut numbers[start..]).map_err(corrupt)?;
                if progress.n_processed != n || !progress.finished {
                    return Err(CodecError::Corrupt(format!(
                        "pcodec: a chunk of {n} numbers decoded {}",
                        progress.n_processed
                    )));
                }
                src = chunk.into_src();
            }
        }
    }
    Ok(to_le_bytes(&numbers))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::codec::test_vectors::{expected, vector};

    fn codec(dtype: &str) -> Pcodec {
        Pcodec::new(
            &json!({"id": "pcodec", "level": 8}),
            &DType::from_v2(&json!(dtype)).unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn decodes_numcodecs_vectors() {
        for name in ["u4_default", "u4_classic_lookback_pages"] {
            assert_eq!(
                codec("<u4").decode(&vector("pcodec", name), 1 << 20).unwrap(),
                expected(),
                "{name}"
            );
        }
        // Other types: each vector's numbers are `expected()`'s u32 values as that type
        // (f16/f32/f64 divided by 8, i2/i8 minus 400), written by numcodecs from NumPy arrays.
        let values: Vec<u32> = expected()
            .chunks(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let cases: [(&str, &str, Vec<u8>); 6] = [
            (
                "<u2",
                "u2",
                values.iter().flat_map(|&v| (v as u16).to_le_bytes()).collect(),
            ),
            (
                "<i2",
                "i2",
                values.iter().flat_map(|&v| (v as i16 - 400).to_le_bytes()).collect(),
            ),
            (
                "<i8",
                "i8",
                values.iter().flat_map(|&v| (v as i64 - 400).to_le_bytes()).collect(),
            ),
            (
                "<f2",
                "f2",
                values
                    .iter()
                    .flat_map(|&v| half::f16::from_f32(v as f32 / 8.0).to_le_bytes())
                    .collect(),
            ),
            (
                "<f4",
                "f4",
                values.iter().flat_map(|&v| (v as f32 / 8.0).to_le_bytes()).collect(),
            ),
            (
                "<f8",
                "f8",
                values.iter().flat_map(|&v| (v as f64 / 8.0).to_le_bytes()).collect(),
            ),
        ];
        for (dtype, name, want) in cases {
            assert_eq!(
                codec(dtype).decode(&vector("pcodec", name), 1 << 20).unwrap(),
                want,
                "{name}"
            );
        }
        // Datetimes are stored as int64.
        assert_eq!(
            codec("<M8[s]").decode(&vector("pcodec", "i8"), 1 << 20).unwrap(),
            codec("<i8").decode(&vector("pcodec", "i8"), 1 << 20).unwrap()
        );
    }

    #[test]
    fn limit_is_checked_before_decoding() {
        let input = vector("pcodec", "u4_default");
        assert_eq!(codec("<u4").decode(&input, 1024).unwrap().len(), 1024);
        assert_eq!(
            codec("<u4").decode(&input, 1023),
            Err(CodecError::TooLarge { limit: 1023 })
        );
    }

    #[test]
    fn corrupt_truncated_and_mistyped() {
        let input = vector("pcodec", "u4_default");
        for bad in [
            &input[..input.len() - 1],
            &input[..input.len() / 2],
            &input[..4],
            &b"pco!"[..],
            &[][..],
        ] {
            assert!(
                matches!(codec("<u4").decode(bad, 1 << 20), Err(CodecError::Corrupt(_))),
                "{bad:?}"
            );
        }
        // Bytes after the end are ignored, as numcodecs ignores them.
        let mut trailing = input.clone();
        trailing.extend(b"junk");
        assert_eq!(codec("<u4").decode(&trailing, 1 << 20).unwrap(), expected());
        // A file of u32 read as an int32 or float32 array.
        for other in ["<i4", "<f4"] {
            assert!(
                matches!(codec(other).decode(&input, 1 << 20), Err(CodecError::Corrupt(_))),
                "{other}"
            );
        }
    }

    #[test]
    fn types_and_options() {
        for dtype in ["|b1", "<c8", "|S4", ">i4", ">f8"] {
            let dtype = DType::from_v2(&json!(dtype)).unwrap();
            assert!(matches!(
                crate::codec::typed_codec("pcodec", &json!({}), Some(&dtype)),
                Err(CodecError::Unsupported(_))
            ));
        }
        let i4 = DType::from_v2(&json!("<i4")).unwrap();
        for config in [json!({"level": 13}), json!({"id": "zstd"}), json!({"level": "high"})] {
            assert!(
                matches!(Pcodec::new(&config, &i4), Err(CodecError::Config(_))),
                "{config}"
            );
        }
        assert!(
            Pcodec::new(
                &json!({"id": "pcodec", "mode_spec": "classic", "delta_spec": "none"}),
                &i4
            )
            .is_ok()
        );
        // Big-endian datetimes are int64 numbers to numcodecs.
        for dtype in [">M8[s]", ">m8[ms]"] {
            let dtype = DType::from_v2(&json!(dtype)).unwrap();
            assert_eq!(Pcodec::new(&json!({}), &dtype).unwrap().numbers, Numbers::I64);
            assert!(crate::codec::typed_codec("pcodec", &json!({}), Some(&dtype)).is_ok());
        }
        // One-byte types have no byte order.
        let u1 = DType::from_v2(&json!(">u1")).unwrap();
        assert!(crate::codec::typed_codec("pcodec", &json!({}), Some(&u1)).is_ok());
    }
}
