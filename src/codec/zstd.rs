//! `zstd`: Zstandard frames ([RFC 8878](https://www.rfc-editor.org/rfc/rfc8878)).
//!
//! Zarr v3 [`zstd` codec](https://github.com/zarr-developers/zarr-extensions/tree/main/codecs/zstd)
//! and numcodecs [`zstd`](https://numcodecs.readthedocs.io/en/stable/compression/zstd.html). A
//! chunk is one or more frames; a frame may carry a content checksum (`checksum: true`), which is
//! verified, and may omit its content size (streaming writers), so the frames are stream-decoded
//! and cut at the limit rather than sized from a header.

use serde_json::Value;

use super::{BytesToBytes, CodecError, config_object, numcodecs_object, optional_bool, optional_int, read_limited};

/// Zstandard's compression levels: negative "fast" levels down to -(1 << 17), up to 22.
const LEVELS: std::ops::RangeInclusive<i64> = -(1 << 17)..=22;

/// The largest window (log2 bytes) any frame may ask for: libzstd's own default cap, 128 MiB.
const WINDOW_LOG_CAP: u32 = 27;
/// The window every limit allows: 8 MiB covers streaming writers up to level 19, which do not
/// shrink their window to the data.
const WINDOW_LOG_FLOOR: u32 = 23;

/// The Zstandard decoder. Level and checksum flag do not matter for decoding, but are checked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Zstd;

impl Zstd {
    /// From a numcodecs dict: `{"id": "zstd", "level": 1, "checksum": false}`; both optional.
    pub fn from_v2(config: &Value) -> Result<Self, CodecError> {
        Self::from_options(numcodecs_object("zstd", config)?)
    }

    /// From a v3 configuration: `{"level": int, "checksum": bool}`; both optional.
    pub fn from_v3(configuration: Option<&Value>) -> Result<Self, CodecError> {
        Self::from_options(config_object("zstd", configuration)?)
    }

    fn from_options(options: Option<&serde_json::Map<String, Value>>) -> Result<Self, CodecError> {
        optional_int("zstd", options, "level", LEVELS)?;
        optional_bool("zstd", options, "checksum")?;
        Ok(Self)
    }
}

/// The window cap for a limit: a frame whose data fits the limit needs at most about twice the
/// limit, and never less than what streaming writers use.
fn window_log_max(limit: usize) -> u32 {
    let log = usize::BITS - limit.saturating_sub(1).leading_zeros() + 1;
    log.clamp(WINDOW_LOG_FLOOR, WINDOW_LOG_CAP)
}

/// Decodes a chunk that is one frame whose header states its content size (zarr-python and
/// numcodecs write that) into an allocation of exactly that size, in one call. `None` when
/// the frame states no size, the size is over the limit, or the frame does not decode to
/// exactly that size (more frames, bad data): the streaming decoder then decides.
fn decode_sized(input: &[u8], limit: usize) -> Option<Vec<u8>> {
    let size = usize::try_from(zstd::zstd_safe::get_frame_content_size(input).ok()??).ok()?;
    // One frame only: a one-shot decode would otherwise go on into the next frames.
    if size > limit || zstd::zstd_safe::find_frame_compressed_size(input).ok()? != input.len() {
        return None;
    }
    thread_local! {
        static DECODER: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
            const { std::cell::RefCell::new(None) };
    }
    DECODER.with(|cell| {
        let mut slot = cell.try_borrow_mut().ok()?;
        if slot.is_none() {
            *slot = zstd::bulk::Decompressor::new().ok();
        }
        let decoder = slot.as_mut()?;
        // The output buffer bounds the memory: a one-shot decode writes into it, with no window
        // of its own. Checksums are verified.
        let mut out = crate::buffers::DECODED.take(size);
        match decoder.decompress_to_buffer(input, &mut out) {
            Ok(n) if n == size => Some(out),
            _ => None,
        }
    })
}

/// Decodes a chunk that is one frame stating no content size but asking for a window larger
/// than the streaming decoder allows (`zstd --long`, `--ultra -22`): in one call into an
/// allocation of `limit` bytes, which is the decoder's whole memory (a one-shot decode keeps
/// its history in the output, with no window of its own). `None` when it is not one frame.
fn decode_one_shot(input: &[u8], limit: usize) -> Option<Result<Vec<u8>, CodecError>> {
    if zstd::zstd_safe::find_frame_compressed_size(input).ok()? != input.len() {
        return None;
    }
    let mut decoder = zstd::bulk::Decompressor::new().ok()?;
    // Reserved, not written: only what the frame decodes to is touched. A reservation the
    // system refuses is an answer, not an abort of the process.
    let mut out = Vec::new();
    if out.try_reserve_exact(limit).is_err() {
        return Some(Err(CodecError::TooLarge { limit }));
    }
    // An output over the limit shows as a destination too small: bad data either way.
    Some(
        decoder
            .decompress_to_buffer(input, &mut out)
            .map(|_| {
                // Decoded chunks are weighed by their length: no spare capacity is kept.
                out.shrink_to_fit();
                out
            })
            .map_err(|e| CodecError::Corrupt(format!("zstd: {e}"))),
    )
}

impl BytesToBytes for Zstd {
    fn decode(&self, input: &[u8], limit: usize) -> Result<Vec<u8>, CodecError> {
        if input.is_empty() {
            return Err(CodecError::Corrupt("zstd: empty input".to_string()));
        }
        if let Some(out) = decode_sized(input, limit) {
            return Ok(out);
        }
        let corrupt = |e: std::io::Error| CodecError::Corrupt(format!("zstd: {e}"));
        let mut decoder = zstd::stream::read::Decoder::with_buffer(input).map_err(corrupt)?;
        decoder.window_log_max(window_log_max(limit)).map_err(corrupt)?;
        let mut window_too_large = false;
        let streamed = read_limited(decoder, limit, input.len().saturating_mul(4), |e| {
            // libzstd's message for a window beyond the cap.
            window_too_large = e.to_string().contains("too much memory");
            corrupt(e)
        });
        match streamed {
            Err(_) if window_too_large => decode_one_shot(input, limit).unwrap_or(Err(CodecError::TooLarge { limit })),
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::codec::test_vectors::{BOMB_LEN, BOMB_LIMIT, expected, vector};

    #[test]
    fn decodes_numcodecs_vectors() {
        for name in ["level3", "checksum"] {
            assert_eq!(
                Zstd.decode(&vector("zstd", name), 1 << 20).unwrap(),
                expected(),
                "{name}"
            );
        }
    }

    /// A frame without a content size whose window is over what the streaming decoder allows
    /// for the limit (`zstd --long=27`): decoded in one call into the limit, as libzstd's own
    /// tools and zarr-python decode it.
    #[test]
    fn unsized_frames_with_large_windows_decode() {
        use std::io::Write;
        let data: Vec<u8> = (0..200_000u32).flat_map(|i| (i % 251).to_le_bytes()).collect();
        let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), 19).unwrap();
        encoder.include_contentsize(false).unwrap();
        encoder.window_log(27).unwrap();
        encoder.long_distance_matching(true).unwrap();
        encoder.write_all(&data).unwrap();
        let frame = encoder.finish().unwrap();
        assert_eq!(zstd::zstd_safe::get_frame_content_size(&frame).unwrap(), None);
        // The streaming decoder alone refuses it.
        let mut streaming = zstd::stream::read::Decoder::with_buffer(&frame[..]).unwrap();
        streaming.window_log_max(window_log_max(data.len())).unwrap();
        assert!(std::io::Read::read_to_end(&mut streaming, &mut Vec::new()).is_err());
        let out = Zstd.decode(&frame, data.len()).unwrap();
        assert_eq!(out, data);
        assert_eq!(out.capacity(), data.len());
        // Larger than the limit: refused as bad data.
        assert!(matches!(
            Zstd.decode(&frame, data.len() - 1),
            Err(CodecError::Corrupt(_))
        ));
    }

    #[test]
    fn sized_frames_decode_in_one_call_and_fall_back_otherwise() {
        let data = expected();
        let sized = zstd::bulk::compress(&data, 3).unwrap();
        assert_eq!(
            zstd::zstd_safe::get_frame_content_size(&sized).unwrap(),
            Some(data.len() as u64)
        );
        assert_eq!(decode_sized(&sized, 1 << 20).unwrap(), data);
        // Over the limit: not decoded here (and the streaming path refuses it).
        assert_eq!(decode_sized(&sized, data.len() - 1), None);
        assert_eq!(
            Zstd.decode(&sized, data.len() - 1),
            Err(CodecError::TooLarge { limit: data.len() - 1 })
        );
        // Two frames: the first frame's size is not the whole; the streaming path reads both.
        let two = [sized.clone(), sized.clone()].concat();
        assert_eq!(decode_sized(&two, 1 << 20), None);
        assert_eq!(
            Zstd.decode(&two, 1 << 20).unwrap(),
            [data.clone(), data.clone()].concat()
        );
        // A header that lies about the size.
        let half = &data[..data.len() / 2];
        let mut lying = zstd::bulk::compress(half, 3).unwrap();
        let fhd = lying[4];
        assert_eq!(fhd >> 6, 1, "a 2-byte content size field");
        let at = 5 + usize::from(fhd & 0x20 == 0) + [0, 1, 2, 4][usize::from(fhd & 3)];
        let stated = u16::from_le_bytes([lying[at], lying[at + 1]]);
        assert_eq!(usize::from(stated) + 256, half.len());
        lying[at..at + 2].copy_from_slice(&(stated + 8).to_le_bytes());
        assert_eq!(
            zstd::zstd_safe::get_frame_content_size(&lying).unwrap(),
            Some(half.len() as u64 + 8)
        );
        assert_eq!(decode_sized(&lying, 1 << 20), None);
        assert!(Zstd.decode(&lying, 1 << 20).is_err());
    }

    #[test]
    fn checksum_is_verified() {
        let mut input = vector("zstd", "checksum");
        assert_eq!(input[4] & 0x04, 0x04, "frame header has the content checksum flag");
        let last = input.len() - 1;
        input[last] ^= 0xff;
        assert!(matches!(Zstd.decode(&input, 1 << 20), Err(CodecError::Corrupt(_))));
    }

    #[test]
    fn frames_without_content_size_and_several_frames() {
        let data = expected();
        // The streaming encoder does not know the size, so the frame header carries none.
        let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
        std::io::Write::write_all(&mut encoder, &data).unwrap();
        let frame = encoder.finish().unwrap();
        assert!(matches!(zstd::zstd_safe::get_frame_content_size(&frame), Ok(None)));
        assert_eq!(Zstd.decode(&frame, 1 << 20).unwrap(), data);
        assert_eq!(
            Zstd.decode(&frame, data.len() - 1),
            Err(CodecError::TooLarge { limit: data.len() - 1 })
        );

        let mut two = vector("zstd", "level3");
        two.extend_from_slice(&frame);
        assert_eq!(Zstd.decode(&two, 1 << 20).unwrap(), [data.clone(), data].concat());
    }

    #[test]
    fn corrupt_and_truncated() {
        let input = vector("zstd", "level3");
        for bad in [
            &input[..input.len() - 1],
            &input[..8],
            &input[..2],
            &b"definitely not zstd"[..],
            &[][..],
        ] {
            assert!(
                matches!(Zstd.decode(bad, 1 << 20), Err(CodecError::Corrupt(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn bomb_is_too_large() {
        let bomb = zstd::bulk::compress(&vec![0u8; BOMB_LEN], 19).unwrap();
        assert!(bomb.len() < 64 << 10);
        assert_eq!(
            Zstd.decode(&bomb, BOMB_LIMIT),
            Err(CodecError::TooLarge { limit: BOMB_LIMIT })
        );
    }

    #[test]
    fn window_cap_follows_the_limit() {
        assert_eq!(window_log_max(0), WINDOW_LOG_FLOOR);
        assert_eq!(window_log_max(1 << 20), WINDOW_LOG_FLOOR);
        assert_eq!(window_log_max(1 << 24), 25);
        assert_eq!(window_log_max(usize::MAX), WINDOW_LOG_CAP);
    }

    #[test]
    fn config() {
        assert_eq!(
            Zstd::from_v2(&json!({ "id": "zstd", "level": 22, "checksum": true })),
            Ok(Zstd)
        );
        assert_eq!(Zstd::from_v2(&json!({ "id": "zstd", "level": -5 })), Ok(Zstd));
        assert_eq!(Zstd::from_v3(Some(&json!({ "level": 0, "checksum": false }))), Ok(Zstd));
        assert_eq!(Zstd::from_v3(None), Ok(Zstd));
        for bad in [
            json!({ "id": "zstd", "level": 23 }),
            json!({ "id": "zstd", "checksum": 1 }),
            json!({ "id": "lz4" }),
        ] {
            assert!(matches!(Zstd::from_v2(&bad), Err(CodecError::Config(_))), "{bad}");
        }
        assert!(matches!(
            Zstd::from_v3(Some(&json!({ "level": "3" }))),
            Err(CodecError::Config(_))
        ));
    }
}
