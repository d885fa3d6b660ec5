//! ZEP0007 variable-length chunks for v3 `string` / `binary` arrays whose codec chain has no
//! array->bytes codec: (n + 1) little-endian int32 offsets, zero padding to the next 64-byte
//! boundary (from the chunk start), then the data buffer; item i is `data[off[i]..off[i+1]]`.
//! Spec: <https://zarr.dev/zeps/draft/ZEP0007.html>

use super::CodecError;
use crate::dtype::elements::Elements;

fn split(input: &[u8], n: usize, limit: usize) -> Result<Vec<&[u8]>, CodecError> {
    // The elements alone, before anything is reserved for their offsets.
    super::vlen::check_decoded("zep0007", n, 0, limit)?;
    let header = (n + 1)
        .checked_mul(4)
        .ok_or_else(|| CodecError::Corrupt("zep0007: too many items".into()))?;
    let data_start = header.div_ceil(64) * 64;
    if input.len() < header {
        return Err(CodecError::Corrupt("zep0007: truncated offsets".into()));
    }
    let data = input.get(data_start..).unwrap_or(&[]);
    let offsets: Vec<usize> = input[..header]
        .chunks_exact(4)
        .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .map(|o| usize::try_from(o).map_err(|_| CodecError::Corrupt("zep0007: negative offset".into())))
        .collect::<Result<_, _>>()?;
    offsets
        .windows(2)
        .map(|w| {
            data.get(w[0]..w[1])
                .ok_or_else(|| CodecError::Corrupt(format!("zep0007: bad item range {}..{}", w[0], w[1])))
        })
        .collect()
}

/// Decodes a chunk of `n` strings (`binary == false`) or byte strings, up to `limit` bytes
/// decoded.
pub fn decode(input: &[u8], n: usize, binary: bool, limit: usize) -> Result<Elements, CodecError> {
    let items = split(input, n, limit)?;
    if binary {
        return super::vlen::bytes_items(items, "zep0007", limit);
    }
    super::vlen::utf8_items(items, "zep0007", limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(items: &[&str]) -> Vec<u8> {
        let mut offsets = vec![0i32];
        for i in items {
            offsets.push(offsets.last().unwrap() + i.len() as i32);
        }
        let mut out: Vec<u8> = offsets.iter().flat_map(|o| o.to_le_bytes()).collect();
        out.resize(out.len().div_ceil(64) * 64, 0);
        out.extend(items.iter().flat_map(|i| i.bytes()));
        out
    }

    #[test]
    fn decodes_padded_layout() {
        let buf = encode(&["a", "", "héllo"]);
        assert_eq!(buf.len(), 64 + 7);
        assert_eq!(
            decode(&buf, 3, false, 1 << 20).unwrap(),
            Elements::Strings(vec![Some("a".into()), Some("".into()), Some("héllo".into())])
        );
        // 20 items: 84 bytes of offsets, data from byte 128.
        let many: Vec<String> = (0..20).map(|i| i.to_string()).collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        let buf = encode(&refs);
        assert_eq!(&buf[128..130], b"01");
        assert_eq!(decode(&buf, 20, true, 1 << 20).unwrap().count(1), 20);
        assert!(decode(&buf[..70], 20, false, 1 << 20).is_err());
        let mut bad = encode(&["abc"]);
        bad[4..8].copy_from_slice(&100i32.to_le_bytes());
        assert!(decode(&bad, 1, false, 1 << 20).is_err());
        // A count whose elements alone are over the limit: refused before its offsets are read.
        let err = decode(&buf, 20, true, 20 * 24 - 1).unwrap_err().to_string();
        assert!(err.contains("20 elements of 0 bytes"), "{err}");
    }
}
