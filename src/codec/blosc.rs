//! `blosc`: a c-blosc 1.x buffer ([format](https://github.com/Blosc/c-blosc/blob/main/README_HEADER.rst)).
//!
//! Zarr v3 [`blosc` codec](https://zarr-specs.readthedocs.io/en/latest/v3/codecs/blosc/index.html)
//! and numcodecs [`blosc`](https://numcodecs.readthedocs.io/en/stable/compression/blosc.html). The
//! buffer is self-describing: a 16-byte header (format version, flags for byte shuffle, bit
//! shuffle and memcpy, typesize, `nbytes`, `blocksize`, `cbytes`) then the blocks, each compressed
//! with blosclz, lz4 (lz4hc writes lz4), zlib or zstd. So decoding needs no configuration; it is
//! only checked. The C library (`blosc-src`, built from source) does the work on this thread,
//! except for byte-shuffled lz4 and zstd buffers of 2-, 4- and 8-byte items on a CPU with AVX2:
//! those are decoded here ([`decode_shuffled`]) with the same lz4 and zstd libraries and a
//! vector unshuffle that this build of c-blosc lacks.

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
        if let Some(decoded) = decode_shuffled(buffer, nbytes, blocksize, &mut out) {
            return decoded.map(|()| out);
        }
        // Every other buffer: c-blosc.
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

/// Header flag: the blocks were byte-shuffled.
const DOSHUFFLE: u8 = 0x01;
/// Header flag: the data is stored as it is after the header.
const MEMCPYED: u8 = 0x02;
/// Header flag: the blocks were bit-shuffled.
const DOBITSHUFFLE: u8 = 0x04;
/// Header flag c-blosc 1.x refuses ("from the future").
const RESERVED: u8 = 0x08;
/// Header flag: the blocks were not split into one stream per byte lane.
const DONT_SPLIT: u8 = 0x10;
/// Compressor codes, in the header flags' top three bits.
const CODE_LZ4: u8 = 1;
const CODE_ZSTD: u8 = 4;
/// The format version of lz4's and zstd's streams (the header's second byte).
const CODEC_FORMAT: u8 = 1;
/// c-blosc's `BLOSC_MAX_BLOCKSIZE`.
const MAX_BLOCKSIZE: usize = (i32::MAX as usize - 255 * 4) / 3;
/// A block is split into `typesize` streams only for items of at most this size...
const MAX_SPLITS: usize = 16;
/// ...and with at least this many items in the block.
const MIN_SPLIT_ITEMS: usize = 128;
/// The largest block buffer kept for the next chunk.
const KEPT_BLOCK: usize = 4 << 20;
/// How many block buffers (and zstd contexts) are kept: as many as chunks decode at once.
const KEPT_SCRATCHES: usize = 8;

/// Decodes byte-shuffled blocks of lz4 or zstd streams here, where the unshuffle has a vector
/// kernel this build of c-blosc lacks (it compiles its AVX2 shuffle only when the whole build
/// targets AVX2): `None` for every other buffer, which c-blosc decodes. `buffer` is exactly the
/// header's `cbytes` and passed c-blosc's header validation; `nbytes` (within the limit and
/// `out`'s capacity) and `blocksize` are the header's, as `blosc_cbuffer_sizes` reads them.
/// Errors are what c-blosc would refuse.
///
/// Layout (c-blosc 1.x, `README_HEADER.rst`): after the 16-byte header, one little-endian
/// `i32` offset per block; a block of `blocksize` bytes (the last one possibly shorter) is
/// `typesize` streams of `blocksize / typesize` bytes when split, else one stream; a stream is
/// an `i32` length and that many bytes, stored as is when the length equals the stream's.
fn decode_shuffled(
    buffer: &[u8],
    nbytes: usize,
    blocksize: usize,
    out: &mut Vec<u8>,
) -> Option<Result<(), CodecError>> {
    let flags = buffer[2];
    let typesize = usize::from(buffer[3]);
    let code = flags >> 5;
    // lz4 and zstd are both features of the blosc-src this links (Cargo.toml): c-blosc decodes
    // them too, so taking them here changes which code decodes, never what decodes.
    // Anything c-blosc would look at twice (a reserved flag, a codec format version other than
    // the one lz4 and zstd have) is left to it.
    if flags & (DOSHUFFLE | MEMCPYED | DOBITSHUFFLE | RESERVED) != DOSHUFFLE
        || !matches!(code, CODE_LZ4 | CODE_ZSTD)
        || buffer[1] != CODEC_FORMAT
        || !super::shuffle::has_simd(typesize)
    {
        return None;
    }
    // c-blosc refuses a block larger than the data (a negative one reads as larger still); a
    // block of a size that is not whole items (never written) is left to it.
    if blocksize == 0 || blocksize > nbytes || blocksize > MAX_BLOCKSIZE || !blocksize.is_multiple_of(typesize) {
        return None;
    }
    let dst = &mut out.spare_capacity_mut()[..nbytes];
    let mut scratch = Scratch::take(blocksize);
    let decoded = decode_blocks(buffer, code, typesize, blocksize, dst, &mut scratch);
    scratch.give();
    match decoded {
        Ok(()) => {
            // SAFETY: `decode_blocks` wrote every byte of `dst`, the first `nbytes` of the capacity.
            unsafe { out.set_len(nbytes) };
            Some(Ok(()))
        }
        Err(what) => Some(Err(CodecError::Corrupt(format!("blosc: {what}")))),
    }
}

/// What decoding one chunk's blocks needs besides its output: a buffer for one block's
/// decompressed streams before they are unshuffled, and a zstd context. A few are kept for the
/// next chunks (a bound on their memory that per-thread ones, one for each of the blocking
/// pool's threads, would not have).
#[derive(Default)]
struct Scratch {
    block: Vec<u8>,
    zstd: Option<zstd::zstd_safe::DCtx<'static>>,
}

/// Kept [`Scratch`]es: at most [`KEPT_SCRATCHES`], their blocks at most [`KEPT_BLOCK`] bytes.
static SPARE_SCRATCH: std::sync::Mutex<Vec<Scratch>> = std::sync::Mutex::new(Vec::new());

impl Scratch {
    /// A kept one or a new one, its block at least `blocksize` bytes.
    fn take(blocksize: usize) -> Self {
        Self::take_from(&SPARE_SCRATCH, blocksize)
    }

    /// Kept for the next chunk, within the bounds; freed otherwise.
    fn give(self) {
        self.give_to(&SPARE_SCRATCH);
    }

    fn take_from(spare: &std::sync::Mutex<Vec<Scratch>>, blocksize: usize) -> Self {
        let mut scratch = spare.lock().ok().and_then(|mut s| s.pop()).unwrap_or_default();
        if scratch.block.len() < blocksize {
            // Exactly: a doubled capacity would hold twice what the bound on kept blocks says.
            scratch.block.reserve_exact(blocksize - scratch.block.len());
            scratch.block.resize(blocksize, 0);
        }
        scratch
    }

    fn give_to(mut self, spare: &std::sync::Mutex<Vec<Scratch>>) {
        if self.block.capacity() > KEPT_BLOCK {
            self.block = Vec::new();
        }
        if let Ok(mut spare) = spare.lock()
            && spare.len() < KEPT_SCRATCHES
        {
            spare.push(self);
        }
    }
}

/// Decompresses and unshuffles every block of `buffer` into `dst` (all of it written when this
/// returns `Ok`), with a `scratch` block of at least `blocksize` bytes.
fn decode_blocks(
    buffer: &[u8],
    code: u8,
    typesize: usize,
    blocksize: usize,
    dst: &mut [std::mem::MaybeUninit<u8>],
    scratch: &mut Scratch,
) -> Result<(), &'static str> {
    let dont_split = buffer[2] & DONT_SPLIT != 0;
    let word = |at: usize| -> Result<usize, &'static str> {
        let bytes = buffer.get(at..at + 4).ok_or("an offset past the end")?;
        let value = i32::from_le_bytes(bytes.try_into().map_err(|_| "an offset past the end")?);
        usize::try_from(value).map_err(|_| "a negative offset or length")
    };
    for (j, block) in dst.chunks_mut(blocksize).enumerate() {
        let leftover = block.len() < blocksize;
        let streams = if !dont_split && typesize <= MAX_SPLITS && block.len() / typesize >= MIN_SPLIT_ITEMS && !leftover
        {
            typesize
        } else {
            1
        };
        let stream_len = block.len() / streams;
        let mut at = word(HEADER_LEN + 4 * j)?;
        let tmp = &mut scratch.block[..block.len()];
        for stream in tmp.chunks_exact_mut(stream_len).take(streams) {
            let len = word(at)?;
            let data = buffer.get(at + 4..at + 4 + len).ok_or("a stream past the end")?;
            at += 4 + len;
            if len == stream_len {
                stream.copy_from_slice(data);
            } else if decompress(code, data, stream, &mut scratch.zstd)? != stream_len {
                return Err("a stream decodes to the wrong size");
            }
        }
        super::shuffle::unshuffle_into(typesize, tmp, block);
    }
    Ok(())
}

/// Decompresses one stream into `out`; returns how many bytes it wrote. A zstd context is
/// made in `zstd` when there is none.
fn decompress(
    code: u8,
    data: &[u8],
    out: &mut [u8],
    zstd: &mut Option<zstd::zstd_safe::DCtx<'static>>,
) -> Result<usize, &'static str> {
    if code == CODE_LZ4 {
        let (Ok(len), Ok(room)) = (i32::try_from(data.len()), i32::try_from(out.len())) else {
            return Err("a stream too large for lz4");
        };
        // SAFETY: LZ4_decompress_safe reads at most `len` bytes of `data` and writes at most
        // `room` bytes into `out`, whatever the bytes are.
        let n = unsafe { lz4_sys::LZ4_decompress_safe(data.as_ptr().cast(), out.as_mut_ptr().cast(), len, room) };
        return usize::try_from(n).map_err(|_| "lz4 data does not decode");
    }
    let dctx = match zstd {
        Some(d) => d,
        None => zstd.insert(zstd::zstd_safe::DCtx::try_create().ok_or("no zstd context")?),
    };
    dctx.decompress(out, data).map_err(|_| "zstd data does not decode")
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
        compress_blocks(data, cname, shuffle, typesize, 0)
    }

    /// The same with a block size (0: c-blosc's choice).
    fn compress_blocks(data: &[u8], cname: &str, shuffle: i32, typesize: usize, blocksize: usize) -> Vec<u8> {
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
                blocksize,
                1,
            )
        };
        assert!(n > 0);
        out.truncate(n as usize);
        out
    }

    /// c-blosc's own decode of a buffer (`None`: refused), after the checks `decode` makes
    /// before it calls c-blosc (c-blosc trusts the header's sizes).
    fn c_decode(input: &[u8]) -> Option<Vec<u8>> {
        if input.len() < HEADER_LEN {
            return None;
        }
        let (mut nbytes, mut cbytes, mut blocksize) = (0usize, 0usize, 0usize);
        unsafe { blosc_src::blosc_cbuffer_sizes(input.as_ptr().cast(), &mut nbytes, &mut cbytes, &mut blocksize) };
        let mut validated = 0usize;
        if cbytes > input.len()
            || nbytes > 1 << 20
            || unsafe { blosc_src::blosc_cbuffer_validate(input.as_ptr().cast(), cbytes, &mut validated) } != 0
        {
            return None;
        }
        let mut out = vec![0u8; nbytes];
        let n = unsafe {
            blosc_src::blosc_decompress_ctx(input.as_ptr().cast(), out.as_mut_ptr().cast::<c_void>(), nbytes, 1)
        };
        (usize::try_from(n).ok() == Some(nbytes)).then_some(out)
    }

    /// Floats of a smooth field with noise, as arrays hold (they compress, and they shuffle
    /// into distinct byte lanes).
    fn field(len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| {
                let x = i as f64 * 0.001;
                ((x.sin() * 1000.0) as i64 as u64 >> ((i % 8) * 8)) as u8 ^ (i.wrapping_mul(2_654_435_761) >> 28) as u8
            })
            .collect()
    }

    #[test]
    fn shuffled_blocks_decode_as_c_blosc_does() {
        // Sizes with and without a short last block and trailing bytes; lz4 splits blocks into
        // byte lanes, zstd does not; blosclz, bit shuffle and odd item sizes go to c-blosc.
        let data = field(300_011);
        let mut fast = 0;
        for cname in CNAMES {
            for shuffle in [0, 1, 2] {
                for typesize in [1, 2, 3, 4, 8, 16] {
                    for (len, blocksize) in [
                        (0, 0),
                        (7, 0),
                        (4096, 0),
                        (300_000, 0),
                        (300_011, 0),
                        (100_003, 8192),
                        (65_536, 65_536),
                    ] {
                        let original = &data[..len];
                        let input = compress_blocks(original, cname, shuffle, typesize, blocksize);
                        let what =
                            format!("{cname} shuffle {shuffle} typesize {typesize}, {len} bytes, blocks {blocksize}");
                        assert_eq!(any().decode(&input, 1 << 20).unwrap(), original, "{what}");
                        if len == 0 {
                            continue;
                        }
                        // Byte-shuffled lz4 or zstd streams (not stored as is) of 2-, 4- or
                        // 8-byte items are decoded here where the CPU has the vector kernels.
                        let shuffled = input[2] & 0x07 == DOSHUFFLE && matches!(input[2] >> 5, CODE_LZ4 | CODE_ZSTD);
                        let here = shuffled && super::super::shuffle::has_simd(typesize);
                        let blocksize = u32::from_le_bytes(input[8..12].try_into().unwrap()) as usize;
                        // The block walk, whatever the CPU (the unshuffle is scalar without
                        // AVX2), into a buffer that held other bytes.
                        if shuffled {
                            let mut out = vec![0xa5u8; len];
                            out.clear();
                            let mut scratch = Scratch::take_from(&std::sync::Mutex::new(Vec::new()), blocksize);
                            let dst = &mut out.spare_capacity_mut()[..len];
                            assert_eq!(
                                decode_blocks(&input, input[2] >> 5, typesize, blocksize, dst, &mut scratch),
                                Ok(())
                            );
                            unsafe { out.set_len(len) };
                            assert_eq!(out, original, "{what}: decode_blocks");
                        }
                        let mut out = vec![0x5au8; len];
                        out.clear();
                        match decode_shuffled(&input, len, blocksize, &mut out) {
                            Some(r) => {
                                assert!(here, "{what}");
                                assert_eq!(r, Ok(()), "{what}");
                                assert_eq!(out, original, "{what}");
                                fast += 1;
                            }
                            None => assert!(!here, "{what}"),
                        }
                    }
                }
            }
        }
        if super::super::shuffle::has_simd(4) {
            assert!(fast >= 40, "{fast} buffers decoded here");
        }
    }

    #[test]
    fn streams_stored_as_they_are() {
        // Byte lane 0 random, the others constant: lane 0's stream does not compress and is
        // stored as it is, the others are lz4 streams, and the buffer as a whole compresses.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let data: Vec<u8> = (0..1usize << 16)
            .map(|i| {
                // xorshift64: bytes with no pattern lz4 finds.
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                if i % 4 == 0 { (state >> 56) as u8 } else { 7 }
            })
            .collect();
        let input = compress(&data, "lz4", 1, 4);
        assert_eq!(input[2] & 0x07, DOSHUFFLE);
        let blocksize = u32::from_le_bytes(input[8..12].try_into().unwrap()) as usize;
        let first = u32::from_le_bytes(input[16..20].try_into().unwrap()) as usize;
        let stream = u32::from_le_bytes(input[first..first + 4].try_into().unwrap()) as usize;
        assert_eq!(stream, blocksize / 4, "lane 0 is stored as it is");
        assert_eq!(any().decode(&input, 1 << 20).unwrap(), data);
        let mut out = Vec::with_capacity(data.len());
        let mut scratch = Scratch::take_from(&std::sync::Mutex::new(Vec::new()), blocksize);
        let dst = &mut out.spare_capacity_mut()[..data.len()];
        assert_eq!(decode_blocks(&input, CODE_LZ4, 4, blocksize, dst, &mut scratch), Ok(()));
        unsafe { out.set_len(data.len()) };
        assert_eq!(out, data);
    }

    #[test]
    fn scratch_kept_is_bounded() {
        let spare = std::sync::Mutex::new(Vec::new());
        let taken: Vec<Scratch> = (0..KEPT_SCRATCHES + 3)
            .map(|_| Scratch::take_from(&spare, 4096))
            .collect();
        assert!(taken.iter().all(|s| s.block.len() == 4096));
        for s in taken {
            s.give_to(&spare);
        }
        assert_eq!(spare.lock().unwrap().len(), KEPT_SCRATCHES);
        // A kept block is reused, and grown when a chunk needs more.
        let grown = Scratch::take_from(&spare, 8192);
        assert_eq!(grown.block.len(), 8192);
        assert_eq!(spare.lock().unwrap().len(), KEPT_SCRATCHES - 1);
        // A block over the bound is freed; the rest (the zstd context) is kept.
        let mut large = Scratch::take_from(&spare, KEPT_BLOCK + 1);
        large.zstd = zstd::zstd_safe::DCtx::try_create();
        large.give_to(&spare);
        let back = spare.lock().unwrap().pop().unwrap();
        assert!(back.block.is_empty() && back.zstd.is_some());
        // A kept block grown to the bound is grown exactly, so it is still kept.
        let spare = std::sync::Mutex::new(Vec::new());
        Scratch::take_from(&spare, KEPT_BLOCK / 2 + 1).give_to(&spare);
        Scratch::take_from(&spare, KEPT_BLOCK).give_to(&spare);
        assert_eq!(spare.lock().unwrap().pop().unwrap().block.len(), KEPT_BLOCK);
    }

    #[test]
    fn shuffled_blocks_refuse_what_c_blosc_refuses() {
        // Every byte of the header, the block offsets and the stream lengths, changed: the
        // result is c-blosc's, refused or the same bytes.
        // Flips that toggle the split flag, switch lz4 and zstd, and change the item size
        // between 2, 4 and 8 (0x06, 0x0c) where they hit the header's flags and typesize.
        for (cname, typesize, blocksize) in [("lz4", 4, 4096), ("zstd", 4, 4096), ("lz4", 2, 0), ("zstd", 8, 0)] {
            let input = compress_blocks(&field(20_000), cname, 1, typesize, blocksize);
            // The header, the offsets and the first streams' lengths byte by byte; data bytes
            // sampled.
            for i in (0..input.len()).filter(|&i| i < 128 || i % 13 == 0) {
                for flip in [0x01, 0x06, 0x0c, 0x10, 0x20, 0x60, 0x80, 0xff] {
                    let mut changed = input.clone();
                    changed[i] ^= flip;
                    let what = format!("{cname} typesize {typesize}: byte {i} ^ {flip:#x}");
                    let ours = any().decode(&changed, 1 << 20);
                    if u32::from_le_bytes(changed[4..8].try_into().unwrap()) > 1 << 20 {
                        assert_eq!(ours, Err(CodecError::TooLarge { limit: 1 << 20 }), "{what}");
                        continue;
                    }
                    match c_decode(&changed) {
                        Some(want) => assert_eq!(ours, Ok(want), "{what}"),
                        None => assert!(ours.is_err(), "{what}: {ours:?}"),
                    }
                }
            }
        }
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
