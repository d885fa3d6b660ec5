//! `blosc`: a c-blosc 1.x buffer ([format](https://github.com/Blosc/c-blosc/blob/main/README_HEADER.rst)).
//!
//! Zarr v3 [`blosc` codec](https://zarr-specs.readthedocs.io/en/latest/v3/codecs/blosc/index.html)
//! and numcodecs [`blosc`](https://numcodecs.readthedocs.io/en/stable/compression/blosc.html). The
//! buffer is self-describing: a 16-byte header (format version, flags for byte shuffle, bit
//! shuffle and memcpy, typesize, `nbytes`, `blocksize`, `cbytes`) then the blocks, each compressed
//! with blosclz, lz4 (lz4hc writes lz4), zlib or zstd. So decoding needs no configuration; it is
//! only checked. The C library (`blosc-src`, built from source) does the work on this thread.

use std::ffi::c_void;

use serde_json::Value;

use super::{BytesToBytes, CodecError, config_object, numcodecs_object, optional_int, optional_str};

/// `BLOSC_MIN_HEADER_LENGTH`: the header every buffer starts with.
const HEADER_LEN: usize = 16;
/// `BLOSC_VERSION_FORMAT` of c-blosc 1.x; Blosc2 chunks start with 3 or more.
const FORMAT_VERSION: u8 = 2;
/// The compressors this build decodes.
const CNAMES: &[&str] = &["blosclz", "lz4", "lz4hc", "zlib", "zstd"];

/// How the writer shuffled bytes before compressing (recorded again in each buffer's header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BloscShuffle {
    /// No shuffle (v2 `0`, v3 `"noshuffle"`).
    NoShuffle,
    /// Byte shuffle (v2 `1`, v3 `"shuffle"`).
    Shuffle,
    /// Bit shuffle (v2 `2`, v3 `"bitshuffle"`).
    BitShuffle,
    /// numcodecs `-1`: bit shuffle for 1-byte items, byte shuffle otherwise.
    Auto,
}

/// The blosc decoder, with the writer's settings as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blosc {
    /// Compressor name; `None` when the configuration has none.
    pub cname: Option<String>,
    /// The shuffle the writer was configured with.
    pub shuffle: BloscShuffle,
}

fn check_cname(cname: Option<&str>) -> Result<Option<String>, CodecError> {
    match cname {
        None => Ok(None),
        Some(c) if CNAMES.contains(&c) => Ok(Some(c.to_string())),
        Some("snappy") => Err(CodecError::Unsupported("blosc cname snappy".to_string())),
        Some(c) => Err(CodecError::Config(format!("blosc: unknown cname {c:?}"))),
    }
}

impl Blosc {
    /// From a numcodecs dict: `{"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1,
    /// "blocksize": 0}`, every key optional. `cname` is one of blosclz, lz4, lz4hc, zlib, zstd
    /// (snappy is [`CodecError::Unsupported`]); `shuffle` is -1 (auto), 0, 1 or 2 (bit shuffle).
    pub fn from_v2(config: &Value) -> Result<Self, CodecError> {
        let options = numcodecs_object("blosc", config)?;
        let cname = check_cname(optional_str("blosc", options, "cname")?)?;
        optional_int("blosc", options, "clevel", 0..=9)?;
        optional_int("blosc", options, "blocksize", 0..=i64::from(i32::MAX))?;
        optional_int("blosc", options, "typesize", 1..=i64::from(u32::MAX))?;
        let shuffle = match optional_int("blosc", options, "shuffle", -1..=2)? {
            Some(-1) => BloscShuffle::Auto,
            Some(0) => BloscShuffle::NoShuffle,
            Some(2) => BloscShuffle::BitShuffle,
            _ => BloscShuffle::Shuffle,
        };
        Ok(Self { cname, shuffle })
    }

    /// From a v3 configuration: `{"cname": "zstd", "clevel": 5, "shuffle": "shuffle", "typesize": 4,
    /// "blocksize": 0}`, every key optional. `shuffle` is noshuffle, shuffle or bitshuffle.
    pub fn from_v3(configuration: Option<&Value>) -> Result<Self, CodecError> {
        let options = config_object("blosc", configuration)?;
        let cname = check_cname(optional_str("blosc", options, "cname")?)?;
        optional_int("blosc", options, "clevel", 0..=9)?;
        optional_int("blosc", options, "blocksize", 0..=i64::from(i32::MAX))?;
        optional_int("blosc", options, "typesize", 1..=i64::from(u32::MAX))?;
        let shuffle = match optional_str("blosc", options, "shuffle")? {
            None | Some("noshuffle") => BloscShuffle::NoShuffle,
            Some("shuffle") => BloscShuffle::Shuffle,
            Some("bitshuffle") => BloscShuffle::BitShuffle,
            Some(other) => return Err(CodecError::Config(format!("blosc: unknown shuffle {other:?}"))),
        };
        Ok(Self { cname, shuffle })
    }
}

impl BytesToBytes for Blosc {
    fn decode(&self, input: &[u8], limit: usize) -> Result<Vec<u8>, CodecError> {
        if input.len() < HEADER_LEN {
            return Err(CodecError::Corrupt(format!(
                "blosc: {} bytes, shorter than the header",
                input.len()
            )));
        }
        match input[0] {
            FORMAT_VERSION => {}
            3..=5 => return Err(CodecError::Unsupported(format!("blosc2 chunk format {}", input[0]))),
            v => return Err(CodecError::Corrupt(format!("blosc: unknown format version {v}"))),
        }
        let (mut nbytes, mut cbytes, mut blocksize) = (0usize, 0usize, 0usize);
        // SAFETY: `input` holds at least the 16 header bytes, the only bytes this reads.
        unsafe { blosc_src::blosc_cbuffer_sizes(input.as_ptr().cast(), &mut nbytes, &mut cbytes, &mut blocksize) };
        if nbytes > limit {
            return Err(CodecError::TooLarge { limit });
        }
        // numcodecs hands blosc a pointer and ignores bytes past `cbytes`; so does this.
        let Some(buffer) = input.get(..cbytes) else {
            return Err(CodecError::Corrupt(format!(
                "blosc: header says {cbytes} bytes, {} stored",
                input.len()
            )));
        };
        let mut validated = 0usize;
        // SAFETY: reads at most `buffer.len()` bytes of `buffer`.
        if unsafe { blosc_src::blosc_cbuffer_validate(buffer.as_ptr().cast(), buffer.len(), &mut validated) } != 0
            || validated != nbytes
        {
            return Err(CodecError::Corrupt("blosc: invalid header".to_string()));
        }
        if nbytes == 0 {
            return Ok(Vec::new());
        }
        let mut out = crate::buffers::DECODED.take(nbytes);
        // SAFETY: the header was validated against `buffer.len()`, so blosc reads only `buffer`
        // (its block offsets are bounds-checked against the header's cbytes); it writes at most
        // `nbytes` bytes into `out`, which has room for them. One internal thread: no global
        // state, safe to call concurrently.
        let written = unsafe {
            blosc_src::blosc_decompress_ctx(buffer.as_ptr().cast(), out.as_mut_ptr().cast::<c_void>(), nbytes, 1)
        };
        if usize::try_from(written).ok() != Some(nbytes) {
            return Err(CodecError::Corrupt(format!("blosc: decompression failed ({written})")));
        }
        // SAFETY: blosc reported writing all `nbytes` bytes, within the capacity.
        unsafe { out.set_len(nbytes) };
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::CString;

    use serde_json::json;

    use super::*;
    use crate::codec::test_vectors::{BOMB_LEN, BOMB_LIMIT, expected, vector};

    fn any() -> Blosc {
        Blosc {
            cname: None,
            shuffle: BloscShuffle::NoShuffle,
        }
    }

    /// Compresses with the same C library (for inputs numcodecs vectors do not cover).
    fn compress(data: &[u8], cname: &str, shuffle: i32, typesize: usize) -> Vec<u8> {
        let mut out = vec![0u8; data.len() + HEADER_LEN];
        let cname = CString::new(cname).unwrap();
        let n = unsafe {
            blosc_src::blosc_compress_ctx(
                5,
                shuffle,
                typesize,
                data.len(),
                data.as_ptr().cast(),
                out.as_mut_ptr().cast(),
                out.len(),
                cname.as_ptr(),
                0,
                1,
            )
        };
        assert!(n > 0);
        out.truncate(n as usize);
        out
    }

    #[test]
    fn decodes_numcodecs_vectors() {
        let expected = expected();
        for cname in CNAMES {
            for shuffle in ["noshuffle", "shuffle", "bitshuffle"] {
                let name = format!("{cname}_{shuffle}");
                assert_eq!(
                    any().decode(&vector("blosc", &name), 1 << 20).unwrap(),
                    expected,
                    "{name}"
                );
            }
        }
        let memcpyed = vector("blosc", "random_memcpyed");
        assert_eq!(memcpyed[2] & 0x02, 0x02);
        assert_eq!(any().decode(&memcpyed, 1 << 20).unwrap(), vector("blosc", "random"));
    }

    #[test]
    fn limit_is_checked_against_the_header() {
        let input = vector("blosc", "lz4_shuffle");
        let n = expected().len();
        assert_eq!(any().decode(&input, n).unwrap().len(), n);
        assert_eq!(any().decode(&input, n - 1), Err(CodecError::TooLarge { limit: n - 1 }));
        // A header that claims 4 GiB is refused before anything is allocated.
        let mut lying = input.clone();
        lying[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            any().decode(&lying, 1 << 20),
            Err(CodecError::TooLarge { limit: 1 << 20 })
        );
    }

    #[test]
    fn empty_buffer_and_trailing_bytes() {
        let empty = compress(&[], "lz4", 1, 4);
        assert_eq!(any().decode(&empty, 0).unwrap(), Vec::<u8>::new());
        let mut padded = vector("blosc", "zstd_bitshuffle");
        padded.extend_from_slice(&[0xaa; 7]);
        assert_eq!(any().decode(&padded, 1 << 20).unwrap(), expected());
    }

    #[test]
    fn corrupt_and_truncated() {
        let input = vector("blosc", "zstd_shuffle");
        for bad in [&input[..input.len() - 1], &input[..HEADER_LEN], &input[..3], &[][..]] {
            assert!(
                matches!(any().decode(bad, 1 << 20), Err(CodecError::Corrupt(_))),
                "{bad:?}"
            );
        }
        // Scrambled block data: blosc must fail cleanly (or, if a byte flip is still decodable,
        // return exactly nbytes), never read or write out of bounds.
        for i in HEADER_LEN..input.len() {
            let mut flipped = input.clone();
            flipped[i] ^= 0x5a;
            match any().decode(&flipped, 1 << 20) {
                Ok(out) => assert_eq!(out.len(), expected().len()),
                Err(e) => assert!(matches!(e, CodecError::Corrupt(_)), "{e}"),
            }
        }
        let mut blosc2 = input.clone();
        blosc2[0] = 3;
        assert!(matches!(
            any().decode(&blosc2, 1 << 20),
            Err(CodecError::Unsupported(_))
        ));
    }

    #[test]
    fn bomb_is_too_large() {
        for cname in CNAMES {
            let bomb = compress(&vec![0u8; BOMB_LEN], cname, 1, 4);
            assert!(bomb.len() < BOMB_LEN / 100, "{cname}");
            assert_eq!(
                any().decode(&bomb, BOMB_LIMIT),
                Err(CodecError::TooLarge { limit: BOMB_LIMIT })
            );
        }
    }

    #[test]
    fn config() {
        let v2 = Blosc::from_v2(&json!({ "id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1, "blocksize": 0 }));
        assert_eq!(
            v2,
            Ok(Blosc {
                cname: Some("lz4".to_string()),
                shuffle: BloscShuffle::Shuffle
            })
        );
        assert_eq!(
            Blosc::from_v2(&json!({ "id": "blosc", "shuffle": -1 }))
                .unwrap()
                .shuffle,
            BloscShuffle::Auto
        );
        assert_eq!(
            Blosc::from_v2(&json!({ "id": "blosc", "shuffle": 2 })).unwrap().shuffle,
            BloscShuffle::BitShuffle
        );
        let v3 = json!({ "cname": "zstd", "clevel": 1, "shuffle": "bitshuffle", "typesize": 8, "blocksize": 0 });
        assert_eq!(
            Blosc::from_v3(Some(&v3)),
            Ok(Blosc {
                cname: Some("zstd".to_string()),
                shuffle: BloscShuffle::BitShuffle
            })
        );
        assert_eq!(
            Blosc::from_v3(Some(&json!({ "shuffle": "noshuffle" })))
                .unwrap()
                .shuffle,
            BloscShuffle::NoShuffle
        );

        for bad in [
            json!({ "id": "blosc", "cname": "lzma" }),
            json!({ "id": "blosc", "shuffle": 3 }),
            json!({ "id": "blosc", "clevel": 10 }),
            json!({ "id": "blosc", "blocksize": -1 }),
        ] {
            assert!(matches!(Blosc::from_v2(&bad), Err(CodecError::Config(_))), "{bad}");
        }
        for bad in [
            json!({ "shuffle": 1 }),
            json!({ "shuffle": "byteshuffle" }),
            json!({ "typesize": 0 }),
        ] {
            assert!(
                matches!(Blosc::from_v3(Some(&bad)), Err(CodecError::Config(_))),
                "{bad}"
            );
        }
        let snappy = json!({ "id": "blosc", "cname": "snappy" });
        assert!(matches!(Blosc::from_v2(&snappy), Err(CodecError::Unsupported(_))));
    }
}
