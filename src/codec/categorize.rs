//! numcodecs `categorize` (v2 filter): each element is stored as a small integer, 0 for values
//! not among the labels (decoded as the empty string) and i + 1 for `labels[i]`.
//! Spec: <https://numcodecs.readthedocs.io/en/stable/filter/categorize.html>

use serde_json::Value;

use super::CodecError;
use super::numeric::{Num, Scalar, count};
use crate::dtype::DType;
use crate::dtype::elements::Elements;

/// The categorize filter.
#[derive(Debug, Clone)]
pub struct Categorize {
    labels: Vec<String>,
    astype: Scalar,
}

impl Categorize {
    /// From `{"id": "categorize", "labels": [...], "dtype": "|O", "astype": "|u1"}`.
    pub fn from_config(config: &Value) -> Result<Self, CodecError> {
        let labels = config
            .get("labels")
            .and_then(Value::as_array)
            .and_then(|l| {
                l.iter()
                    .map(|v| v.as_str().map(str::to_owned))
                    .collect::<Option<Vec<_>>>()
            })
            .ok_or_else(|| CodecError::Config("categorize needs a list of string labels".into()))?;
        let astype = Scalar::parse(config, "astype")?;
        Ok(Self { labels, astype })
    }

    /// The type of the codes it stores.
    pub fn astype(&self) -> &DType {
        self.astype.dtype()
    }

    /// Decodes `expected` codes into strings, up to `limit` bytes decoded (every code is a
    /// copy of its label: a few bytes of codes can name long labels many times).
    pub fn decode(&self, input: &[u8], expected: usize, limit: usize) -> Result<Elements, CodecError> {
        let n = count(input, &self.astype)?;
        if n != expected {
            return Err(CodecError::Corrupt(format!(
                "categorize: {n} codes where the chunk holds {expected}"
            )));
        }
        // As numcodecs decodes: code i is label i - 1; 0, and any code without a label, is the
        // empty string.
        let labels = input
            .chunks_exact(self.astype.size())
            .map(|b| match self.astype.read(b) {
                Num::Int(i) => Ok(usize::try_from(i - 1).ok().and_then(|i| self.labels.get(i))),
                Num::Float(_) => Err(CodecError::Corrupt("categorize: float codes".into())),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let content = labels.iter().flatten().map(|l| l.len()).sum();
        super::vlen::check_decoded("categorize", n, content, limit)?;
        Ok(Elements::Strings(
            labels
                .into_iter()
                .map(|l| Some(l.cloned().unwrap_or_default()))
                .collect(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn codes_become_labels() {
        let c = Categorize::from_config(&json!({"labels": ["red", "green"], "dtype": "|O", "astype": "|u1"})).unwrap();
        assert_eq!(
            c.decode(&[2, 0, 1], 3, 1 << 20).unwrap(),
            Elements::Strings(vec![Some("green".into()), Some(String::new()), Some("red".into())])
        );
        // A code without a label reads as "" (numcodecs fills with '' and sets known codes).
        assert_eq!(
            c.decode(&[3], 1, 1 << 20).unwrap(),
            Elements::Strings(vec![Some(String::new())])
        );
        assert!(c.decode(&[1, 1], 1, 1 << 20).is_err());
        // Every code is a copy of its label: 1000 one-byte codes of a 1000-byte label are
        // 1 MB decoded, refused below that.
        let long =
            Categorize::from_config(&json!({"labels": ["x".repeat(1000)], "dtype": "|O", "astype": "|u1"})).unwrap();
        let codes = [1u8; 1000];
        assert_eq!(long.decode(&codes, 1000, 1 << 20).unwrap().count(1), 1000);
        let err = long.decode(&codes, 1000, 1_000_000).unwrap_err().to_string();
        assert!(err.contains("1000 elements of 1000000 bytes"), "{err}");
    }
}
