//! numcodecs `vlen-utf8` / `vlen-bytes` / `vlen-array` (v2 object codecs; v3 `vlen-utf8`,
//! `vlen-bytes`): a little-endian u32 item count, then per item a little-endian u32 length and
//! the bytes. Spec: <https://numcodecs.readthedocs.io/en/stable/other/vlen.html>

use serde_json::Value;

use super::CodecError;
use crate::dtype::elements::{ELEMENT_BYTES, Elements, VALUE_BYTES};
use crate::dtype::{DType, Kind};

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

/// Bytes a number of a `vlen-array` item takes decoded besides its `Value`: the text of its
/// digits (`arbitrary_precision` numbers keep it), at most 24 for a float64 and 20 for an int64.
const NUMBER_TEXT: usize = 24;

/// Bytes one element of a `vlen-array` item takes decoded: its `Value` and its text (a number's
/// digits, which `arbitrary_precision` numbers keep; a complex number is a list of two; fixed
/// bytes are base64 text; fixed unicode up to four UTF-8 bytes a character).
fn element_weight(item: &DType) -> usize {
    match item.kind {
        Kind::Complex(_) => 3 * VALUE_BYTES + 2 * NUMBER_TEXT,
        Kind::FixedBytes(n) | Kind::Raw(n) => VALUE_BYTES + n.div_ceil(3) * 4,
        Kind::FixedUnicode(n) => VALUE_BYTES + 4 * n,
        _ => VALUE_BYTES + NUMBER_TEXT,
    }
}

/// Decodes `vlen-array` (numcodecs `VLenArray`, zarr 2's ragged arrays): each item is the
/// stored bytes of a 1-d array of `item` numbers, and becomes an object element holding them as
/// a list written as the slice API writes such numbers (NaN as `"NaN"`, complex as pairs, ...).
/// numcodecs stores `None` as an empty array, so it reads back as `[]`, as in zarr 2. The
/// numbers' count is checked against `limit` before any of them is decoded.
pub fn decode_arrays(input: &[u8], expected: usize, item: &DType, limit: usize) -> Result<Elements, CodecError> {
    let items = items(input, expected, "vlen-array", limit)?;
    let size = item.item_size().filter(|&s| s > 0).unwrap_or(1);
    let mut numbers = 0usize;
    for b in &items {
        if b.len() % size != 0 {
            return Err(CodecError::Corrupt(format!(
                "vlen-array: an item of {} bytes is no whole number of {} elements",
                b.len(),
                item.typestr()
            )));
        }
        numbers += b.len() / size;
    }
    let decoded = items
        .len()
        .saturating_mul(VALUE_BYTES)
        .saturating_add(numbers.saturating_mul(element_weight(item)));
    if decoded > limit {
        return Err(CodecError::OverLimit(format!(
            "vlen-array: {} items of {numbers} numbers decode to more than the limit of {limit} bytes",
            items.len()
        )));
    }
    let little = item.little_endian();
    let mut text = Vec::new();
    let mut out = Vec::with_capacity(items.len());
    for b in items {
        let mut bytes = b.to_vec();
        item.to_little_endian(&mut bytes);
        text.clear();
        text.push(b'[');
        crate::format::json::push_fixed_rows(&mut text, &little, &[], &bytes, bytes.len() / size, true);
        text.push(b']');
        let value: Value = serde_json::from_slice(&text)
            .map_err(|e| CodecError::Corrupt(format!("vlen-array: {} item not readable ({e})", item.typestr())))?;
        out.push(value);
    }
    Ok(Elements::Objects(out))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::codec::test_vectors::hex;

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

    fn texts(e: Elements) -> Vec<String> {
        let Elements::Objects(v) = e else { panic!("objects") };
        v.iter().map(|v| serde_json::to_string(v).unwrap()).collect()
    }

    #[test]
    fn arrays_as_numcodecs_writes_them() {
        // numcodecs 0.15 VLenArray('<f8').encode([[1.5, 2], [], None, [nan, -0.0]]).
        let stored = hex("0400000010000000000000000000f83f00000000000000400000000000000000\
                          10000000000000000000f87f0000000000000080");
        let f8 = DType::from_v2(&json!("<f8")).unwrap();
        assert_eq!(
            texts(decode_arrays(&stored, 4, &f8, 1 << 20).unwrap()),
            ["[1.5,2.0]", "[]", "[]", "[\"NaN\",-0.0]"]
        );
        // Big-endian items, integers, booleans, complex pairs.
        let be: Vec<u8> = [1u16, 65535, 7].iter().flat_map(|v| v.to_be_bytes()).collect();
        let two = encode(&[&be[..4], &be[4..]]);
        let u2 = DType::from_v2(&json!(">u2")).unwrap();
        assert_eq!(
            texts(decode_arrays(&two, 2, &u2, 1 << 20).unwrap()),
            ["[1,65535]", "[7]"]
        );
        let b1 = DType::from_v2(&json!("|b1")).unwrap();
        assert_eq!(
            texts(decode_arrays(&encode(&[&[1, 0]]), 1, &b1, 1 << 20).unwrap()),
            ["[true,false]"]
        );
        let c8: Vec<u8> = [1.5f32, -2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let c8_type = DType::from_v2(&json!("<c8")).unwrap();
        assert_eq!(
            texts(decode_arrays(&encode(&[&c8]), 1, &c8_type, 1 << 20).unwrap()),
            ["[[1.5,-2.0]]"]
        );
        // An item that is no whole number of elements, a count that is not the chunk's.
        assert!(matches!(
            decode_arrays(&encode(&[&be[..3]]), 1, &u2, 1 << 20),
            Err(CodecError::Corrupt(_))
        ));
        assert!(matches!(
            decode_arrays(&two, 3, &u2, 1 << 20),
            Err(CodecError::Corrupt(_))
        ));
        // Complex numbers weigh a list of two: 1 of them in 1 item.
        let one_c8 = 2 * VALUE_BYTES + 2 * VALUE_BYTES + 2 * NUMBER_TEXT;
        assert!(decode_arrays(&encode(&[&c8]), 1, &c8_type, one_c8).is_ok());
        assert!(matches!(
            decode_arrays(&encode(&[&c8]), 1, &c8_type, one_c8 - 1),
            Err(CodecError::OverLimit(_))
        ));
        // The numbers are counted against the limit before they are decoded: 3 numbers of 2
        // bytes in 2 items take (2 + 3) values and 3 texts decoded.
        let need = 5 * VALUE_BYTES + 3 * NUMBER_TEXT;
        assert!(decode_arrays(&two, 2, &u2, need).is_ok());
        assert!(matches!(
            decode_arrays(&two, 2, &u2, need - 1),
            Err(CodecError::OverLimit(_))
        ));
    }
}
