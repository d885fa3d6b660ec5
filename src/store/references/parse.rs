//! kerchunk's reference files (version 0 and 1) into a table of keys: inline bytes, or byte
//! ranges of other objects named by URL. `templates` and `gen` (version 1) are expanded here.

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::Engine;
use bytes::Bytes;
use serde_json::Value;

/// The most keys `gen` may make, all entries together: each takes some hundred bytes.
pub const MAX_GENERATED: u64 = 10_000_000;

/// The longest key or URL a template may render: longer is refused, so that a small file
/// cannot render gigabytes.
pub const MAX_RENDERED: usize = 4096;

/// What a key of a reference set holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reference {
    /// Its bytes, in the reference file.
    Inline(Bytes),
    /// All of the object at `url`.
    Whole { url: Arc<str> },
    /// `length` bytes of the object at `url`, from `offset`.
    Range { url: Arc<str>, offset: u64, length: u64 },
}

/// Reads a reference file's text into its keys, by name.
pub fn parse(text: &[u8]) -> Result<BTreeMap<String, Reference>, String> {
    let doc: Value = serde_json::from_slice(text).map_err(|e| format!("not JSON: {e}"))?;
    let Value::Object(mut doc) = doc else {
        return Err("not a JSON object".into());
    };
    let version = doc.get("version").and_then(Value::as_u64);
    let (refs, templates, generators) = match version {
        Some(1) => {
            let refs = match doc.remove("refs") {
                Some(Value::Object(refs)) => refs,
                None => serde_json::Map::new(),
                Some(_) => return Err("\"refs\" is not an object".into()),
            };
            let templates = match doc.remove("templates") {
                Some(Value::Object(t)) => t
                    .into_iter()
                    .map(|(k, v)| match v {
                        Value::String(s) => Ok((k, s)),
                        _ => Err(format!("template '{k}' is not a string")),
                    })
                    .collect::<Result<BTreeMap<_, _>, _>>()?,
                None => BTreeMap::new(),
                Some(_) => return Err("\"templates\" is not an object".into()),
            };
            let generators = match doc.remove("gen") {
                Some(Value::Array(g)) => g,
                None => Vec::new(),
                Some(_) => return Err("\"gen\" is not a list".into()),
            };
            (refs, templates, generators)
        }
        Some(other) => return Err(format!("reference version {other} is not 0 or 1")),
        None if doc.contains_key("version") => return Err("\"version\" is not a number".into()),
        // Version 0: the object is the references.
        None => (doc, BTreeMap::new(), Vec::new()),
    };
    let strings: BTreeMap<&str, Var> = templates.iter().map(|(k, v)| (k.as_str(), Var::Text(v))).collect();
    let mut out = BTreeMap::new();
    let rendered = (version == Some(1)).then_some(&strings);
    for (key, value) in refs {
        let reference = reference(&key, value, rendered)?;
        out.insert(key, reference);
    }
    let mut generated = 0u64;
    for (n, generator) in generators.iter().enumerate() {
        expand(generator, &strings, &mut out, &mut generated).map_err(|e| format!("gen[{n}]: {e}"))?;
    }
    Ok(out)
}

fn reference(key: &str, value: Value, templates: Option<&BTreeMap<&str, Var>>) -> Result<Reference, String> {
    let bad = |why: &str| format!("reference '{key}': {why}");
    Ok(match value {
        Value::String(text) => match text.strip_prefix("base64:") {
            Some(encoded) => Reference::Inline(
                base64::engine::general_purpose::STANDARD
                    .decode(encoded)
                    .map_err(|e| bad(&format!("bad base64: {e}")))?
                    .into(),
            ),
            None => Reference::Inline(Bytes::from(text.into_bytes())),
        },
        // A document given as JSON rather than as its text.
        Value::Object(_) => Reference::Inline(Bytes::from(value.to_string().into_bytes())),
        Value::Array(parts) => {
            let url = match parts.first() {
                // Version 1 renders its templates in URLs; version 0 has none, and takes URLs as
                // written, as fsspec does.
                Some(Value::String(url)) => match templates {
                    Some(templates) => render(url, templates).map_err(|e| bad(&e))?,
                    None => url.clone(),
                },
                _ => return Err(bad("a list whose first item is not a URL")),
            };
            match parts.len() {
                1 => Reference::Whole { url: url.into() },
                3 => {
                    let number = |v: &Value| v.as_u64().ok_or_else(|| bad("offset and length must be whole numbers"));
                    let (offset, length) = (number(&parts[1])?, number(&parts[2])?);
                    offset
                        .checked_add(length)
                        .ok_or_else(|| bad("offset + length overflows"))?;
                    Reference::Range {
                        url: url.into(),
                        offset,
                        length,
                    }
                }
                _ => return Err(bad("a list of neither [url] nor [url, offset, length]")),
            }
        }
        _ => return Err(bad("neither text nor a list")),
    })
}

/// A reference written without templates (version 0's, or a parquet set's documents).
pub(super) fn untemplated(key: &str, value: Value) -> Result<Reference, String> {
    reference(key, value, None)
}

/// A value a template expression may name: a dimension's index, or a template's text.
#[derive(Debug, Clone, Copy)]
enum Var<'a> {
    Int(i64),
    Text(&'a str),
}

/// Expands one `gen` entry: its keys, over the product of its dimensions.
fn expand(
    generator: &Value,
    templates: &BTreeMap<&str, Var>,
    out: &mut BTreeMap<String, Reference>,
    generated: &mut u64,
) -> Result<(), String> {
    let field = |name: &str| generator.get(name).ok_or_else(|| format!("no \"{name}\""));
    let text = |name: &str| -> Result<String, String> {
        match field(name)? {
            Value::String(s) => Ok(s.clone()),
            Value::Number(n) => Ok(n.to_string()),
            _ => Err(format!("\"{name}\" is neither text nor a number")),
        }
    };
    let (key, url) = (text("key")?, text("url")?);
    let range = match (generator.get("offset"), generator.get("length")) {
        (None, None) => None,
        (Some(_), Some(_)) => Some((text("offset")?, text("length")?)),
        _ => return Err("\"offset\" and \"length\" go together".into()),
    };
    let Some(Value::Object(dimensions)) = generator.get("dimensions") else {
        return Err("no \"dimensions\" object".into());
    };
    let mut axes: Vec<(&str, Vec<i64>)> = Vec::new();
    let mut count = 1u64;
    for (name, spec) in dimensions {
        let values: Vec<i64> = match spec {
            Value::Array(list) if count.saturating_mul(list.len() as u64) > MAX_GENERATED => {
                return Err(format!("more than {MAX_GENERATED} keys"));
            }
            Value::Array(list) => list
                .iter()
                .map(|v| {
                    v.as_i64()
                        .ok_or_else(|| format!("dimension '{name}' lists a value that is not a whole number"))
                })
                .collect::<Result<_, _>>()?,
            Value::Object(range) => {
                let get = |k: &str, default: Option<i64>| match range.get(k) {
                    Some(v) => v
                        .as_i64()
                        .ok_or_else(|| format!("dimension '{name}': {k} is not a whole number")),
                    None => default.ok_or_else(|| format!("dimension '{name}' has no {k}")),
                };
                let (start, stop, step) = (get("start", Some(0))?, get("stop", None)?, get("step", Some(1))?);
                if step <= 0 {
                    return Err(format!("dimension '{name}': step must be positive"));
                }
                let span = i128::from(stop) - i128::from(start);
                let n = u64::try_from(((span + i128::from(step) - 1) / i128::from(step)).max(0)).unwrap_or(u64::MAX);
                // Checked before anything is made: the product of the dimensions bounds them all.
                if count.saturating_mul(n) > MAX_GENERATED {
                    return Err(format!("more than {MAX_GENERATED} keys"));
                }
                (0..n as i64).map(|i| start + i * step).collect()
            }
            _ => return Err(format!("dimension '{name}' is neither a list nor a range")),
        };
        count = count.saturating_mul(values.len() as u64);
        axes.push((name, values));
    }
    *generated = generated.saturating_add(count);
    if *generated > MAX_GENERATED {
        return Err(format!("more than {MAX_GENERATED} keys"));
    }
    if count == 0 {
        return Ok(());
    }
    let mut index = vec![0usize; axes.len()];
    let mut vars = templates.clone();
    loop {
        for ((name, values), &i) in axes.iter().zip(&index) {
            vars.insert(name, Var::Int(values[i]));
        }
        let key = render(&key, &vars)?;
        let url: Arc<str> = render(&url, &vars)?.into();
        let reference = match &range {
            None => Reference::Whole { url },
            Some((offset, length)) => {
                let whole = |t: &str| -> Result<u64, String> {
                    let v = render(t, &vars)?;
                    v.trim()
                        .parse::<u64>()
                        .map_err(|_| format!("'{v}' is not a whole number of bytes"))
                };
                let (offset, length) = (whole(offset)?, whole(length)?);
                offset.checked_add(length).ok_or("offset + length overflows")?;
                Reference::Range { url, offset, length }
            }
        };
        out.insert(key, reference);
        // The next index, the last dimension fastest.
        let mut d = axes.len();
        loop {
            if d == 0 {
                return Ok(());
            }
            d -= 1;
            index[d] += 1;
            if index[d] < axes[d].1.len() {
                break;
            }
            index[d] = 0;
        }
    }
}

/// Replaces each `{{ expression }}` of `text` by its value (jinja2's syntax, as kerchunk
/// writes it; arithmetic on whole numbers and the names of `vars`).
fn render(text: &str, vars: &BTreeMap<&str, Var>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find("{{") {
        out.push_str(&rest[..open]);
        let after = &rest[open + 2..];
        let close = after
            .find("}}")
            .ok_or_else(|| format!("'{text}': '{{{{' without '}}}}'"))?;
        match Expression::new(&after[..close], vars).evaluate()? {
            Var::Int(n) => out.push_str(&n.to_string()),
            Var::Text(s) => out.push_str(s),
        }
        if out.len() > MAX_RENDERED {
            return Err(format!("a template renders more than {MAX_RENDERED} bytes"));
        }
        rest = &after[close + 2..];
    }
    out.push_str(rest);
    match out.len() > MAX_RENDERED {
        true => Err(format!("a template renders more than {MAX_RENDERED} bytes")),
        false => Ok(out),
    }
}

/// A template expression: whole numbers, names, `+ - * // / %` and parentheses.
struct Expression<'t, 'v> {
    text: &'t str,
    at: usize,
    vars: &'v BTreeMap<&'v str, Var<'v>>,
}

impl<'t, 'v> Expression<'t, 'v> {
    fn new(text: &'t str, vars: &'v BTreeMap<&'v str, Var<'v>>) -> Self {
        Self { text, at: 0, vars }
    }

    fn evaluate(mut self) -> Result<Var<'v>, String> {
        let value = self.sum(0)?;
        self.skip_space();
        match self.at == self.text.len() {
            true => Ok(value),
            false => Err(format!("cannot read '{}' in a template", self.text.trim())),
        }
    }

    fn skip_space(&mut self) {
        while let Some(c) = self.text[self.at..].chars().next().filter(|c| c.is_whitespace()) {
            self.at += c.len_utf8();
        }
    }

    fn eat(&mut self, token: &str) -> bool {
        self.skip_space();
        let found = self.text[self.at..].starts_with(token);
        if found {
            self.at += token.len();
        }
        found
    }

    fn int(&self, v: Var<'v>) -> Result<i64, String> {
        match v {
            Var::Int(n) => Ok(n),
            Var::Text(_) => Err(format!("'{}' does arithmetic on text", self.text.trim())),
        }
    }

    fn sum(&mut self, depth: usize) -> Result<Var<'v>, String> {
        let mut value = self.product(depth)?;
        loop {
            let op = if self.eat("+") {
                i64::checked_add
            } else if self.eat("-") {
                i64::checked_sub
            } else {
                return Ok(value);
            };
            let (a, b) = (self.int(value)?, self.product(depth)?);
            let b = self.int(b)?;
            value = Var::Int(op(a, b).ok_or("a template's arithmetic overflows")?);
        }
    }

    fn product(&mut self, depth: usize) -> Result<Var<'v>, String> {
        let mut value = self.atom(depth)?;
        loop {
            let op: fn(i64, i64) -> Option<i64> = if self.eat("*") {
                i64::checked_mul
            } else if self.eat("//") {
                |a, b| a.checked_div_euclid(b)
            } else if self.eat("/") {
                // Exact division only: offsets are whole numbers.
                |a, b| (b != 0 && a % b == 0).then(|| a / b)
            } else if self.eat("%") {
                |a, b| a.checked_rem_euclid(b)
            } else {
                return Ok(value);
            };
            let (a, b) = (self.int(value)?, self.atom(depth)?);
            let b = self.int(b)?;
            value = Var::Int(op(a, b).ok_or("a template's arithmetic overflows or divides unevenly")?);
        }
    }

    fn atom(&mut self, depth: usize) -> Result<Var<'v>, String> {
        if depth > 32 {
            return Err("a template nests too deeply".into());
        }
        if self.eat("(") {
            let value = self.sum(depth + 1)?;
            return match self.eat(")") {
                true => Ok(value),
                false => Err(format!("'{}': '(' without ')'", self.text.trim())),
            };
        }
        if self.eat("-") {
            let v = self.atom(depth + 1)?;
            return Ok(Var::Int(
                self.int(v)?.checked_neg().ok_or("a template's arithmetic overflows")?,
            ));
        }
        self.skip_space();
        let rest = &self.text[self.at..];
        let len = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let word = &rest[..len];
        self.at += len;
        if word.is_empty() {
            return Err(format!("'{}' is not a template expression", self.text.trim()));
        }
        if word.starts_with(|c: char| c.is_ascii_digit()) {
            return word
                .parse()
                .map(Var::Int)
                .map_err(|_| format!("'{word}' is not a whole number"));
        }
        self.vars
            .get(word)
            .copied()
            .ok_or_else(|| format!("the template names '{word}', which is neither a dimension nor a template"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_0_and_1_with_templates_and_gen() {
        let v0 = br#"{".zgroup": "{\"zarr_format\": 2}", "a/0": ["data.nc", 10, 5], "a/1": ["s3://b/x"], "b": "base64:AAEC"}"#;
        let refs = parse(v0).unwrap();
        assert_eq!(
            refs[".zgroup"],
            Reference::Inline(Bytes::from_static(b"{\"zarr_format\": 2}"))
        );
        assert_eq!(
            refs["a/0"],
            Reference::Range {
                url: "data.nc".into(),
                offset: 10,
                length: 5
            }
        );
        assert_eq!(refs["a/1"], Reference::Whole { url: "s3://b/x".into() });
        assert_eq!(refs["b"], Reference::Inline(Bytes::from_static(&[0, 1, 2])));

        let v1 = br#"{"version": 1, "templates": {"u": "grid.bin"},
            "refs": {"x/.zattrs": {"a": 1}, "x/0": ["{{ u }}", 0, 4]},
            "gen": [{"key": "g/{{i}}.{{j}}", "url": "{{u}}", "offset": "{{ (i*3 + j) * 8 }}", "length": "8",
                     "dimensions": {"i": {"stop": 2}, "j": [0, 1, 2]}}]}"#;
        let refs = parse(v1).unwrap();
        assert_eq!(refs["x/.zattrs"], Reference::Inline(Bytes::from_static(b"{\"a\":1}")));
        assert_eq!(
            refs["x/0"],
            Reference::Range {
                url: "grid.bin".into(),
                offset: 0,
                length: 4
            }
        );
        assert_eq!(refs.len(), 2 + 6);
        assert_eq!(
            refs["g/1.2"],
            Reference::Range {
                url: "grid.bin".into(),
                offset: 40,
                length: 8
            }
        );
        assert_eq!(
            refs["g/0.0"],
            Reference::Range {
                url: "grid.bin".into(),
                offset: 0,
                length: 8
            }
        );
    }

    #[test]
    fn bad_references_are_refused_with_a_reason() {
        for (text, says) in [
            (&b"[]"[..], "not a JSON object"),
            (br#"{"version": 2}"#, "version 2"),
            (br#"{"a": ["u", 1]}"#, "neither [url]"),
            (br#"{"a": ["u", -1, 2]}"#, "whole numbers"),
            (br#"{"a": 5}"#, "neither text nor a list"),
            (br#"{"a": "base64:*"}"#, "base64"),
            (br#"{"version": 1, "refs": {"a": ["{{v}}", 0, 1]}}"#, "names 'v'"),
            (br#"{"version": 1, "gen": [{"key": "k{{i}}", "url": "u", "dimensions": {"i": {"stop": 100000000}}}]}"#, "more than"),
            (br#"{"version": 1, "gen": [{"key": "k{{i}}", "url": "u", "offset": "{{i/3}}", "length": "1", "dimensions": {"i": {"stop": 2}}}]}"#, "unevenly"),
            (br#"{"version": 1, "gen": [{"key": "k{{i", "url": "u", "dimensions": {"i": [1]}}]}"#, "without"),
            // A few bytes that would make terabytes, or a product of dimensions past the limit.
            (br#"{"version": 1, "gen": [{"key": "k{{i}}{{j}}", "url": "u", "dimensions": {"i": {"stop": 100000}, "j": {"stop": 100000}}}]}"#, "more than"),
            (br#"{"version": 1, "gen": [{"key": "k{{i}}", "url": "u", "dimensions": {"i": {"start": -9223372036854775807, "stop": 9223372036854775807}}}]}"#, "more than"),
            // Non-ASCII white space inside a template is read past, not split.
            ("{\"version\": 1, \"refs\": {\"a\": [\"{{\u{a0}v}}\", 0, 1]}}".as_bytes(), "names 'v'"),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.contains(says), "{}: {e}", String::from_utf8_lossy(text));
        }
        // A few hundred bytes that would render megabytes: refused.
        let many = "{{u}}".repeat(300);
        let text =
            format!(r#"{{"version": 1, "templates": {{"u": "0123456789abcdef"}}, "refs": {{"a": ["{many}", 0, 1]}}}}"#);
        assert!(parse(text.as_bytes()).unwrap_err().contains("more than 4096 bytes"));
    }
}
