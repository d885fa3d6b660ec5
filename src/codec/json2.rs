//! numcodecs `json2` (v2 object codec): the chunk is a JSON list of the items (nested lists for
//! chunks of several dimensions, as NumPy's `tolist` writes them) followed by the dtype string
//! and the shape. Python writes NaN and infinities as bare `NaN`,
//! `Infinity`, `-Infinity`, which are not JSON: they are read as the strings `"NaN"`,
//! `"Infinity"` and `"-Infinity"` (the slice API's convention for non-finite numbers).
//! Spec: <https://numcodecs.readthedocs.io/en/stable/other/json.html>

use serde_json::Value;

use super::CodecError;
use crate::dtype::elements::{Content, Elements, VALUE_BYTES};

/// Text a json2 chunk may hold, for a decoded `limit`: parsed, a value takes up to
/// `size_of::<Value>()` bytes for every two bytes of text (`[]`, `0,`), ~40x, and about 10x
/// for ordinary numbers and strings. An eighth of the limit bounds the worst case at ~5x the
/// limit while parsing; what was parsed is then held to the limit itself.
pub(crate) const TEXT_SHARE: usize = 8;

/// Decodes a json2 chunk of `expected` items, up to `limit` bytes decoded.
pub fn decode(input: &[u8], expected: usize, limit: usize) -> Result<Elements, CodecError> {
    if input.len() > limit / TEXT_SHARE {
        return Err(CodecError::OverLimit(format!(
            "json2: {} bytes of text are more than the {} this server parses for one chunk",
            input.len(),
            limit / TEXT_SHARE
        )));
    }
    // Counted before parsing, at what each takes parsed: a chunk of empty lists (`[],[],...`)
    // holds a value in three bytes of text. Twice the limit, for a count that also has the
    // trailer and the rows of an n-d chunk: the items are held to the limit itself below.
    let values = crate::json_text::document_values(input);
    if values.saturating_mul(VALUE_BYTES) > limit.saturating_mul(2) {
        return Err(CodecError::OverLimit(format!(
            "json2: {values} values or more would take more than twice the limit of {limit} bytes parsed"
        )));
    }
    let text = std::str::from_utf8(input).map_err(|_| CodecError::Corrupt("json2: not UTF-8".into()))?;
    let value: Value = serde_json::from_str(&crate::json_text::quote_non_finite(text, ""))
        .map_err(|e| CodecError::Corrupt(format!("json2: not JSON ({e})")))?;
    items_of(value, expected, limit, "json2")
}

/// The `expected` items of a json2 or msgpack2 (`codec`) document: a list of the items (nested
/// as the chunk's shape for several dimensions) followed by the dtype string and the shape, held
/// to `limit` bytes.
pub(crate) fn items_of(value: Value, expected: usize, limit: usize, codec: &str) -> Result<Elements, CodecError> {
    let Value::Array(mut items) = value else {
        return Err(CodecError::Corrupt(format!("{codec}: not a list")));
    };
    // The last two entries are the dtype string and the shape.
    let shape = items.pop();
    let dtype = items.pop();
    let (Some(Value::Array(shape)), Some(Value::String(_))) = (shape, dtype) else {
        return Err(CodecError::Corrupt(format!("{codec}: missing dtype and shape trailer")));
    };
    // Items of an n-d chunk are nested n deep; elements that are lists themselves stay whole.
    for _ in 1..shape.len() {
        let mut flat = Vec::with_capacity(items.len());
        for row in items {
            match row {
                Value::Array(inner) => flat.extend(inner),
                _ => {
                    return Err(CodecError::Corrupt(format!(
                        "{codec}: items are not nested as the shape says"
                    )));
                }
            }
        }
        items = flat;
    }
    if items.len() != expected {
        return Err(CodecError::Corrupt(format!(
            "{codec}: {} items where the chunk holds {expected}",
            items.len()
        )));
    }
    let held = items
        .iter()
        .fold(0usize, |n, v| n.saturating_add(VALUE_BYTES + v.content()));
    if held > limit {
        return Err(CodecError::OverLimit(format!(
            "{codec}: {} items take {held} bytes parsed, more than the limit of {limit}",
            items.len()
        )));
    }
    Ok(Elements::Objects(items))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn decodes_items_and_non_finite_numbers() {
        let got = decode(
            br#"["text",1,2.5,NaN,"NaN in a string",-Infinity,-1e999,"|O",[7]]"#,
            7,
            1 << 20,
        )
        .unwrap();
        assert_eq!(
            got,
            Elements::Objects(vec![
                json!("text"),
                json!(1),
                json!(2.5),
                json!("NaN"),
                json!("NaN in a string"),
                json!("-Infinity"),
                json!("-Infinity")
            ])
        );
        assert!(decode(br#"["a","|O",[1]]"#, 2, 1 << 20).is_err());
        let nested = decode(br#"[["a",[1,2]],[null,"d"],"|O",[2,2]]"#, 4, 1 << 20).unwrap();
        assert_eq!(
            nested,
            Elements::Objects(vec![json!("a"), json!([1, 2]), json!(null), json!("d")])
        );
        assert!(decode(br#"["a","b","|O",[1,2]]"#, 2, 1 << 20).is_err());
        assert!(decode(br#"{"a": 1}"#, 1, 1 << 20).is_err());
        assert!(decode(b"[1,2", 1, 1 << 20).is_err());
        assert!(decode(br#"["a\"NaN",1,"|O",[2]]"#, 2, 1 << 20).is_ok());
        // Text up to an eighth of the limit is parsed; what it parses to is held to the limit.
        let many = format!("[{}\"|O\",[20000]]", "[1],".repeat(20000));
        let err = decode(many.as_bytes(), 20000, many.len() * 8 - 8).unwrap_err();
        assert!(matches!(err, CodecError::OverLimit(_)), "{err}");
        assert!(err.to_string().contains("more than the"), "{err}");
        let held = 20000 * (2 * std::mem::size_of::<Value>());
        let err = decode(many.as_bytes(), 20000, held - 1).unwrap_err();
        assert!(err.to_string().contains("bytes parsed, more than the limit"), "{err}");
        assert!(decode(many.as_bytes(), 20000, held).is_ok());
        // Empty lists, a value in three bytes: refused from their count, before parsing.
        let empty = format!("[{}\"|O\",[20000]]", "[],".repeat(20000));
        let err = decode(empty.as_bytes(), 20000, 20000 * VALUE_BYTES / 2).unwrap_err();
        assert!(
            err.to_string().contains("values or more would take more than twice"),
            "{err}"
        );
    }
}
