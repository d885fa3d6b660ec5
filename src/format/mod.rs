//! Output encoders of slice responses: JSON, raw binary, NumPy .npy, CSV and PNG.
//!
//! All of them take a [`Region`]: the decoded elements of a selection in C order, with the
//! result shape and the (little-endian) data type.

pub mod bin;
pub mod csv;
pub mod json;
pub mod png;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;

use crate::dtype::elements::Elements;
use crate::dtype::{DType, Kind};

/// A decoded region ready to encode.
#[derive(Debug, Clone)]
pub struct Region {
    /// Result shape (integer-selected dimensions dropped).
    pub shape: Vec<u64>,
    /// Element type, little-endian.
    pub dtype: DType,
    /// The elements, C order.
    pub elements: Elements,
    /// The fill value as one element, where fixed-size (PNG makes it transparent).
    pub fill: Option<Vec<u8>>,
}

/// Why a region cannot be encoded in a format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// The request asks for something the format cannot express (400).
    #[error("{0}")]
    BadRequest(String),
    /// The data type cannot be written in this format (422).
    #[error("{0}")]
    Unsupported(String),
}

/// The bytes the variable-length elements of a region take in `format`, which are known only
/// once they are read: bin and npy write every element at the width of the longest (strings as
/// UTF-32), the text formats write each at its own length. `None` for other elements, whose
/// size is checked before reading.
pub fn variable_bytes(elements: &Elements, format: Format) -> Option<u64> {
    let fixed = matches!(format, Format::Bin | Format::Npy);
    let (n, longest, total) = match elements {
        Elements::Strings(v) => v.iter().fold((0u64, 0u64, 0u64), |(n, m, t), s| {
            let s = s.as_deref().unwrap_or("");
            // UTF-32 takes four bytes a character; the text formats the UTF-8 length with what
            // they escape (JSON writes a control character as six bytes, CSV doubles quotes).
            let w = match format {
                Format::Bin | Format::Npy => s.chars().count() as u64 * 4,
                Format::Json => s
                    .bytes()
                    .map(|b| match b {
                        b'"' | b'\\' => 2,
                        0..=0x1f => 6,
                        _ => 1,
                    })
                    .sum(),
                Format::Csv | Format::Png => s.bytes().map(|b| if b == b'"' { 2 } else { 1 }).sum(),
            };
            (n + 1, m.max(w), t.saturating_add(w))
        }),
        Elements::Bytes(v) => v.iter().fold((0u64, 0u64, 0u64), |(n, m, t), b| {
            let len = b.as_ref().map_or(0, Vec::len) as u64;
            // Base64 in the text formats.
            let w = if fixed { len } else { len.div_ceil(3) * 4 };
            (n + 1, m.max(w), t.saturating_add(w))
        }),
        Elements::Fixed(_) | Elements::Objects(_) => return None,
    };
    Some(if fixed { n.saturating_mul(longest.max(1)) } else { total })
}

/// The output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `application/json`
    Json,
    /// `application/octet-stream`
    Bin,
    /// `application/x-npy`
    Npy,
    /// `text/csv`
    Csv,
    /// `image/png`
    Png,
}

/// The media ranges of an `Accept` header: (type, subtype, quality), lower-cased, in the order
/// listed; a range that is no `type/subtype`, or whose `q` is no number from 0 to 1, is left
/// out.
pub(crate) fn media_ranges(accept: &str) -> impl Iterator<Item = (String, String, f32)> + '_ {
    accept.split(',').filter_map(|part| {
        let mut params = part.split(';');
        let (kind, sub) = params.next()?.trim().split_once('/')?;
        let q = quality(params)?;
        Some((kind.trim().to_ascii_lowercase(), sub.trim().to_ascii_lowercase(), q))
    })
}

/// The weight (`q`) among the parameters of an item of `Accept` or `Accept-Encoding`: 1 when
/// none is given; `None` when it is no number from 0 to 1.
pub(crate) fn quality<'a>(mut params: impl Iterator<Item = &'a str>) -> Option<f32> {
    params
        .find_map(|p| p.split_once('=').filter(|(k, _)| k.trim().eq_ignore_ascii_case("q")))
        .map_or(Some(1.0), |(_, v)| {
            v.trim().parse::<f32>().ok().filter(|q| (0.0..=1.0).contains(q))
        })
}

impl Format {
    /// From the `format` query parameter.
    pub fn from_name(name: &str) -> Option<Format> {
        Some(match name {
            "json" => Format::Json,
            "bin" | "binary" => Format::Bin,
            "npy" => Format::Npy,
            "csv" => Format::Csv,
            "png" => Format::Png,
            _ => return None,
        })
    }

    /// This format as a list of one.
    pub fn alone(self) -> &'static [Format] {
        match self {
            Format::Json => &[Format::Json],
            Format::Bin => &[Format::Bin],
            Format::Npy => &[Format::Npy],
            Format::Csv => &[Format::Csv],
            Format::Png => &[Format::Png],
        }
    }

    /// From an `Accept` header (RFC 9110 §12.5.1): the format with the highest weight (the
    /// first of [`Self::accepted`]). `None` when no format is acceptable.
    pub fn from_accept(accept: &str) -> Option<Format> {
        Self::accepted(accept).first().copied()
    }

    /// The formats an `Accept` header accepts, best first: by weight, where a format's weight
    /// is the `q` of the most specific range naming it (`image/png` over `image/*` over
    /// `*/*`); ties go to the more specific range, then to the one listed first, then to JSON.
    /// Empty when none is acceptable (`q=0` for all, or none named).
    pub fn accepted(accept: &str) -> Vec<Format> {
        const ALL: [(Format, &str, &str); 6] = [
            (Format::Json, "application", "json"),
            (Format::Bin, "application", "octet-stream"),
            (Format::Npy, "application", "x-npy"),
            (Format::Npy, "application", "npy"),
            (Format::Csv, "text", "csv"),
            (Format::Png, "image", "png"),
        ];
        let ranges: Vec<(String, String, f32)> = media_ranges(accept).collect();
        // (q, specificity, -position) of the best range for each of our media types.
        let mut ranked: Vec<((f32, u8, isize), Format)> = Vec::new();
        for (format, kind, sub) in ALL {
            let matched = ranges
                .iter()
                .enumerate()
                .filter_map(|(i, (k, s, q))| {
                    let specificity = match (k.as_str(), s.as_str()) {
                        (k, s) if k == kind && s == sub => 2,
                        (k, "*") if k == kind => 1,
                        ("*", "*") => 0,
                        _ => return None,
                    };
                    Some((specificity, i, *q))
                })
                // The most specific range decides; among equals, the first listed.
                .max_by_key(|&(specificity, i, _)| (specificity, std::cmp::Reverse(i)));
            if let Some((specificity, i, q)) = matched.filter(|m| m.2 > 0.0) {
                let rank = (q, specificity, -(i as isize));
                match ranked.iter_mut().find(|(_, f)| *f == format) {
                    // npy has two names: the better one counts.
                    Some(had) if rank > had.0 => had.0 = rank,
                    Some(_) => {}
                    None => ranked.push((rank, format)),
                }
            }
        }
        // Stable: equal ranks keep the order above, JSON first.
        ranked.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap_or(std::cmp::Ordering::Equal));
        ranked.into_iter().map(|(_, f)| f).collect()
    }

    /// The name the `format` parameter gives.
    pub fn name(self) -> &'static str {
        match self {
            Format::Json => "json",
            Format::Bin => "bin",
            Format::Npy => "npy",
            Format::Csv => "csv",
            Format::Png => "png",
        }
    }

    /// The Content-Type of responses.
    pub fn content_type(self) -> axum::http::HeaderValue {
        use axum::http::HeaderValue;
        // Checked when compiled: `from_static` checks its text on each call otherwise.
        const JSON: HeaderValue = HeaderValue::from_static("application/json");
        const BIN: HeaderValue = HeaderValue::from_static("application/octet-stream");
        const NPY: HeaderValue = HeaderValue::from_static("application/x-npy");
        const CSV: HeaderValue = HeaderValue::from_static("text/csv; charset=utf-8");
        const PNG: HeaderValue = HeaderValue::from_static("image/png");
        match self {
            Format::Json => JSON,
            Format::Bin => BIN,
            Format::Npy => NPY,
            Format::Csv => CSV,
            Format::Png => PNG,
        }
    }
}

/// A scalar float read from an element of a float or integer type.
#[inline]
pub fn as_f64(dtype: &DType, b: &[u8]) -> Option<f64> {
    let arr8 = |b: &[u8]| -> [u8; 8] {
        let mut a = [0u8; 8];
        a[..b.len().min(8)].copy_from_slice(&b[..b.len().min(8)]);
        a
    };
    Some(match dtype.kind {
        Kind::Bool => b[0] as f64,
        Kind::Float(2) => half::f16::from_le_bytes([b[0], b[1]]).to_f64(),
        Kind::Float(4) => f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
        Kind::Float(8) => f64::from_le_bytes(arr8(b)),
        Kind::Int(n) => {
            let shift = 64 - 8 * n as u32;
            ((i64::from_le_bytes(arr8(&b[..n])) << shift) >> shift) as f64
        }
        Kind::UInt(n) => u64::from_le_bytes(arr8(&b[..n])) as f64,
        _ => return None,
    })
}

/// Appends a float of `size` bytes the way JSON output writes it: the shortest digits that
/// read back as the same value of that size, non-finite as the strings "NaN", "Infinity",
/// "-Infinity" (quoted when `quote`).
fn push_float(out: &mut Vec<u8>, x: f64, size: usize, quote: bool) {
    if x.is_finite() {
        let mut buf = ryu::Buffer::new();
        let s = match size {
            2 => buf.format(shortest_half(x)),
            4 => buf.format(x as f32),
            _ => buf.format(x),
        };
        out.extend_from_slice(s.as_bytes());
    } else {
        let s = if x.is_nan() {
            "NaN"
        } else if x > 0.0 {
            "Infinity"
        } else {
            "-Infinity"
        };
        if quote {
            out.push(b'"');
        }
        out.extend_from_slice(s.as_bytes());
        if quote {
            out.push(b'"');
        }
    }
}

/// The float16 `x` (as f64) as the decimal of fewest digits that reads back as it (0.1, where
/// its own digits are 0.0999755859375): ryu knows no float16. Found by trying 1 to 5
/// significant digits, once for each of the 65,536 float16s (a table of 512 KiB, made on first
/// use in some 50 ms), not per element written.
pub(crate) fn shortest_half(x: f64) -> f64 {
    static TABLE: std::sync::OnceLock<Box<[f64]>> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|bits| {
                let x = f64::from(half::f16::from_bits(bits));
                (1..=5)
                    .filter_map(|digits| format!("{x:.*e}", digits - 1).parse::<f64>().ok())
                    .find(|y| crate::codec::numeric::f16_from_f64(*y).to_bits() == bits)
                    .unwrap_or(x)
            })
            .collect()
    });
    table[usize::from(crate::codec::numeric::f16_from_f64(x).to_bits())]
}

/// How a scalar is written in text formats.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Text {
    Json,
    Csv,
}

/// Decodes fixed-width UTF-32 (trailing NULs dropped, as NumPy does).
pub fn utf32_to_string(b: &[u8]) -> String {
    let s: String = b
        .chunks_exact(4)
        .map(|c| char::from_u32(u32::from_le_bytes([c[0], c[1], c[2], c[3]])).unwrap_or('\u{FFFD}'))
        .collect();
    s.trim_end_matches('\0').to_owned()
}

fn push_json_string(out: &mut Vec<u8>, s: &str) {
    // serde_json's string escaping cannot fail on a Vec.
    let _ = serde_json::to_writer(&mut *out, s);
}

/// Fixed-width UTF-32 text (trailing NULs dropped) as a JSON string, as Python's `json.dumps`
/// writes NumPy's: a lone surrogate, which `<U` holds (text decoded with `surrogateescape`,
/// say), is its `\uXXXX` escape rather than U+FFFD, so that a JSON reader gets the string NumPy
/// holds. Code units past U+10FFFF, which no text holds, are U+FFFD, as in [`utf32_to_string`].
fn push_utf32_json(out: &mut Vec<u8>, b: &[u8]) {
    let unit = |c: &[u8]| u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    let surrogate = |u: u32| (0xD800..=0xDFFF).contains(&u);
    if !b.chunks_exact(4).any(|c| surrogate(unit(c))) {
        return push_json_string(out, &utf32_to_string(b));
    }
    let units: Vec<u32> = b.chunks_exact(4).map(unit).collect();
    let end = units.iter().rposition(|&u| u != 0).map_or(0, |i| i + 1);
    // A run of text escaped as JSON does, without its quotes.
    let push_run = |out: &mut Vec<u8>, run: &str| {
        let quoted = serde_json::to_vec(run).unwrap_or_default();
        out.extend_from_slice(quoted.get(1..quoted.len().saturating_sub(1)).unwrap_or_default());
    };
    out.push(b'"');
    let mut run = String::new();
    for &u in &units[..end] {
        if surrogate(u) {
            push_run(out, &run);
            run.clear();
            out.extend_from_slice(format!("\\u{u:04x}").as_bytes());
        } else {
            run.push(char::from_u32(u).unwrap_or('\u{FFFD}'));
        }
    }
    push_run(out, &run);
    out.push(b'"');
}

/// Writes one fixed-size element as text.
fn push_scalar(out: &mut Vec<u8>, dtype: &DType, b: &[u8], mode: Text) {
    let mut ibuf = itoa::Buffer::new();
    match &dtype.kind {
        Kind::Bool => out.extend_from_slice(if b[0] != 0 { b"true" } else { b"false" }),
        Kind::Int(_) | Kind::UInt(_) => {
            let mut a = [0u8; 8];
            let n = b.len().min(8);
            a[..n].copy_from_slice(&b[..n]);
            if matches!(dtype.kind, Kind::UInt(_)) {
                out.extend_from_slice(ibuf.format(u64::from_le_bytes(a)).as_bytes());
            } else {
                let shift = 64 - 8 * n as u32;
                out.extend_from_slice(ibuf.format((i64::from_le_bytes(a) << shift) >> shift).as_bytes());
            }
        }
        Kind::Float(n) => push_float(out, as_f64(dtype, b).unwrap_or(f64::NAN), *n, mode == Text::Json),
        Kind::Complex(n) => {
            let half = n / 2;
            let part = |p: &[u8]| -> f64 {
                if half == 4 {
                    f32::from_le_bytes([p[0], p[1], p[2], p[3]]) as f64
                } else {
                    f64::from_le_bytes([p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7]])
                }
            };
            let (re, im) = (part(&b[..half]), part(&b[half..]));
            match mode {
                Text::Json => {
                    out.push(b'[');
                    push_float(out, re, half, true);
                    out.push(b',');
                    push_float(out, im, half, true);
                    out.push(b']');
                }
                Text::Csv => {
                    push_float(out, re, half, false);
                    // -0.0 writes its own sign (`1.0-0.0j`, as NumPy and Python read it).
                    if im.is_sign_positive() || im.is_nan() {
                        out.push(b'+');
                    }
                    push_float(out, im, half, false);
                    out.push(b'j');
                }
            }
        }
        Kind::DateTime(_) | Kind::TimeDelta(_) => {
            let v = i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
            if v == i64::MIN {
                out.extend_from_slice(if mode == Text::Json { b"null" } else { b"NaT" });
            } else {
                out.extend_from_slice(ibuf.format(v).as_bytes());
            }
        }
        Kind::FixedBytes(_) | Kind::Raw(_) => {
            // NumPy reads an `S` value up to its trailing NULs (the padding); `V` keeps them all.
            let value = match dtype.kind {
                Kind::FixedBytes(_) => &b[..b.iter().rposition(|&x| x != 0).map_or(0, |i| i + 1)],
                _ => b,
            };
            let text = BASE64.encode(value);
            if mode == Text::Json {
                push_json_string(out, &text);
            } else {
                out.extend_from_slice(text.as_bytes());
            }
        }
        Kind::FixedUnicode(_) => match mode {
            Text::Json => push_utf32_json(out, b),
            Text::Csv => csv::push_field(out, &utf32_to_string(b)),
        },
        Kind::Structured(fields) => {
            out.push(b'{');
            let mut offset = 0;
            for (i, f) in fields.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                push_json_string(out, &f.name);
                out.push(b':');
                let size = f.dtype.item_size().unwrap_or(0);
                let count: usize = f.shape.iter().product();
                let bytes = &b[offset..offset + size * count];
                let shape: Vec<u64> = f.shape.iter().map(|&d| d as u64).collect();
                json::push_nested(out, &shape, |out, i| {
                    push_scalar(out, &f.dtype, &bytes[i * size..(i + 1) * size], Text::Json)
                });
                offset += size * count;
            }
            out.push(b'}');
        }
        Kind::String | Kind::Bytes | Kind::Object => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// float16 values are written in the fewest digits that read back as the same float16
    /// (through f64, as a client parsing JSON reads them), for every finite one.
    #[test]
    fn float16_is_written_in_its_own_shortest_digits() {
        let text = |x: f64| {
            let mut out = Vec::new();
            push_float(&mut out, x, 2, true);
            String::from_utf8(out).unwrap()
        };
        let h = |v: f32| f64::from(half::f16::from_f32(v));
        assert_eq!(text(h(0.1)), "0.1");
        assert_eq!(text(h(65504.0)), "65500.0", "as NumPy writes it");
        assert_eq!(text(h(-0.0)), "-0.0");
        assert_eq!(text(h(1.0 / 3.0)), "0.3333");
        assert_eq!(text(f64::from(half::f16::from_bits(1))), "6e-8");
        for bits in 0..=u16::MAX {
            let x = half::f16::from_bits(bits);
            if !x.is_finite() {
                continue;
            }
            let back: f64 = text(f64::from(x)).parse().unwrap();
            assert_eq!(crate::codec::numeric::f16_from_f64(back).to_bits(), bits, "{x}");
        }
    }

    /// Variable-length text is counted as each format writes it, escapes included, and the
    /// count is at least what the encoder writes for the elements themselves.
    #[test]
    fn variable_bytes_count_escapes() {
        let strings = Elements::Strings(vec![
            Some("\u{1}\u{2}".into()),
            Some("a\"b".into()),
            None,
            Some("é".into()),
        ]);
        assert_eq!(variable_bytes(&strings, Format::Json), Some(12 + 4 + 2)); // None writes nothing
        assert_eq!(variable_bytes(&strings, Format::Csv), Some(2 + 4 + 2));
        assert_eq!(variable_bytes(&strings, Format::Bin), Some(4 * 3 * 4));
        let region = Region {
            shape: vec![4],
            dtype: crate::dtype::DType::new(crate::dtype::Kind::String),
            elements: strings,
            fill: None,
        };
        // What the encoder writes for the strings themselves (their JSON without the quotes)
        // is no more than what was counted.
        let json_text = String::from_utf8(json::encode(&region)).unwrap();
        let doc: serde_json::Value = serde_json::from_str(&json_text).unwrap();
        assert_eq!(doc["data"], serde_json::json!(["\u{1}\u{2}", "a\"b", null, "é"]));
        let written: usize = ["\u{1}\u{2}", "a\"b", "é"]
            .iter()
            .map(|s| {
                let quoted = serde_json::to_string(s).unwrap();
                assert!(json_text.contains(&quoted), "{json_text}");
                quoted.len() - 2
            })
            .sum();
        assert!(written as u64 <= variable_bytes(&region.elements, Format::Json).unwrap());
        assert_eq!(variable_bytes(&Elements::Fixed(vec![0; 8]), Format::Json), None);
    }

    #[test]
    fn accept_weighs_q_values_and_wildcards() {
        let cases: [(&str, Option<Format>); 14] = [
            ("application/json", Some(Format::Json)),
            ("text/csv", Some(Format::Csv)),
            ("APPLICATION/X-NPY", Some(Format::Npy)),
            ("image/png;q=0, application/json", Some(Format::Json)),
            ("text/csv;q=0.1, application/json", Some(Format::Json)),
            ("application/octet-stream;q=0.5, text/csv;q=0.9", Some(Format::Csv)),
            // Chrome's Accept for <img>.
            (
                "image/avif,image/webp,image/apng,image/svg+xml,image/*,*/*;q=0.8",
                Some(Format::Png),
            ),
            ("*/*", Some(Format::Json)),
            ("application/*", Some(Format::Json)),
            ("image/png;q=0, */*", Some(Format::Json)),
            // Equal weights: the more specific range wins.
            ("text/*;q=0.5, application/x-npy;q=0.5", Some(Format::Npy)),
            // A malformed q drops its range.
            ("application/json;q=abc, text/csv", Some(Format::Csv)),
            ("text/html", None),
            ("*/*;q=0", None),
        ];
        for (accept, want) in cases {
            assert_eq!(Format::from_accept(accept), want, "{accept}");
        }
        // All of them, best first (for a result the best cannot hold).
        use Format::*;
        assert_eq!(Format::accepted("text/csv, */*;q=0.1"), [Csv, Json, Bin, Npy, Png]);
        assert_eq!(
            Format::accepted("application/npy;q=0.2, application/x-npy;q=0.7, image/png;q=0.5"),
            [Npy, Png]
        );
        assert_eq!(Format::accepted("image/png"), [Png]);
    }

    #[test]
    fn variable_length_sizes_per_format() {
        let strings = Elements::Strings(vec![Some("ab".into()), None, Some("é".into())]);
        // Fixed width: three elements of the longest (two characters, UTF-32).
        assert_eq!(variable_bytes(&strings, Format::Npy), Some(3 * 2 * 4));
        assert_eq!(variable_bytes(&strings, Format::Bin), Some(3 * 2 * 4));
        // Text: their own UTF-8 lengths.
        assert_eq!(variable_bytes(&strings, Format::Json), Some(2 + 2));
        let bytes = Elements::Bytes(vec![Some(vec![1, 2, 3, 4]), Some(vec![])]);
        assert_eq!(variable_bytes(&bytes, Format::Bin), Some(2 * 4));
        assert_eq!(variable_bytes(&bytes, Format::Csv), Some(8));
        assert_eq!(variable_bytes(&Elements::Fixed(vec![0; 8]), Format::Json), None);
    }
}
