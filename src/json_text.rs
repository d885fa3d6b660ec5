//! JSON text as Zarr metadata holds it: counting its values before it is parsed, and Python's
//! bare non-finite literals (`NaN`, `Infinity`, `-Infinity`), read as marked strings and written
//! back bare. Plain functions over text and `serde_json` values, below every other module.

use serde_json::Value;

/// The most values a metadata document may hold (counted in its text before it is parsed):
/// parsed, they take some 96 bytes each, some 400 MiB for this many, where the document's text
/// (at most 64 MiB) could otherwise hold twenty million (`[],[],...`) and take gigabytes.
/// Real documents hold far fewer: the consolidated metadata of 100,000 arrays, some two million.
pub const MAX_DOCUMENT_VALUES: usize = 1 << 22;

/// How many JSON values `text` holds (one, and for each container that is not empty one more
/// than the commas in it), counted up to [`MAX_DOCUMENT_VALUES`] and one more.
pub fn document_values(text: &[u8]) -> usize {
    let (mut n, mut in_string, mut escaped, mut opened) = (1usize, false, false, false);
    for &b in text {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        if b.is_ascii_whitespace() {
            continue;
        }
        // The first thing in a container: it holds a value unless this closes it.
        if std::mem::take(&mut opened) && b != b']' && b != b'}' {
            n += 1;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => opened = true,
            b',' => n += 1,
            _ => {}
        }
        if n > MAX_DOCUMENT_VALUES {
            break;
        }
    }
    n
}

/// Quotes the bare non-finite literals Python's json module writes (`NaN`, `Infinity`,
/// `-Infinity`) and reads (those, and float literals too large for a double, such as `1e400`):
/// each becomes the JSON string of `mark` (JSON text, so escaped where it must be) and the
/// literal. A string of the text that begins with `mark` gets it twice, so that it is told
/// apart from a quoted literal ([`escape_marked`]).
pub fn quote_non_finite(text: &str, mark: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    let mut in_string = false;
    let mut escaped = false;
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
            rest = &rest[c.len_utf8()..];
            continue;
        }
        let literal = ["-Infinity", "Infinity", "NaN"]
            .into_iter()
            .find(|l| rest.starts_with(l));
        if let Some(l) = literal {
            push_marked(&mut out, mark, l);
            rest = &rest[l.len()..];
            continue;
        }
        if c == '-' || c.is_ascii_digit() {
            let end = rest
                .find(|c: char| !(c.is_ascii_digit() || "+-.eE".contains(c)))
                .unwrap_or(rest.len());
            let number = &rest[..end];
            // Only an exponent or more than 308 digits can take a number past a double.
            let may_overflow = number.contains(['e', 'E']) || number.len() > 308;
            match number.parse::<f64>().ok().filter(|_| may_overflow) {
                // A float literal beyond f64's range, which Python's json module reads as an
                // infinity (and writes back as `Infinity`).
                Some(v) if v.is_infinite() && number.contains(['.', 'e', 'E']) => {
                    push_marked(&mut out, mark, if v < 0.0 { "-Infinity" } else { "Infinity" })
                }
                _ => out.push_str(number),
            }
            rest = &rest[end..];
            continue;
        }
        if c == '"' {
            in_string = true;
            if !mark.is_empty() && rest[1..].starts_with(mark) {
                out.push('"');
                out.push_str(mark);
                rest = &rest[1..];
                continue;
            }
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// Marks `value`'s strings (and names) that begin with `mark` with it once more: a string of
/// the mark and a literal is then only ever a quoted literal, and stripping one mark gives
/// every other string back.
pub fn escape_marked(value: &mut Value, mark: &str) {
    rewrite_strings(value, &|s| s.starts_with(mark).then(|| format!("{mark}{s}")));
}

/// Replaces each string of `value`, and each name of its objects, for which `new` gives a
/// replacement (names keep their order).
pub fn rewrite_strings(value: &mut Value, new: &impl Fn(&str) -> Option<String>) {
    match value {
        Value::String(s) => {
            if let Some(n) = new(s) {
                *s = n;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| rewrite_strings(v, new)),
        Value::Object(map) => {
            if map.keys().any(|k| new(k).is_some()) {
                *map = std::mem::take(map)
                    .into_iter()
                    .map(|(k, v)| (new(&k).unwrap_or(k), v))
                    .collect();
            }
            map.values_mut().for_each(|v| rewrite_strings(v, new));
        }
        _ => {}
    }
}

fn push_marked(out: &mut String, mark: &str, literal: &str) {
    out.push('"');
    out.push_str(mark);
    out.push_str(literal);
    out.push('"');
}

/// Parses a metadata document as zarr-python reads it: JSON, where Python's json module may
/// have written bare `NaN`, `Infinity` or `-Infinity` (attributes such as `missing_value`), and
/// reads a float beyond a double's range as an infinity. Those are read as the strings of
/// `mark` and the literal ([`quote_non_finite`]); with a mark, the document's own strings that
/// begin with it get it twice.
pub fn parse_document(bytes: &[u8], mark: &str) -> serde_json::Result<Value> {
    /// Whether a number of `value` is beyond a double's range (`1e400`): serde_json keeps its
    /// digits (numbers are read as their text, so that integers past 64 bits keep theirs), where
    /// Python reads an infinity.
    fn overflows(value: &Value) -> bool {
        match value {
            Value::Number(n) => n.as_f64().is_none(),
            Value::Array(items) => items.iter().any(overflows),
            Value::Object(fields) => fields.values().any(overflows),
            _ => false,
        }
    }
    match serde_json::from_slice::<Value>(bytes) {
        Ok(value) if overflows(&value) => match std::str::from_utf8(bytes) {
            Ok(text) => serde_json::from_str(&quote_non_finite(text, mark)),
            Err(_) => Ok(value),
        },
        Ok(mut value) => {
            if !mark.is_empty() {
                let mark: String = serde_json::from_str(&format!("\"{mark}\""))?;
                escape_marked(&mut value, &mark);
            }
            Ok(value)
        }
        Err(e) => match std::str::from_utf8(bytes) {
            Ok(text) => {
                let quoted = quote_non_finite(text, mark);
                if quoted == text {
                    return Err(e);
                }
                serde_json::from_str(&quoted)
            }
            Err(_) => Err(e),
        },
    }
}

/// How a bare `NaN`, `Infinity` or `-Infinity` of a stored document is held in a hierarchy:
/// a string of this mark and the literal. Consolidated metadata writes the literal back as it
/// was stored ([`bare_non_finite`]); the Zarr Object Model shows it as the plain string
/// ([`unmark_non_finite`]), as slices show non-finite values. The documents' own strings that
/// begin with the mark are held with it twice (see [`parse_document`]): taking one mark off any
/// string that has one gives back the plain string either way.
pub const NON_FINITE: &str = "\u{1}";

/// [`NON_FINITE`] as JSON text.
pub const NON_FINITE_JSON: &str = "\\u0001";

/// A consolidated document's text (as serde_json writes it) with the marked non-finite numbers
/// written bare again, and the mark taken off the strings that begin with it.
pub fn bare_non_finite(text: String) -> String {
    if !text.contains(NON_FINITE_JSON) {
        return text;
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(open) = rest.find('"') {
        // The string's end: the next quote not escaped.
        let body = &rest[open + 1..];
        let mut end = None;
        let mut bytes = body.bytes().enumerate();
        while let Some((i, b)) = bytes.next() {
            match b {
                b'\\' => {
                    bytes.next();
                }
                b'"' => {
                    end = Some(i);
                    break;
                }
                _ => {}
            }
        }
        let Some(end) = end else { break };
        out.push_str(&rest[..open]);
        match body[..end].strip_prefix(NON_FINITE_JSON) {
            Some(l) if ["NaN", "Infinity", "-Infinity"].contains(&l) => out.push_str(l),
            Some(own) => {
                out.push('"');
                out.push_str(own);
                out.push('"');
            }
            None => out.push_str(&rest[open..open + end + 2]),
        }
        rest = &body[end + 1..];
    }
    out.push_str(rest);
    out
}

/// Takes the mark off the strings (and names) of `value` that have one: the marked non-finite
/// numbers become their plain strings, the others what was stored.
pub fn unmark_non_finite(value: &mut Value) {
    rewrite_strings(value, &|s| s.strip_prefix(NON_FINITE).map(str::to_owned));
}
