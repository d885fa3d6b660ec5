//! numcodecs `vlen-utf8` / `vlen-bytes` (v2 object codecs; v3 `vlen-utf8`, `vlen-bytes`):
//! a little-endian u32 item count, then per item a little-endian u32 length and the bytes.
//! Spec: <https://numcodecs.readthedocs.io/en/stable/other/vlen.html>

use super::CodecError;
use crate::zarr::elements::{ELEMENT_BYTES, Elements};

fn u32_at(input: &[u8], pos: usize) -> Result<usize, CodecError> {
    input
        .get(pos..pos + 4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .ok_or_else(|| CodecError::Corrupt("vlen: truncated".into()))
}

/// Splits a vlen buffer into its `expected` items, refusing a count whose elements alone would
/// take more than `limit` decoded before anything is reserved for them.
fn items<'a>(input: &'a [u8], expected: usize, codec: &str, limit: usize) -> Result<Vec<&'a [u8]>, CodecError> {
    let n = u32_at(input, 0)?;
    if n != expected {
        return Err(CodecError::Corrupt(format!(
            "vlen: {n} items where the chunk holds {expected}"
        )));
    }
    // Each item takes at least its 4-byte length: a count the bytes cannot hold is refused
    // before anything is reserved for it.
    if n > input.len().saturating_sub(4) / 4 {
        return Err(CodecError::Corrupt(format!(
            "vlen: {n} items cannot fit in {} bytes",
            input.len()
        )));
    }
    check_decoded(codec, n, 0, limit)?;
    let mut out = Vec::with_capacity(n);
    let mut pos = 4;
    for _ in 0..n {
        let len = u32_at(input, pos)?;
        pos += 4;
        let item = input
            .get(pos..pos + len)
            .ok_or_else(|| CodecError::Corrupt("vlen: item runs past the end".into()))?;
        out.push(item);
        pos += len;
    }
    Ok(out)
}

/// Refuses a chunk whose `n` variable-length elements, holding `content` bytes in all, would
/// take more than `limit` bytes decoded: as for every other decoded chunk, the limit bounds
/// what one decode may hold, whatever the stored bytes claim.
pub(crate) fn check_decoded(codec: &str, n: usize, content: usize, limit: usize) -> Result<(), CodecError> {
    let size = n.saturating_mul(ELEMENT_BYTES).saturating_add(content);
    if size > limit {
        return Err(CodecError::OverLimit(format!(
            "{codec}: {n} elements of {content} bytes decode to more than the limit of {limit} bytes"
        )));
    }
    Ok(())
}

/// Items that must be UTF-8 as string elements, checked against `limit` (see
/// [`check_decoded`]); `codec` names the codec in errors.
pub(crate) fn utf8_items(items: Vec<&[u8]>, codec: &str, limit: usize) -> Result<Elements, CodecError> {
    check_decoded(codec, items.len(), items.iter().map(|b| b.len()).sum(), limit)?;
    items
        .into_iter()
        .map(|b| {
            std::str::from_utf8(b)
                .map(|s| Some(s.to_owned()))
                .map_err(|_| CodecError::Corrupt(format!("{codec}: invalid UTF-8")))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Elements::Strings)
}

/// Decodes `vlen-utf8`, up to `limit` bytes decoded.
pub fn decode_utf8(input: &[u8], expected: usize, limit: usize) -> Result<Elements, CodecError> {
    utf8_items(items(input, expected, "vlen-utf8", limit)?, "vlen-utf8", limit)
}

/// Decodes `vlen-bytes`, up to `limit` bytes decoded.
pub fn decode_bytes(input: &[u8], expected: usize, limit: usize) -> Result<Elements, CodecError> {
    bytes_items(items(input, expected, "vlen-bytes", limit)?, "vlen-bytes", limit)
}

/// Items as byte-string elements, checked against `limit` (see [`check_decoded`]).
pub(crate) fn bytes_items(items: Vec<&[u8]>, codec: &str, limit: usize) -> Result<Elements, CodecError> {
    check_decoded(codec, items.len(), items.iter().map(|b| b.len()).sum(), limit)?;
    Ok(Elements::Bytes(items.into_iter().map(|b| Some(b.to_vec())).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(items: &[&[u8]]) -> Vec<u8> {
        let mut out = (items.len() as u32).to_le_bytes().to_vec();
        for i in items {
            out.extend((i.len() as u32).to_le_bytes());
            out.extend_from_slice(i);
        }
        out
    }

    #[test]
    fn round_trip_and_corruption() {
        let buf = encode(&[b"ab", "ü".as_bytes(), b""]);
        assert_eq!(
            decode_utf8(&buf, 3, 1 << 20).unwrap(),
            Elements::Strings(vec![Some("ab".into()), Some("ü".into()), Some(String::new())])
        );
        assert_eq!(
            decode_bytes(&buf, 3, 1 << 20).unwrap(),
            Elements::Bytes(vec![Some(b"ab".to_vec()), Some("ü".as_bytes().to_vec()), Some(vec![])])
        );
        assert!(decode_utf8(&buf, 4, 1 << 20).is_err(), "count mismatch");
        assert!(
            decode_utf8(&buf[..buf.len() - 1], 3, 1 << 20).is_err(),
            "the empty last item's length is cut"
        );
        assert!(decode_utf8(&buf[..7], 3, 1 << 20).is_err(), "truncated");
        assert!(decode_utf8(&encode(&[&[0xff]]), 1, 1 << 20).is_err(), "invalid UTF-8");
        let mut huge = encode(&[b"x"]);
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(
            decode_bytes(&huge, 1, 1 << 20).is_err(),
            "a length past the end is corrupt, not an allocation"
        );
        // A count of 2^30 items in a 4-byte chunk: refused before reserving 16 GiB for them.
        let count = (1u32 << 30).to_le_bytes();
        let err = decode_utf8(&count, 1 << 30, 1 << 20).unwrap_err().to_string();
        assert!(err.contains("cannot fit in 4 bytes"), "{err}");
        // 1000 empty strings take 24 kB decoded (4 kB stored): refused below that.
        let empty = encode(&[&b""[..]; 1000]);
        assert!(decode_utf8(&empty, 1000, 24_000).is_ok());
        let err = decode_bytes(&empty, 1000, 23_999).unwrap_err().to_string();
        assert!(err.contains("more than the limit of 23999 bytes"), "{err}");
        // A count whose elements alone are over the limit is refused from the count, before
        // anything is reserved for the items (of one byte each here).
        let ones = encode(&[&b"x"[..]; 1000]);
        let err = decode_utf8(&ones, 1000, 1000).unwrap_err().to_string();
        assert!(err.contains("1000 elements of 0 bytes"), "{err}");
    }
}
