//! numcodecs' 32-bit checksums: `crc32`, `adler32`, `fletcher32` and `jenkins_lookup3`.
//!
//! [numcodecs checksum32](https://numcodecs.readthedocs.io/en/stable/checksum32.html) (v2 ids;
//! v3 names `numcodecs.<id>`, see the
//! [zarr-extensions](https://github.com/zarr-developers/zarr-extensions/tree/main/codecs)): the
//! data with a little-endian 32-bit checksum of it before or after. `crc32` (zlib's CRC-32) and
//! `adler32` put it first by default and take `location: "start" | "end"`; `fletcher32` (HDF5's
//! Fletcher-32 over big-endian 16-bit words) and `jenkins_lookup3` (Bob Jenkins' lookup3
//! `hashlittle` as HDF5 uses it, seeded with `initval`, over `prefix` followed by the data) always
//! put it last. Decoding checks the checksum and drops it. `codec::crc32c` frames its
//! checksum the same way.

use serde_json::Value;

use super::{BytesToBytes, CodecError, numcodecs_object, optional_int, optional_str};

/// The checksum length.
const CHECKSUM_LEN: usize = 4;

/// Where the checksum sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChecksumLocation {
    /// Before the data (numcodecs `location: "start"`).
    Start,
    /// After the data.
    End,
}

impl ChecksumLocation {
    /// The optional numcodecs `location` option of `codec`, `default` when absent.
    pub(crate) fn from_v2(codec: &str, config: &Value, default: Self) -> Result<Self, CodecError> {
        match optional_str(codec, numcodecs_object(codec, config)?, "location")? {
            None => Ok(default),
            Some("start") => Ok(Self::Start),
            Some("end") => Ok(Self::End),
            Some(other) => Err(CodecError::Config(format!("{codec}: unknown location {other:?}"))),
        }
    }
}

/// The data of `input` once its checksum (at `location`) equals `checksum` of the data: a copy
/// of at most `limit` bytes. A short input or a mismatch is corrupt.
pub(crate) fn verified(
    codec: &str,
    input: &[u8],
    location: ChecksumLocation,
    limit: usize,
    checksum: impl FnOnce(&[u8]) -> u32,
) -> Result<Vec<u8>, CodecError> {
    let split = match location {
        ChecksumLocation::Start => input.split_first_chunk::<CHECKSUM_LEN>().map(|(c, d)| (d, *c)),
        ChecksumLocation::End => input.split_last_chunk::<CHECKSUM_LEN>().map(|(d, c)| (d, *c)),
    };
    let Some((data, stored)) = split else {
        return Err(CodecError::Corrupt(format!(
            "{codec}: {} bytes, shorter than the checksum",
            input.len()
        )));
    };
    if data.len() > limit {
        return Err(CodecError::TooLarge { limit });
    }
    let stored = u32::from_le_bytes(stored);
    let computed = checksum(data);
    if stored != computed {
        return Err(CodecError::Corrupt(format!(
            "{codec}: stored {stored:#010x}, computed {computed:#010x}"
        )));
    }
    Ok(data.to_vec())
}

/// Which checksum.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Algorithm {
    /// zlib's CRC-32.
    Crc32,
    /// zlib's Adler-32.
    Adler32,
    /// HDF5's Fletcher-32.
    Fletcher32,
    /// Jenkins' lookup3 with a seed, over `prefix` and then the data.
    JenkinsLookup3 {
        /// The seed.
        initval: u32,
        /// Bytes hashed before the data (not stored with it).
        prefix: Vec<u8>,
    },
}

/// One of numcodecs' checksum codecs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checksum32 {
    /// The checksum.
    pub algorithm: Algorithm,
    /// Where it sits.
    pub location: ChecksumLocation,
}

impl Checksum32 {
    /// From a numcodecs dict (or a v3 `numcodecs.<id>` configuration) of codec `id`; `None` when
    /// `id` is no checksum of this module.
    pub fn from_v2(id: &str, config: &Value) -> Result<Option<Self>, CodecError> {
        let (algorithm, location) = match id {
            "crc32" => (
                Algorithm::Crc32,
                ChecksumLocation::from_v2(id, config, ChecksumLocation::Start)?,
            ),
            "adler32" => (
                Algorithm::Adler32,
                ChecksumLocation::from_v2(id, config, ChecksumLocation::Start)?,
            ),
            "fletcher32" => {
                numcodecs_object(id, config)?;
                (Algorithm::Fletcher32, ChecksumLocation::End)
            }
            "jenkins_lookup3" => {
                let options = numcodecs_object(id, config)?;
                let initval = optional_int(id, options, "initval", 0..=i64::from(u32::MAX))?.unwrap_or(0);
                let prefix = match options.and_then(|m| m.get("prefix")) {
                    None | Some(Value::Null) => Vec::new(),
                    Some(Value::Array(items)) => items
                        .iter()
                        .map(|v| v.as_u64().and_then(|b| u8::try_from(b).ok()))
                        .collect::<Option<Vec<u8>>>()
                        .ok_or_else(|| CodecError::Config(format!("{id}: prefix must be a list of bytes (0-255)")))?,
                    Some(other) => {
                        return Err(CodecError::Config(format!(
                            "{id}: prefix must be a list of bytes, not {other}"
                        )));
                    }
                };
                (
                    Algorithm::JenkinsLookup3 {
                        initval: u32::try_from(initval).unwrap_or(0),
                        prefix,
                    },
                    ChecksumLocation::End,
                )
            }
            _ => return Ok(None),
        };
        Ok(Some(Self { algorithm, location }))
    }

    /// The codec id.
    fn id(&self) -> &'static str {
        match self.algorithm {
            Algorithm::Crc32 => "crc32",
            Algorithm::Adler32 => "adler32",
            Algorithm::Fletcher32 => "fletcher32",
            Algorithm::JenkinsLookup3 { .. } => "jenkins_lookup3",
        }
    }

    /// The checksum of `data`.
    fn checksum(&self, data: &[u8]) -> u32 {
        match &self.algorithm {
            Algorithm::Crc32 => crc32fast::hash(data),
            Algorithm::Adler32 => {
                let mut a = adler2::Adler32::new();
                a.write_slice(data);
                a.checksum()
            }
            Algorithm::Fletcher32 => fletcher32(data),
            Algorithm::JenkinsLookup3 { initval, prefix } if prefix.is_empty() => lookup3(data, *initval),
            Algorithm::JenkinsLookup3 { initval, prefix } => lookup3(&[prefix.as_slice(), data].concat(), *initval),
        }
    }
}

impl BytesToBytes for Checksum32 {
    fn decode(&self, input: &[u8], limit: usize) -> Result<Vec<u8>, CodecError> {
        verified(self.id(), input, self.location, limit, |data| self.checksum(data))
    }
}

/// HDF5's Fletcher-32: two 16-bit running sums over the data as big-endian 16-bit words (an odd
/// last byte is the high byte of a word), folded every 360 words (720 bytes) so that they cannot overflow.
fn fletcher32(data: &[u8]) -> u32 {
    let fold = |x: u32| (x & 0xffff) + (x >> 16);
    let (mut sum1, mut sum2) = (0u32, 0u32);
    let (words, rest) = data.split_at(data.len() / 2 * 2);
    for block in words.chunks(720) {
        for w in block.chunks_exact(2) {
            sum1 += u32::from(u16::from_be_bytes([w[0], w[1]]));
            sum2 += sum1;
        }
        sum1 = fold(sum1);
        sum2 = fold(sum2);
    }
    if let [last] = rest {
        sum1 += u32::from(*last) << 8;
        sum2 += sum1;
        sum1 = fold(sum1);
        sum2 = fold(sum2);
    }
    (fold(sum2) << 16) | fold(sum1)
}

/// Bob Jenkins' lookup3 `hashlittle` (public domain), byte by byte as HDF5 computes it: the
/// data in 12-byte blocks of three little-endian words, the last block (1 to 12 bytes) padded
/// with zeros; empty data hashes to the initial value.
fn lookup3(data: &[u8], initval: u32) -> u32 {
    fn mix(a: &mut u32, b: &mut u32, c: &mut u32) {
        *a = a.wrapping_sub(*c) ^ c.rotate_left(4);
        *c = c.wrapping_add(*b);
        *b = b.wrapping_sub(*a) ^ a.rotate_left(6);
        *a = a.wrapping_add(*c);
        *c = c.wrapping_sub(*b) ^ b.rotate_left(8);
        *b = b.wrapping_add(*a);
        *a = a.wrapping_sub(*c) ^ c.rotate_left(16);
        *c = c.wrapping_add(*b);
        *b = b.wrapping_sub(*a) ^ a.rotate_left(19);
        *a = a.wrapping_add(*c);
        *c = c.wrapping_sub(*b) ^ b.rotate_left(4);
        *b = b.wrapping_add(*a);
    }
    fn finish(a: &mut u32, b: &mut u32, c: &mut u32) {
        *c = (*c ^ *b).wrapping_sub(b.rotate_left(14));
        *a = (*a ^ *c).wrapping_sub(c.rotate_left(11));
        *b = (*b ^ *a).wrapping_sub(a.rotate_left(25));
        *c = (*c ^ *b).wrapping_sub(b.rotate_left(16));
        *a = (*a ^ *c).wrapping_sub(c.rotate_left(4));
        *b = (*b ^ *a).wrapping_sub(a.rotate_left(14));
        *c = (*c ^ *b).wrapping_sub(b.rotate_left(24));
    }
    let word = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let init = 0xdead_beef_u32.wrapping_add(data.len() as u32).wrapping_add(initval);
    let (mut a, mut b, mut c) = (init, init, init);
    if data.is_empty() {
        return c;
    }
    // Every block but the last (which may be whole) is mixed.
    let last_start = (data.len() - 1) / 12 * 12;
    for block in data[..last_start].chunks_exact(12) {
        a = a.wrapping_add(word(&block[0..4]));
        b = b.wrapping_add(word(&block[4..8]));
        c = c.wrapping_add(word(&block[8..12]));
        mix(&mut a, &mut b, &mut c);
    }
    let mut last = [0u8; 12];
    last[..data.len() - last_start].copy_from_slice(&data[last_start..]);
    a = a.wrapping_add(word(&last[0..4]));
    b = b.wrapping_add(word(&last[4..8]));
    c = c.wrapping_add(word(&last[8..12]));
    finish(&mut a, &mut b, &mut c);
    c
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::codec::test_vectors::{expected, vector};

    fn codec(id: &str, config: Value) -> Checksum32 {
        Checksum32::from_v2(id, &config).unwrap().unwrap()
    }

    /// Every vector numcodecs wrote, with the configuration that wrote it.
    fn vectors() -> Vec<(Checksum32, Vec<u8>, Vec<u8>)> {
        let data = expected();
        let odd = data[..1001].to_vec();
        vec![
            (
                codec("crc32", json!({ "id": "crc32" })),
                vector("crc32", "start"),
                data.clone(),
            ),
            (
                codec("crc32", json!({ "location": "end" })),
                vector("crc32", "end"),
                data.clone(),
            ),
            (
                codec("adler32", json!({ "id": "adler32", "location": null })),
                vector("adler32", "start"),
                data.clone(),
            ),
            (
                codec("adler32", json!({ "location": "end" })),
                vector("adler32", "end"),
                data.clone(),
            ),
            (
                codec("fletcher32", json!({ "id": "fletcher32" })),
                vector("fletcher32", "input"),
                data.clone(),
            ),
            (codec("fletcher32", json!({})), vector("fletcher32", "odd"), odd.clone()),
            (
                codec(
                    "jenkins_lookup3",
                    json!({ "id": "jenkins_lookup3", "initval": 0, "prefix": null }),
                ),
                vector("jenkins_lookup3", "initval0"),
                data.clone(),
            ),
            (
                codec(
                    "jenkins_lookup3",
                    json!({ "initval": 42, "prefix": [122, 97, 114, 114] }),
                ),
                vector("jenkins_lookup3", "initval42_prefix"),
                data.clone(),
            ),
            (
                codec("jenkins_lookup3", json!({})),
                vector("jenkins_lookup3", "odd"),
                odd,
            ),
        ]
    }

    #[test]
    fn decodes_numcodecs_vectors() {
        for (codec, input, want) in vectors() {
            assert_eq!(codec.decode(&input, 1 << 20).unwrap(), want, "{codec:?}");
            assert_eq!(codec.decode(&input, want.len()).unwrap(), want, "{codec:?}");
            assert_eq!(
                codec.decode(&input, want.len() - 1),
                Err(CodecError::TooLarge { limit: want.len() - 1 }),
                "{codec:?}"
            );
        }
    }

    #[test]
    fn known_values() {
        // Check values of the standard test string, and lookup3's of the empty input.
        assert_eq!(crc32fast::hash(b"123456789"), 0xcbf4_3926);
        let mut adler = adler2::Adler32::new();
        adler.write_slice(b"Wikipedia");
        assert_eq!(adler.checksum(), 0x11e6_0398);
        assert_eq!(lookup3(b"", 0), 0xdead_beef);
        assert_eq!(lookup3(b"", 0xdead_beef), 0xbd5b_7dde);
        assert_eq!(lookup3(b"Four score and seven years ago", 0), 0x1777_0551);
        assert_eq!(lookup3(b"Four score and seven years ago", 1), 0xcd62_8161);
        // HDF5's Fletcher-32 of "abcde" (big-endian words "ab", "cd", and "e" padded), as numcodecs
        // computes it; the little-endian Fletcher-32 of the same text is 0xf04fc729.
        assert_eq!(fletcher32(b"abcde"), 0x4ff0_29c7);
    }

    #[test]
    fn mismatch_and_truncated_are_corrupt() {
        for (codec, input, _) in vectors() {
            for i in [0, input.len() / 2, input.len() - 1] {
                let mut flipped = input.clone();
                flipped[i] ^= 0x10;
                assert!(
                    matches!(codec.decode(&flipped, 1 << 20), Err(CodecError::Corrupt(_))),
                    "{codec:?} {i}"
                );
            }
            for bad in [&input[..input.len() - 1], &input[..3], &[][..]] {
                assert!(
                    matches!(codec.decode(bad, 1 << 20), Err(CodecError::Corrupt(_))),
                    "{codec:?} {}",
                    bad.len()
                );
            }
        }
    }

    #[test]
    fn config() {
        assert!(Checksum32::from_v2("crc32c", &json!({})).unwrap().is_none());
        assert_eq!(codec("crc32", json!({})).location, ChecksumLocation::Start);
        assert_eq!(
            codec("adler32", json!({ "location": "end" })).location,
            ChecksumLocation::End
        );
        for (id, bad) in [
            ("crc32", json!({ "location": "middle" })),
            ("adler32", json!({ "id": "crc32" })),
            ("fletcher32", json!("x")),
            ("jenkins_lookup3", json!({ "initval": -1 })),
            ("jenkins_lookup3", json!({ "initval": 4_294_967_296u64 })),
            ("jenkins_lookup3", json!({ "prefix": [256] })),
            ("jenkins_lookup3", json!({ "prefix": "zarr" })),
        ] {
            assert!(
                matches!(Checksum32::from_v2(id, &bad), Err(CodecError::Config(_))),
                "{id} {bad}"
            );
        }
    }
}
