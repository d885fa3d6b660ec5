//! JSON output: `{"shape": [...], "dtype": "<typestr>", "data": nested lists}` (a scalar for
//! 0-d results). NaN and infinities are the strings "NaN", "Infinity", "-Infinity"; complex
//! numbers `[re, im]`; bytes base64; datetimes integers in their unit (NaT null); structured
//! elements objects by field name.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;

use super::{Region, Text, push_json_string, push_scalar};
use crate::dtype::DType;
use crate::dtype::elements::Elements;

/// Writes `shape`-nested lists, calling `item(out, flat_index)` for each element.
pub(crate) fn push_nested(out: &mut Vec<u8>, shape: &[u64], mut item: impl FnMut(&mut Vec<u8>, usize)) {
    fn rec(out: &mut Vec<u8>, shape: &[u64], base: usize, item: &mut dyn FnMut(&mut Vec<u8>, usize)) {
        match shape.split_first() {
            None => item(out, base),
            Some((&n, rest)) => {
                let inner = rest.iter().product::<u64>() as usize;
                out.push(b'[');
                for i in 0..n as usize {
                    if i > 0 {
                        out.push(b',');
                    }
                    rec(out, rest, base + i * inner, item);
                }
                out.push(b']');
            }
        }
    }
    rec(out, shape, 0, &mut item);
}

/// The document up to its data: `{"shape":[...],"dtype":...,"data":`.
pub fn push_head(out: &mut Vec<u8>, shape: &[u64], dtype: &DType) {
    out.extend_from_slice(b"{\"shape\":");
    let _ = serde_json::to_writer(&mut *out, shape);
    out.extend_from_slice(b",\"dtype\":");
    let _ = serde_json::to_writer(&mut *out, &dtype.descr());
    out.extend_from_slice(b",\"data\":");
}

/// Appends `rows` rows of fixed-size elements (C-order little-endian `bytes`), each as the
/// nested lists of `row_shape`, separated by commas; `first` says whether the first of them
/// opens its list (no comma before it). A document streamed in pieces of rows is the one
/// [`encode`] writes whole.
pub fn push_fixed_rows(out: &mut Vec<u8>, dtype: &DType, row_shape: &[u64], bytes: &[u8], rows: usize, first: bool) {
    let item = dtype.item_size().unwrap_or(0);
    let per_row = row_shape.iter().product::<u64>() as usize;
    for r in 0..rows {
        if r > 0 || !first {
            out.push(b',');
        }
        push_nested(out, row_shape, |out, i| {
            let at = (r * per_row + i) * item;
            push_scalar(out, dtype, &bytes[at..at + item], Text::Json)
        });
    }
}

/// Appends elements `elements` (C-order indices within one row of `row_shape`; `bytes` holds
/// just them) as [`push_fixed_rows`] writes them in that row, so that the parts of a row, in
/// order, write the whole row: its opening brackets come with its first element, its closing
/// ones with its last, and a comma before the row when `lead_comma` (it follows another).
pub fn push_row_part(
    out: &mut Vec<u8>,
    dtype: &DType,
    row_shape: &[u64],
    bytes: &[u8],
    elements: std::ops::Range<u64>,
    lead_comma: bool,
) {
    let item = dtype.item_size().unwrap_or(0).max(1);
    // strides[j]: elements in one index of dimension j - 1 (strides[0] is the row).
    let strides: Vec<u64> = (0..row_shape.len()).map(|j| row_shape[j..].iter().product()).collect();
    let n = strides.first().copied().unwrap_or(1);
    let depth = row_shape.len();
    for (i, b) in elements.zip(bytes.chunks_exact(item)) {
        if i == 0 {
            if lead_comma {
                out.push(b',');
            }
            out.extend(std::iter::repeat_n(b'[', depth));
        } else {
            // Lists that end before this element and begin again with it.
            let ends = strides[1..].iter().filter(|&&s| s > 0 && i % s == 0).count();
            out.extend(std::iter::repeat_n(b']', ends));
            out.push(b',');
            out.extend(std::iter::repeat_n(b'[', ends));
        }
        push_scalar(out, dtype, b, Text::Json);
        if i + 1 == n {
            out.extend(std::iter::repeat_n(b']', depth));
        }
    }
}

/// Encodes a region as the JSON document.
pub fn encode(region: &Region) -> Vec<u8> {
    let n: usize = region.shape.iter().product::<u64>() as usize;
    let item = region.dtype.item_size().unwrap_or(0);
    let mut out = Vec::with_capacity(64 + n * 8);
    push_head(&mut out, &region.shape, &region.dtype);
    match &region.elements {
        Elements::Fixed(bytes) => match region.shape.split_first() {
            Some((&rows, row_shape)) => {
                out.push(b'[');
                push_fixed_rows(&mut out, &region.dtype, row_shape, bytes, rows as usize, true);
                out.push(b']');
            }
            None => push_scalar(&mut out, &region.dtype, &bytes[..item], Text::Json),
        },
        Elements::Strings(v) => push_nested(&mut out, &region.shape, |out, i| match &v[i] {
            Some(s) => push_json_string(out, s),
            None => out.extend_from_slice(b"null"),
        }),
        Elements::Bytes(v) => push_nested(&mut out, &region.shape, |out, i| match &v[i] {
            Some(b) => push_json_string(out, &BASE64.encode(b)),
            None => out.extend_from_slice(b"null"),
        }),
        Elements::Objects(v) => push_nested(&mut out, &region.shape, |out, i| {
            let _ = serde_json::to_writer(&mut *out, &v[i]);
        }),
    }
    out.push(b'}');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{DType, Kind};
    use serde_json::{Value, json};

    /// A row written in parts, wherever it is cut, is the row written at once.
    #[test]
    fn rows_written_in_parts_are_rows() {
        let dtype = DType::new(Kind::Int(2));
        for row_shape in [vec![], vec![7], vec![1, 7], vec![3, 4], vec![2, 1, 3], vec![2, 3, 2]] {
            let per_row: u64 = row_shape.iter().product();
            let bytes: Vec<u8> = (0..per_row as i16 * 2).flat_map(|v| v.to_le_bytes()).collect();
            let mut whole = Vec::new();
            push_fixed_rows(&mut whole, &dtype, &row_shape, &bytes, 2, true);
            for cut in 1..=per_row {
                let mut parts = Vec::new();
                for row in 0..2u64 {
                    let mut start = 0;
                    while start < per_row {
                        let end = (start + cut).min(per_row);
                        let at = |e: u64| ((row * per_row + e) * 2) as usize;
                        push_row_part(
                            &mut parts,
                            &dtype,
                            &row_shape,
                            &bytes[at(start)..at(end)],
                            start..end,
                            row > 0,
                        );
                        start = end;
                    }
                }
                assert_eq!(
                    String::from_utf8_lossy(&parts),
                    String::from_utf8_lossy(&whole),
                    "{row_shape:?} cut every {cut}"
                );
            }
        }
    }

    fn region(kind: Kind, shape: Vec<u64>, elements: Elements) -> Region {
        Region {
            shape,
            dtype: DType::new(kind),
            elements,
            fill: None,
        }
    }

    fn parse(r: &Region) -> Value {
        serde_json::from_slice(&encode(r)).unwrap()
    }

    #[test]
    fn numbers_and_special_floats() {
        let f: Vec<u8> = [1.5f32, f32::NAN, f32::INFINITY, -0.1, f32::NEG_INFINITY, 3.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let v = parse(&region(Kind::Float(4), vec![2, 3], Elements::Fixed(f)));
        assert_eq!(
            v,
            json!({"shape": [2, 3], "dtype": "<f4", "data": [[1.5, "NaN", "Infinity"], [-0.1, "-Infinity", 3.0]]})
        );
        let i: Vec<u8> = [-1i16, 300].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(
            parse(&region(Kind::Int(2), vec![2], Elements::Fixed(i)))["data"],
            json!([-1, 300])
        );
        let u = u64::MAX.to_le_bytes().to_vec();
        assert_eq!(
            parse(&region(Kind::UInt(8), vec![], Elements::Fixed(u)))["data"],
            json!(u64::MAX)
        );
    }

    #[test]
    fn other_kinds() {
        let c: Vec<u8> = [1.0f64, -2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(
            parse(&region(Kind::Complex(16), vec![1], Elements::Fixed(c)))["data"],
            json!([[1.0, -2.0]])
        );
        let t: Vec<u8> = [5i64, i64::MIN].iter().flat_map(|v| v.to_le_bytes()).collect();
        let r = region(Kind::DateTime("s".into()), vec![2], Elements::Fixed(t));
        assert_eq!(parse(&r), json!({"shape": [2], "dtype": "<M8[s]", "data": [5, null]}));
        let s = region(
            Kind::String,
            vec![2],
            Elements::Strings(vec![Some("a\"b".into()), None]),
        );
        assert_eq!(parse(&s)["data"], json!(["a\"b", null]));
        let b = region(Kind::FixedBytes(3), vec![1], Elements::Fixed(b"abc".to_vec()));
        assert_eq!(parse(&b)["data"], json!(["YWJj"]));
        // As NumPy reads them: `S` values end at their trailing NULs (b"a\0b", b""), `V` values
        // are all their bytes.
        let padded = b"a\0b\0\0\0\0\0\0".to_vec();
        let b = region(Kind::FixedBytes(3), vec![3], Elements::Fixed(padded.clone()));
        assert_eq!(
            parse(&b),
            json!({"shape": [3], "dtype": "|S3", "data": ["YQBi", "", ""]})
        );
        let v = region(Kind::Raw(3), vec![3], Elements::Fixed(padded));
        assert_eq!(
            parse(&v),
            json!({"shape": [3], "dtype": "|V3", "data": ["YQBi", "AAAA", "AAAA"]})
        );
        let u = region(
            Kind::FixedUnicode(2),
            vec![1],
            Elements::Fixed([b'h', 0, 0, 0, 0, 0, 0, 0].to_vec()),
        );
        assert_eq!(parse(&u)["data"], json!(["h"]));
        // Lone surrogates, which `<U` holds, are escaped as Python's json.dumps escapes them
        // (`json.dumps(str(np.array(['a\udc80"b', '\ud800', '\udfff\x01'], '<U4')[i]))`).
        let units: [[u32; 4]; 3] = [[0x61, 0xDC80, 0x22, 0x62], [0xD800, 0, 0, 0], [0xDFFF, 1, 0, 0]];
        let bytes: Vec<u8> = units.iter().flatten().flat_map(|u| u.to_le_bytes()).collect();
        let mut out = Vec::new();
        for (i, want) in [r#""a\udc80\"b""#, r#""\ud800""#, r#""\udfff\u0001""#]
            .into_iter()
            .enumerate()
        {
            out.clear();
            push_fixed_rows(
                &mut out,
                &DType::new(Kind::FixedUnicode(4)),
                &[],
                &bytes[16 * i..16 * (i + 1)],
                1,
                true,
            );
            assert_eq!(String::from_utf8_lossy(&out), want);
        }
        let st = DType::from_v2(&json!([["a", "<i2"], ["b", "|u1", [2]]])).unwrap();
        let r = Region {
            shape: vec![1],
            dtype: st,
            elements: Elements::Fixed(vec![7, 0, 1, 2]),
            fill: None,
        };
        assert_eq!(parse(&r)["data"], json!([{"a": 7, "b": [1, 2]}]));
        let empty = region(Kind::Int(1), vec![0, 3], Elements::Fixed(vec![]));
        assert_eq!(parse(&empty)["data"], json!([]));
    }
}
