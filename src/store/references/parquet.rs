//! kerchunk's parquet form of references: a directory holding `.zmetadata` (the metadata
//! documents, and `record_size`) and, for each array, files `refs.N.parq` of `record_size`
//! rows each: row `n % record_size` of file `n / record_size` is the array's chunk `n`, the
//! chunk grid in C order. A row is inline bytes (`raw`), a byte range (`path`, `offset`,
//! `size`), all of `path` (size 0), or nothing (a missing chunk).

use std::collections::BTreeMap;

use bytes::Bytes;
use parquet::file::reader::FileReader;
use parquet::file::serialized_reader::SerializedFileReader;
use parquet::record::Field;
use serde_json::Value;

use super::parse::{MAX_GENERATED, Reference, untemplated};

/// The file of a parquet reference set that names the rest.
pub const ZMETADATA: &str = ".zmetadata";

/// What `.zmetadata` says: the metadata documents, and where each array's chunks are.
#[derive(Debug)]
pub struct Layout {
    pub metadata: BTreeMap<String, Reference>,
    pub arrays: Vec<ArrayRecords>,
    pub record_size: u64,
}

/// One array's record files.
#[derive(Debug, Clone, PartialEq)]
pub struct ArrayRecords {
    /// The array's path ("" at the root).
    pub path: String,
    /// Chunks along each dimension.
    grid: Vec<u64>,
    separator: String,
    /// How many chunks it has.
    pub chunks: u64,
}

impl ArrayRecords {
    fn prefixed(&self, name: &str) -> String {
        match self.path.is_empty() {
            true => name.to_owned(),
            false => format!("{}/{name}", self.path),
        }
    }

    /// The key of record file `n` within the set's directory.
    pub fn file(&self, n: u64) -> String {
        self.prefixed(&format!("refs.{n}.parq"))
    }

    /// How many record files it has.
    pub fn files(&self, record_size: u64) -> u64 {
        self.chunks.div_ceil(record_size)
    }

    /// The key of chunk `n` (C order of the chunk grid).
    fn chunk_key(&self, mut n: u64) -> String {
        if self.grid.is_empty() {
            return self.prefixed("0");
        }
        let mut index = vec![0; self.grid.len()];
        for (i, &extent) in self.grid.iter().enumerate().rev() {
            index[i] = n % extent;
            n /= extent;
        }
        let name = index
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(&self.separator);
        self.prefixed(&name)
    }
}

/// Reads `.zmetadata`.
pub fn layout(text: &[u8]) -> Result<Layout, String> {
    let doc: Value = serde_json::from_slice(text).map_err(|e| format!("{ZMETADATA} is not JSON: {e}"))?;
    let record_size = doc
        .get("record_size")
        .and_then(Value::as_u64)
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("{ZMETADATA} has no record_size (a whole number above 0)"))?;
    let Some(Value::Object(documents)) = doc.get("metadata") else {
        return Err(format!("{ZMETADATA} has no \"metadata\" object"));
    };
    let mut metadata = BTreeMap::new();
    let mut arrays = Vec::new();
    let (mut total, mut files) = (0u64, 0u64);
    for (key, value) in documents {
        if key == ".zarray" || key.ends_with("/.zarray") {
            let array = array_records(key, value)?;
            total = total.saturating_add(array.chunks);
            if total > MAX_GENERATED {
                return Err(format!("more than {MAX_GENERATED} chunks"));
            }
            files = files.saturating_add(array.files(record_size));
            if files > MAX_RECORD_FILES {
                return Err(format!("more than {MAX_RECORD_FILES} record files"));
            }
            arrays.push(array);
        }
        metadata.insert(key.clone(), untemplated(key, value.clone())?);
    }
    Ok(Layout {
        metadata,
        arrays,
        record_size,
    })
}

fn array_records(key: &str, value: &Value) -> Result<ArrayRecords, String> {
    let bad = |why: &str| format!("'{key}': {why}");
    let parsed;
    let doc = match value {
        Value::String(text) => {
            parsed = serde_json::from_str::<Value>(text).map_err(|e| bad(&format!("not JSON: {e}")))?;
            &parsed
        }
        other => other,
    };
    let numbers = |name: &str| -> Result<Vec<u64>, String> {
        doc.get(name)
            .and_then(Value::as_array)
            .ok_or_else(|| bad(&format!("no {name}")))?
            .iter()
            .map(|v| {
                v.as_u64()
                    .ok_or_else(|| bad(&format!("{name} holds a value that is no size")))
            })
            .collect()
    };
    let (shape, chunks) = (numbers("shape")?, numbers("chunks")?);
    if shape.len() != chunks.len() || chunks.contains(&0) {
        return Err(bad("shape and chunks do not agree"));
    }
    let grid: Vec<u64> = shape.iter().zip(&chunks).map(|(s, c)| s.div_ceil(*c)).collect();
    let count = grid
        .iter()
        .try_fold(1u64, |n, &g| n.checked_mul(g))
        .filter(|&n| n <= MAX_GENERATED)
        .ok_or_else(|| bad(&format!("more than {MAX_GENERATED} chunks")))?;
    Ok(ArrayRecords {
        path: key
            .strip_suffix(".zarray")
            .unwrap_or(key)
            .trim_end_matches('/')
            .to_owned(),
        grid,
        separator: doc
            .get("dimension_separator")
            .and_then(Value::as_str)
            .unwrap_or(".")
            .to_owned(),
        chunks: count,
    })
}

/// The most record files a set may have.
pub const MAX_RECORD_FILES: u64 = 100_000;

/// Adds the chunks record file `file` of `array` holds to `entries`, taking what their keys,
/// URLs and inline bytes take from `budget`.
pub fn read_records(
    bytes: Bytes,
    array: &ArrayRecords,
    file: u64,
    record_size: u64,
    entries: &mut BTreeMap<String, Reference>,
    budget: &mut u64,
) -> Result<(), String> {
    let name = array.file(file);
    let bad = |why: String| format!("'{name}': {why}");
    let reader = SerializedFileReader::new(bytes).map_err(|e| bad(e.to_string()))?;
    let rows_declared = reader.metadata().file_metadata().num_rows();
    if u64::try_from(rows_declared).map_or(true, |n| n > record_size) {
        return Err(bad(format!(
            "{rows_declared} rows, more than record_size ({record_size})"
        )));
    }
    // Rows of one file name few URLs: one shared copy of each.
    let mut last_url: Option<std::sync::Arc<str>> = None;
    let rows = reader.get_row_iter(None).map_err(|e| bad(e.to_string()))?;
    for (row_number, row) in rows.enumerate() {
        let row_number = row_number as u64;
        if row_number >= record_size {
            return Err(bad(format!("more than record_size ({record_size}) rows")));
        }
        let n = file * record_size + row_number;
        if n >= array.chunks {
            break;
        }
        let row = row.map_err(|e| bad(e.to_string()))?;
        let (mut path, mut offset, mut size, mut raw) = (None, 0u64, 0u64, None);
        for (column, field) in row.get_column_iter() {
            let number = |field: &Field| match field {
                Field::Long(v) => u64::try_from(*v).ok(),
                Field::Int(v) => u64::try_from(*v).ok(),
                Field::ULong(v) => Some(*v),
                Field::UInt(v) => Some(u64::from(*v)),
                _ => None,
            };
            match (column.as_str(), field) {
                (_, Field::Null) => {}
                ("path", Field::Str(text)) => path = Some(text.clone()),
                ("path", Field::Bytes(b)) => {
                    path =
                        Some(String::from_utf8(b.data().to_vec()).map_err(|_| bad("a path that is not UTF-8".into()))?)
                }
                ("raw", Field::Bytes(b)) => raw = Some(Bytes::copy_from_slice(b.data())),
                ("raw", Field::Str(text)) => raw = Some(Bytes::from(text.clone().into_bytes())),
                ("offset", f) => offset = number(f).ok_or_else(|| bad(format!("row {row_number}: a bad offset")))?,
                ("size", f) => size = number(f).ok_or_else(|| bad(format!("row {row_number}: a bad size")))?,
                _ => {}
            }
        }
        let taken = (raw.as_ref().map_or(0, Bytes::len) + path.as_ref().map_or(0, String::len) + 64) as u64;
        *budget = budget
            .checked_sub(taken)
            .ok_or_else(|| bad("the reference set takes too much memory decoded".into()))?;
        let url = path.map(|p| match &last_url {
            Some(last) if **last == *p => last.clone(),
            _ => {
                let url: std::sync::Arc<str> = p.into();
                last_url = Some(url.clone());
                url
            }
        });
        let reference = match (raw, url) {
            (Some(bytes), _) => Reference::Inline(bytes),
            (None, None) => continue,
            (None, Some(url)) if offset == 0 && size == 0 => Reference::Whole { url },
            (None, Some(url)) => {
                offset
                    .checked_add(size)
                    .ok_or_else(|| bad(format!("row {row_number}: offset + size overflows")))?;
                Reference::Range {
                    url,
                    offset,
                    length: size,
                }
            }
        };
        entries.insert(array.chunk_key(n), reference);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_numbers_are_c_order_keys() {
        let zarray = serde_json::json!({"shape": [5, 7, 3], "chunks": [2, 4, 3], "dimension_separator": "/"});
        let array = array_records("a/b/.zarray", &zarray).unwrap();
        assert_eq!((array.chunks, array.path.as_str()), (6, "a/b"));
        let keys: Vec<String> = (0..6).map(|n| array.chunk_key(n)).collect();
        assert_eq!(
            keys,
            [
                "a/b/0/0/0",
                "a/b/0/1/0",
                "a/b/1/0/0",
                "a/b/1/1/0",
                "a/b/2/0/0",
                "a/b/2/1/0"
            ]
        );
        assert_eq!(array.file(2), "a/b/refs.2.parq");
        assert_eq!(array.files(4), 2);
        let scalar = array_records(".zarray", &serde_json::json!({"shape": [], "chunks": []})).unwrap();
        assert_eq!(
            (scalar.chunks, scalar.chunk_key(0), scalar.file(0)),
            (1, "0".into(), "refs.0.parq".into())
        );
        let text = serde_json::Value::String(r#"{"shape": [10], "chunks": [3]}"#.into());
        assert_eq!(array_records("x/.zarray", &text).unwrap().chunk_key(3), "x/3");
    }

    #[test]
    fn bad_layouts_are_refused_with_a_reason() {
        for (doc, why) in [
            (r#"{"metadata": {}}"#, "record_size"),
            (r#"{"record_size": 0, "metadata": {}}"#, "record_size"),
            (r#"{"record_size": 2}"#, "metadata"),
            (
                r#"{"record_size": 2, "metadata": {"a/.zarray": {"shape": [4], "chunks": [0]}}}"#,
                "agree",
            ),
            (
                r#"{"record_size": 2, "metadata": {"a/.zarray": {"shape": [100000, 100000], "chunks": [1, 1]}}}"#,
                "chunks",
            ),
        ] {
            let e = layout(doc.as_bytes()).unwrap_err();
            assert!(e.contains(why), "{doc}: {e}");
        }
    }
}
