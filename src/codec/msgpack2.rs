//! numcodecs `msgpack2` (v2 object codec, numcodecs `MsgPack`): json2's layout in
//! [MessagePack](https://github.com/msgpack/msgpack/blob/master/spec.md): a list of the items
//! (nested for chunks of several dimensions, as NumPy's `tolist` writes them) followed by the
//! dtype string and the shape. Decoded by `rmpv`; the items become JSON values as json2's are:
//! NaN and infinities the strings `"NaN"`, `"Infinity"`, `"-Infinity"`, byte strings base64 text
//! (the slice API's convention for bytes); with the codec's `raw` option strings are bytes too,
//! as Python reads them then. Map keys must be strings or bytes, as msgpack's `strict_map_key`
//! (numcodecs' default) requires; extension types are no Python value numcodecs writes
//! (`msgpack.Timestamp` aside): both are corrupt data.
//!
//! As for json2, the stored bytes may be an eighth of the limit, and the values they hold are
//! counted (walking the encoding without decoding it) before anything is decoded.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Map, Number, Value};

use super::CodecError;
use super::json2::{TEXT_SHARE, items_of};
use crate::dtype::elements::{Elements, VALUE_BYTES};

fn corrupt(what: impl std::fmt::Display) -> CodecError {
    CodecError::Corrupt(format!("msgpack2: {what}"))
}

/// Decodes a msgpack2 chunk of `expected` items, up to `limit` bytes decoded; `raw`: the
/// codec's option of that name (strings read as bytes).
pub fn decode(input: &[u8], expected: usize, raw: bool, limit: usize) -> Result<Elements, CodecError> {
    if input.len() > limit / TEXT_SHARE {
        return Err(CodecError::OverLimit(format!(
            "msgpack2: {} stored bytes are more than the {} this server decodes for one chunk",
            input.len(),
            limit / TEXT_SHARE
        )));
    }
    // Each value is held twice while decoding (as rmpv's, then as JSON's): counted first.
    let values = count_values(input)?;
    let each = VALUE_BYTES + std::mem::size_of::<rmpv::Value>();
    if values.saturating_mul(each) > limit.saturating_mul(2) {
        return Err(CodecError::OverLimit(format!(
            "msgpack2: {values} values would take more than twice the limit of {limit} bytes decoded"
        )));
    }
    let mut rest = input;
    let value = rmpv::decode::read_value(&mut rest).map_err(corrupt)?;
    if !rest.is_empty() {
        return Err(corrupt(format!("{} bytes after the document", rest.len())));
    }
    items_of(to_json(value, raw)?, expected, limit, "msgpack2")
}

/// A MessagePack value as JSON (see the module's conventions).
fn to_json(value: rmpv::Value, raw: bool) -> Result<Value, CodecError> {
    use rmpv::Value as M;
    Ok(match value {
        M::Nil => Value::Null,
        M::Boolean(b) => Value::Bool(b),
        M::Integer(i) => match (i.as_u64(), i.as_i64()) {
            (Some(u), _) => Value::from(u),
            (None, Some(i)) => Value::from(i),
            (None, None) => return Err(corrupt("an integer out of range")),
        },
        M::F32(x) => float(f64::from(x)),
        M::F64(x) => float(x),
        M::String(s) if raw => Value::String(BASE64.encode(s.as_bytes())),
        M::String(s) => match s.into_str() {
            Some(s) => Value::String(s),
            None => return Err(corrupt("a string that is not UTF-8")),
        },
        M::Binary(b) => Value::String(BASE64.encode(b)),
        M::Array(items) => Value::Array(items.into_iter().map(|v| to_json(v, raw)).collect::<Result<_, _>>()?),
        M::Map(pairs) => {
            let mut map = Map::with_capacity(pairs.len());
            for (k, v) in pairs {
                let key = match k {
                    M::String(_) | M::Binary(_) => match to_json(k, raw)? {
                        Value::String(s) => s,
                        _ => return Err(corrupt("a map key that is not text")),
                    },
                    _ => return Err(corrupt("a map key that is neither a string nor bytes")),
                };
                map.insert(key, to_json(v, raw)?);
            }
            Value::Object(map)
        }
        M::Ext(kind, _) => return Err(corrupt(format!("extension type {kind}"))),
    })
}

fn float(x: f64) -> Value {
    match Number::from_f64(x) {
        Some(n) => Value::Number(n),
        None if x.is_nan() => Value::from("NaN"),
        None if x > 0.0 => Value::from("Infinity"),
        None => Value::from("-Infinity"),
    }
}

/// The values in a MessagePack document (containers and their members), walking its markers and
/// skipping payloads: its structure is checked against its length without decoding anything.
fn count_values(input: &[u8]) -> Result<usize, CodecError> {
    let truncated = || corrupt("truncated");
    let mut pos = 0usize;
    // Values still to read: one document, then what containers announce.
    let mut pending = 1usize;
    let mut count = 0usize;
    while pending > 0 {
        // Every value takes at least one byte: a count the rest cannot hold is a lie.
        if pending > input.len() - pos {
            return Err(truncated());
        }
        pending -= 1;
        count += 1;
        let marker = input[pos];
        pos += 1;
        let mut length = |bytes: usize| -> Result<usize, CodecError> {
            let b = input.get(pos..pos + bytes).ok_or_else(truncated)?;
            pos += bytes;
            Ok(b.iter().fold(0usize, |n, &x| (n << 8) | usize::from(x)))
        };
        // (values it announces, payload bytes it skips)
        let (members, payload) = match marker {
            0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => (0, 0),
            0x80..=0x8f => (2 * usize::from(marker & 0x0f), 0),
            0x90..=0x9f => (usize::from(marker & 0x0f), 0),
            0xa0..=0xbf => (0, usize::from(marker & 0x1f)),
            0xc1 => return Err(corrupt("marker 0xc1, which is never used")),
            0xc4 | 0xd9 => (0, length(1)?),
            0xc5 | 0xda => (0, length(2)?),
            0xc6 | 0xdb => (0, length(4)?),
            // ext: a length, then a type byte and the data
            0xc7 => (0, length(1)? + 1),
            0xc8 => (0, length(2)? + 1),
            0xc9 => (0, length(4)? + 1),
            0xca | 0xce | 0xd2 => (0, 4),
            0xcb | 0xcf | 0xd3 => (0, 8),
            0xcc | 0xd0 => (0, 1),
            0xcd | 0xd1 => (0, 2),
            0xd4 => (0, 2),
            0xd5 => (0, 3),
            0xd6 => (0, 5),
            0xd7 => (0, 9),
            0xd8 => (0, 17),
            0xdc => (length(2)?, 0),
            0xdd => (length(4)?, 0),
            0xde => (length(2)?.saturating_mul(2), 0),
            0xdf => (length(4)?.saturating_mul(2), 0),
        };
        if payload > input.len() - pos {
            return Err(truncated());
        }
        pos += payload;
        pending = pending.saturating_add(members);
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::codec::test_vectors::hex;

    /// numcodecs 0.15 `MsgPack().encode` of a 1-d object array
    /// `["text", 1, 2.5, None, [1, "two", [3]], {"k": "v", "n": 1}, b"\x00\xff", nan]`.
    const MIXED: &str = "9aa474657874 01 cb4004000000000000 c0 9301a374776f9103 \
                         82a16ba176a16e01 c40200ff cb7ff8000000000000 a27c4f 9108";

    #[test]
    fn decodes_as_json2_does() {
        let got = decode(&hex(MIXED), 8, false, 1 << 20).unwrap();
        let want = [
            json!("text"),
            json!(1),
            json!(2.5),
            json!(null),
            json!([1, "two", [3]]),
            json!({"k": "v", "n": 1}),
            json!("AP8="),
            json!("NaN"),
        ];
        assert_eq!(got, Elements::Objects(want.to_vec()));
        // With `raw`, strings are bytes (numcodecs MsgPack(raw=True) of
        // ["text", b"\x01", {"k": 1}]); a string that is not UTF-8 is then no error.
        let raw = decode(&hex("95 a474657874 c40101 81a16b01 a27c4f 9103"), 3, true, 1 << 20).unwrap();
        assert_eq!(
            raw,
            Elements::Objects(vec![json!("dGV4dA=="), json!("AQ=="), json!({"aw==": 1})])
        );
        let raw = decode(&hex("93 a1ff a27c4f 9101"), 1, true, 1 << 20).unwrap();
        assert_eq!(raw, Elements::Objects(vec![json!("/w==")]));
        // The count of items must be the chunk's.
        assert!(matches!(
            decode(&hex(MIXED), 7, false, 1 << 20),
            Err(CodecError::Corrupt(_))
        ));
    }

    #[test]
    fn corrupt_and_truncated() {
        let input = hex(MIXED);
        for cut in [1, 2, 10, input.len() - 1] {
            assert!(
                matches!(decode(&input[..cut], 8, false, 1 << 20), Err(CodecError::Corrupt(_))),
                "{cut}"
            );
        }
        let mut trailing = input.clone();
        trailing.push(0xc0);
        assert!(matches!(
            decode(&trailing, 8, false, 1 << 20),
            Err(CodecError::Corrupt(_))
        ));
        // An extension value, the unused marker, a string that is not UTF-8.
        for bad in ["93d40101a27c4f9101", "93c1a27c4f9101", "93a1ffa27c4f9101"] {
            assert!(
                matches!(decode(&hex(bad), 1, false, 1 << 20), Err(CodecError::Corrupt(_))),
                "{bad}"
            );
        }
        // Map keys other than strings and bytes (msgpack's strict_map_key): [{1: "a"}, "|O", [1]].
        assert!(matches!(
            decode(&hex("9381 01 a161 a27c4f 9101"), 1, false, 1 << 20),
            Err(CodecError::Corrupt(_))
        ));
        // Maps as keys of maps, 300 deep (found by fuzzing: written out as their JSON text,
        // each level escaped the one inside it again, and the text doubled a level).
        let mut nested = hex("93");
        nested.extend(std::iter::repeat_n(0x81, 300));
        nested.extend(std::iter::repeat_n(0x01, 301));
        nested.extend(hex("a27c4f 9101"));
        assert_eq!(count_values(&nested).unwrap(), 1 + 300 + 301 + 3);
        for raw in [false, true] {
            let err = decode(&nested, 1, raw, 1 << 20).unwrap_err().to_string();
            assert!(err.contains("a map key that is neither a string nor bytes"), "{err}");
        }
        // An array announcing 2^32 - 1 members in 5 bytes: refused from its length.
        assert!(matches!(
            decode(&hex("ddffffffff"), 1, false, 1 << 20),
            Err(CodecError::Corrupt(_))
        ));
    }

    #[test]
    fn values_are_counted_before_decoding() {
        // 10,000 empty arrays (a value a byte) in an array of 10,000 items + the trailer.
        let mut input = hex("dc2712");
        input.extend(std::iter::repeat_n(0x90, 10_000));
        input.extend(hex("a27c4f 91cd2710"));
        assert_eq!(count_values(&input).unwrap(), 1 + 10_000 + 1 + 1 + 1);
        // Refused from the count: each value held twice while decoding.
        let each = VALUE_BYTES + std::mem::size_of::<rmpv::Value>();
        let counted = (10_004 * each).div_ceil(2);
        let err = decode(&input, 10_000, false, counted - 1).unwrap_err();
        assert!(
            matches!(&err, CodecError::OverLimit(m) if m.contains("10004 values would take")),
            "{err}"
        );
        // Decoded, the items are held to the limit itself, as json2's are.
        let held = 10_000 * VALUE_BYTES;
        let got = decode(&input, 10_000, false, held.max(counted));
        assert!(matches!(&got, Ok(Elements::Objects(v)) if v.len() == 10_000), "{got:?}");
    }
}
