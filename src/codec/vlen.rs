//! numcodecs `vlen-utf8` / `vlen-bytes` (v2 object codecs; v3 `vlen-utf8`, `vlen-bytes`):
//! a little-endian u32 item count, then per item a little-endian u32 length and the bytes.
//! Spec: <https://numcodecs.readthedocs.io/en/stable/other/vlen.html>

use super::CodecError;
use crate::zarr::elements::Elements;

fn u32_at(input: &[u8], pos: usize) -> Result<usize, CodecError> {
    input
        .get(pos..pos + 4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .ok_or_else(|| CodecError::Corrupt("vlen: truncated".into()))
}

/// Splits a vlen buffer into its `expected` items.
fn items(input: &[u8], expected: usize) -> Result<Vec<&[u8]>, CodecError> {
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

/// Items that must be UTF-8 as string elements; `codec` names the codec in errors.
pub(crate) fn utf8_items(items: Vec<&[u8]>, codec: &str) -> Result<Elements, CodecError> {
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

/// Decodes `vlen-utf8`.
pub fn decode_utf8(input: &[u8], expected: usize) -> Result<Elements, CodecError> {
    utf8_items(items(input, expected)?, "vlen-utf8")
}

/// Decodes `vlen-bytes`.
pub fn decode_bytes(input: &[u8], expected: usize) -> Result<Elements, CodecError> {
    Ok(Elements::Bytes(
        items(input, expected)?.into_iter().map(|b| Some(b.to_vec())).collect(),
    ))
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
            decode_utf8(&buf, 3).unwrap(),
            Elements::Strings(vec![Some("ab".into()), Some("ü".into()), Some(String::new())])
        );
        assert_eq!(
            decode_bytes(&buf, 3).unwrap(),
            Elements::Bytes(vec![Some(b"ab".to_vec()), Some("ü".as_bytes().to_vec()), Some(vec![])])
        );
        assert!(decode_utf8(&buf, 4).is_err(), "count mismatch");
        assert!(
            decode_utf8(&buf[..buf.len() - 1], 3).is_err(),
            "the empty last item's length is cut"
        );
        assert!(decode_utf8(&buf[..7], 3).is_err(), "truncated");
        assert!(decode_utf8(&encode(&[&[0xff]]), 1).is_err(), "invalid UTF-8");
        let mut huge = encode(&[b"x"]);
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(
            decode_bytes(&huge, 1).is_err(),
            "a length past the end is corrupt, not an allocation"
        );
        // A count of 2^30 items in a 4-byte chunk: refused before reserving 16 GiB for them.
        let count = (1u32 << 30).to_le_bytes();
        let err = decode_utf8(&count, 1 << 30).unwrap_err().to_string();
        assert!(err.contains("cannot fit in 4 bytes"), "{err}");
    }
}
