//! Zarr metadata: v1 (`meta`/`attrs`), v2 (`.zarray`/`.zgroup`/`.zattrs`) and v3 (`zarr.json`)
//! read into one model, [`ArrayMeta`], with the chunk grid and chunk key encodings.

pub mod hierarchy;

use serde_json::{Map, Value};

use crate::buffers::StackText;
use crate::codec::chain::CodecChain;
use crate::dtype::DType;
use crate::dtype::fill::FillValue;
use crate::store::{KeyError, Store, StoreError, StoreKey};

pub use crate::dtype::MetaError;

impl From<crate::codec::CodecError> for MetaError {
    fn from(e: crate::codec::CodecError) -> Self {
        match e {
            crate::codec::CodecError::Unsupported(m) => MetaError::Unsupported(m),
            other => MetaError::Invalid(other.to_string()),
        }
    }
}

/// How chunk grid coordinates become store keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChunkKeyEncoding {
    /// v3 `default`: `c` then the coordinates, each after the separator (`c/1/2`, `c.1.2`; `c` for 0-d).
    Default { separator: char },
    /// v2 (and v3 `v2`): the coordinates joined by the separator (`1.2`, `1/2`; `0` for 0-d).
    V2 { separator: char },
}

impl ChunkKeyEncoding {
    /// The key of the chunk at `coords`, relative to the array.
    pub fn key(&self, coords: &[u64]) -> String {
        // Room for the usual key (numbers of up to three digits) in one allocation.
        let mut key = String::with_capacity(2 + 4 * coords.len());
        // A `String` takes any text.
        let _ = self.write_key(&mut key, coords);
        key
    }

    /// The store key of the chunk at `coords` of the array at `array`: in one allocation for
    /// keys of up to 128 bytes below the array's (every request reading a chunk makes one).
    pub fn key_in(&self, array: &StoreKey, coords: &[u64]) -> Result<StoreKey, KeyError> {
        let mut key = StackText::<128>::new();
        match self.write_key(&mut key, coords) {
            Ok(()) => array.join(key.as_str()),
            Err(_) => array.join(&self.key(coords)),
        }
    }

    fn write_key(&self, out: &mut impl std::fmt::Write, coords: &[u64]) -> std::fmt::Result {
        let separator = match self {
            ChunkKeyEncoding::Default { separator } => {
                out.write_char('c')?;
                if !coords.is_empty() {
                    out.write_char(*separator)?;
                }
                *separator
            }
            ChunkKeyEncoding::V2 { .. } if coords.is_empty() => return out.write_char('0'),
            ChunkKeyEncoding::V2 { separator } => *separator,
        };
        write_joined(out, coords, separator)
    }
}

/// Appends `numbers` to `out` in decimal, `separator` between them (`1,2,3`).
pub(crate) fn push_joined(out: &mut String, numbers: &[u64], separator: char) {
    // A `String` takes any text.
    let _ = write_joined(out, numbers, separator);
}

/// Writes `numbers` in decimal, `separator` between them (`1,2,3`).
pub(crate) fn write_joined(out: &mut impl std::fmt::Write, numbers: &[u64], separator: char) -> std::fmt::Result {
    let mut digits = itoa::Buffer::new();
    for (i, &n) in numbers.iter().enumerate() {
        if i > 0 {
            out.write_char(separator)?;
        }
        out.write_str(digits.format(n))?;
    }
    Ok(())
}

/// Everything needed to read an array.
#[derive(Debug)]
pub struct ArrayMeta {
    /// 1, 2 or 3.
    pub zarr_format: u8,
    /// The array shape.
    pub shape: Vec<u64>,
    /// The shape of one stored object (a chunk, or a shard for sharded arrays).
    pub chunk_shape: Vec<u64>,
    /// The element type as decoded (little-endian).
    pub dtype: DType,
    /// The fill value (in the decoded form).
    pub fill: FillValue,
    /// Whether the metadata names a fill value. v2 allows `null`: missing chunks still read as
    /// zeros, but no value stands for "no data" (PNG leaves no pixel transparent for it).
    pub fill_declared: bool,
    /// A hash of the metadata document. Cached chunks and shard indexes are keyed by it, so
    /// what was decoded under one document (another dtype, chunk shape or codecs, after the
    /// array was rewritten) is never used with another.
    pub fingerprint: u64,
    /// About the bytes the metadata documents it was parsed from hold once parsed
    /// ([`parsed_weight`], attributes included): what the metadata cache weighs it by, with
    /// its fill value.
    pub doc_weight: usize,
    /// Chunk keys.
    pub key_encoding: ChunkKeyEncoding,
    /// How one stored object decodes.
    pub chain: CodecChain,
    /// User attributes.
    pub attributes: Map<String, Value>,
    /// v3 dimension names, or v2 `_ARRAY_DIMENSIONS`.
    pub dimension_names: Option<Vec<Option<String>>>,
}

impl ArrayMeta {
    /// Number of stored objects along each dimension.
    pub fn grid_shape(&self) -> Vec<u64> {
        self.shape
            .iter()
            .zip(&self.chunk_shape)
            .map(|(s, c)| if *c == 0 { 0 } else { s.div_ceil(*c) })
            .collect()
    }
}

/// A stable hash of a metadata document.
fn fingerprint_of(doc: &Value) -> u64 {
    use std::hash::{Hash, Hasher};
    let text = doc.to_string();
    let mut h = std::hash::DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

impl ArrayMeta {
    /// About the bytes it holds in memory: parsed JSON (its attributes, codec configurations
    /// such as categorize labels) takes a few times its text, plus the fill value.
    pub fn heap_weight(&self) -> usize {
        let fill = match &self.fill {
            FillValue::Fixed(b) => b.len(),
            FillValue::String(s) => s.len(),
            FillValue::Bytes(b) => b.len(),
            FillValue::Object(v) => v.to_string().len(),
        };
        NODE_BYTES.saturating_add(self.doc_weight).saturating_add(fill)
    }
}

/// What one parsed JSON value takes in memory besides its text, about: a `Value` (an ordered
/// map's is the largest), its slot in the array or map holding it, and the room those grow by.
const PARSED_VALUE_BYTES: usize = 96;

/// About the bytes `value` holds in memory parsed (what the metadata and hierarchy caches weigh
/// documents by): [`PARSED_VALUE_BYTES`] a value, and the text of its strings, keys and
/// numbers. A document of many small values (`[[],[],...]`) takes some 30 times its text.
pub fn parsed_weight(value: &Value) -> usize {
    match value {
        Value::String(s) => PARSED_VALUE_BYTES + s.len(),
        Value::Number(n) => PARSED_VALUE_BYTES + n.as_str().len(),
        Value::Array(items) => items
            .iter()
            .fold(PARSED_VALUE_BYTES, |n, v| n.saturating_add(parsed_weight(v))),
        Value::Object(fields) => PARSED_VALUE_BYTES.saturating_add(fields_weight(fields)),
        _ => PARSED_VALUE_BYTES,
    }
}

/// [`parsed_weight`] of an object's fields: their names and values.
pub fn fields_weight(fields: &Map<String, Value>) -> usize {
    fields.iter().fold(0usize, |n, (k, v)| {
        n.saturating_add(k.len()).saturating_add(parsed_weight(v))
    })
}

/// What a node's metadata takes in memory besides its documents (what the metadata and
/// hierarchy caches weigh it by, with [`parsed_weight`]).
pub const NODE_BYTES: usize = 1024;

fn field<'a>(doc: &'a Value, name: &str) -> Result<&'a Value, MetaError> {
    doc.get(name)
        .ok_or_else(|| MetaError::Invalid(format!("missing field '{name}'")))
}

fn shape_of(value: &Value, what: &str) -> Result<Vec<u64>, MetaError> {
    value
        .as_array()
        .and_then(|dims| dims.iter().map(Value::as_u64).collect::<Option<Vec<_>>>())
        .ok_or_else(|| MetaError::Invalid(format!("'{what}' must be a list of non-negative integers")))
}

/// The most dimensions an array may have: NumPy's limit (`NPY_MAXDIMS` is 64 since NumPy 2).
/// Encoders recurse once per dimension, so an unbounded count could exhaust a thread's stack.
pub const MAX_DIMS: usize = 64;

fn check_grid(shape: &[u64], chunks: &[u64]) -> Result<(), MetaError> {
    if shape.len() > MAX_DIMS {
        return Err(MetaError::Invalid(format!(
            "{} dimensions; at most {MAX_DIMS} are supported",
            shape.len()
        )));
    }
    if shape.len() != chunks.len() {
        return Err(MetaError::Invalid(format!(
            "shape has {} dimensions but chunks have {}",
            shape.len(),
            chunks.len()
        )));
    }
    if chunks.contains(&0) {
        return Err(MetaError::Invalid("chunk sizes must be positive".into()));
    }
    // Element counts are products of these; keep them far from overflowing.
    let elements = chunks.iter().try_fold(1u64, |n, &c| n.checked_mul(c));
    if elements.is_none_or(|n| n > 1 << 48) {
        // A limit of this server (zarr-python reads the missing chunks of such an array as
        // fill), not bad metadata.
        return Err(MetaError::Unsupported(format!(
            "chunk shape {chunks:?}: chunks of more than 2^48 elements"
        )));
    }
    Ok(())
}

fn separator(value: Option<&Value>, default: char) -> Result<char, MetaError> {
    match value.and_then(Value::as_str) {
        None => Ok(default),
        Some("/") => Ok('/'),
        Some(".") => Ok('.'),
        Some(other) => Err(MetaError::Invalid(format!("unknown separator '{other}'"))),
    }
}

fn array_dimensions(attributes: &Map<String, Value>) -> Option<Vec<Option<String>>> {
    attributes
        .get("_ARRAY_DIMENSIONS")?
        .as_array()
        .map(|names| names.iter().map(|n| n.as_str().map(str::to_owned)).collect())
}

/// Parses a v2 `.zarray` document (with the `.zattrs` document, if any).
pub fn parse_v2(doc: &Value, attrs: Option<&Value>) -> Result<ArrayMeta, MetaError> {
    let shape = shape_of(field(doc, "shape")?, "shape")?;
    let chunk_shape = shape_of(field(doc, "chunks")?, "chunks")?;
    check_grid(&shape, &chunk_shape)?;
    let stored = DType::from_v2(field(doc, "dtype")?)?;
    let order = doc.get("order").and_then(Value::as_str).unwrap_or("C");
    let filters = match doc.get("filters") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(f)) => f.clone(),
        Some(_) => return Err(MetaError::Invalid("'filters' must be a list or null".into())),
    };
    let compressor = doc.get("compressor").filter(|c| !c.is_null());
    let chain = CodecChain::from_v2(&stored, order, &filters, compressor, chunk_shape.len())?;
    let dtype = chain.dtype.clone();
    let fill = FillValue::parse(doc.get("fill_value").unwrap_or(&Value::Null), &stored, 2)?.for_decoded(&dtype);
    let attributes = attrs.and_then(Value::as_object).cloned().unwrap_or_default();
    let fingerprint = fingerprint_of(doc);
    Ok(ArrayMeta {
        zarr_format: 2,
        key_encoding: ChunkKeyEncoding::V2 {
            separator: separator(doc.get("dimension_separator"), '.')?,
        },
        dimension_names: array_dimensions(&attributes),
        shape,
        chunk_shape,
        dtype,
        fill,
        fill_declared: doc.get("fill_value").is_some_and(|v| !v.is_null()),
        fingerprint,
        doc_weight: parsed_weight(doc).saturating_add(attrs.map_or(0, parsed_weight)),
        chain,
        attributes,
    })
}

/// Parses a v1 `meta` document (with the `attrs` document, if any).
pub fn parse_v1(doc: &Value, attrs: Option<&Value>) -> Result<ArrayMeta, MetaError> {
    let compression = doc.get("compression").and_then(Value::as_str).unwrap_or("none");
    let opts = doc.get("compression_opts").cloned().unwrap_or(Value::Null);
    // v1 names its compressor with options beside it; express it as the v2 compressor it is.
    let compressor = match compression {
        "none" => Value::Null,
        "zlib" | "gzip" | "bz2" => serde_json::json!({"id": compression, "level": opts}),
        "blosc" => {
            let mut c = opts.as_object().cloned().unwrap_or_default();
            c.insert("id".into(), "blosc".into());
            Value::Object(c)
        }
        "lzma" => serde_json::json!({"id": "lzma"}),
        other => return Err(MetaError::Unsupported(format!("v1 compression '{other}'"))),
    };
    let mut v2 = doc.clone();
    if let Some(o) = v2.as_object_mut() {
        o.insert("compressor".into(), compressor);
        o.insert("filters".into(), Value::Null);
        o.insert("dimension_separator".into(), ".".into());
    }
    let mut meta = parse_v2(&v2, attrs)?;
    meta.zarr_format = 1;
    Ok(meta)
}

/// The fields of a v3 array's metadata this server reads.
const V3_ARRAY_FIELDS: [&str; 11] = [
    "zarr_format",
    "node_type",
    "shape",
    "data_type",
    "chunk_grid",
    "chunk_key_encoding",
    "fill_value",
    "codecs",
    "attributes",
    "storage_transformers",
    "dimension_names",
];

/// The first field of a v3 array document that is an extension which must be understood: any
/// field but [`V3_ARRAY_FIELDS`], unless it says it may be ignored (an object with
/// `"must_understand": false`). An array with one must not be read (zarr-python refuses to
/// open it), for it may change what the stored bytes mean.
pub fn unknown_extension(doc: &Value) -> Option<&str> {
    doc.as_object()?
        .iter()
        .find(|(name, value)| {
            !V3_ARRAY_FIELDS.contains(&name.as_str()) && value.get("must_understand") != Some(&Value::Bool(false))
        })
        .map(|(name, _)| name.as_str())
}

/// Parses a v3 `zarr.json` array document.
pub fn parse_v3(doc: &Value) -> Result<ArrayMeta, MetaError> {
    if let Some(name) = unknown_extension(doc) {
        return Err(MetaError::Unsupported(format!(
            "metadata field '{name}' (an extension this server does not know, which does not say must_understand: false)"
        )));
    }
    let shape = shape_of(field(doc, "shape")?, "shape")?;
    let grid = field(doc, "chunk_grid")?;
    match grid.get("name").and_then(Value::as_str) {
        Some("regular") => {}
        other => {
            return Err(MetaError::Unsupported(format!(
                "chunk grid {}",
                other.unwrap_or("(unnamed)")
            )));
        }
    }
    let chunk_shape = shape_of(
        grid.get("configuration")
            .and_then(|c| c.get("chunk_shape"))
            .ok_or_else(|| MetaError::Invalid("chunk_grid needs configuration.chunk_shape".into()))?,
        "chunk_shape",
    )?;
    check_grid(&shape, &chunk_shape)?;
    if let Some(Value::Array(transformers)) = doc.get("storage_transformers")
        && !transformers.is_empty()
    {
        return Err(MetaError::Unsupported("storage transformers".into()));
    }
    let logical = DType::from_v3(field(doc, "data_type")?)?;
    let codecs = field(doc, "codecs")?
        .as_array()
        .ok_or_else(|| MetaError::Invalid("'codecs' must be a list".into()))?;
    let chain = CodecChain::from_v3(&logical, codecs, &chunk_shape)?;
    let fill = FillValue::parse(field(doc, "fill_value")?, &logical, 3)?;
    let cke = doc.get("chunk_key_encoding");
    let key_encoding = match cke.and_then(|c| c.get("name")).and_then(Value::as_str) {
        None | Some("default") => ChunkKeyEncoding::Default {
            separator: separator(
                cke.and_then(|c| c.get("configuration"))
                    .and_then(|c| c.get("separator")),
                '/',
            )?,
        },
        Some("v2") => ChunkKeyEncoding::V2 {
            separator: separator(
                cke.and_then(|c| c.get("configuration"))
                    .and_then(|c| c.get("separator")),
                '.',
            )?,
        },
        Some(other) => return Err(MetaError::Unsupported(format!("chunk key encoding '{other}'"))),
    };
    let dimension_names = doc
        .get("dimension_names")
        .and_then(Value::as_array)
        .map(|names| names.iter().map(|n| n.as_str().map(str::to_owned)).collect());
    let fingerprint = fingerprint_of(doc);
    Ok(ArrayMeta {
        zarr_format: 3,
        shape,
        chunk_shape,
        dtype: logical,
        fill,
        fill_declared: doc.get("fill_value").is_some_and(|v| !v.is_null()),
        fingerprint,
        doc_weight: parsed_weight(doc),
        key_encoding,
        chain,
        attributes: doc
            .get("attributes")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default(),
        dimension_names,
    })
}

/// Errors of finding and reading an array's metadata.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// No array at that path.
    #[error("no array at '{0}'")]
    NotFound(String),
    /// The metadata document at `key` is broken.
    #[error("metadata at '{key}': {error}")]
    Meta { key: String, error: MetaError },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Documents larger than this are parsed on the blocking pool ([`parse_document_off`]).
const PARSED_INLINE_BYTES: usize = 1 << 20;

/// [`parse_document`] as a task: a large document (up to 64 MiB, a fraction of a second of CPU)
/// is parsed on the blocking pool rather than on the async worker, where it would hold up every
/// request that worker serves; and the task yields now and then (tokio's cooperative budget), so
/// that a walk of many small documents read without waiting still lets timeouts and other tasks
/// run.
pub(crate) async fn parse_document_off(bytes: bytes::Bytes, mark: &'static str) -> serde_json::Result<Value> {
    let parsed = if bytes.len() > PARSED_INLINE_BYTES {
        crate::workers::spawn_blocking(move || crate::json_text::parse_document(&bytes, mark))
            .await
            .unwrap_or_else(|e| {
                // A panic or cancellation of the task: the log has it; the reason stays plain.
                tracing::error!(error = %e, "parsing a metadata document failed");
                Err(serde::de::Error::custom("the parse did not finish"))
            })
    } else {
        crate::json_text::parse_document(&bytes, mark)
    };
    tokio::task::consume_budget().await;
    parsed
}

async fn json_doc(store: &Store, key: &StoreKey) -> Result<Option<Value>, OpenError> {
    match store.get_document(key).await? {
        None => Ok(None),
        // The standard spelling of a non-finite fill value is the plain string.
        Some(bytes) => parse_document_off(bytes, "")
            .await
            .map(Some)
            .map_err(|e| OpenError::Meta {
                key: key.to_string(),
                error: MetaError::Invalid(format!("not JSON: {e}")),
            }),
    }
}

/// Whether a document's `zarr_format` is `n`, as zarr-python compares it (3.0 is 3).
pub(crate) fn format_is(doc: &Map<String, Value>, n: u8) -> bool {
    doc.get("zarr_format").and_then(Value::as_f64) == Some(f64::from(n))
}

/// Finds the array at `path` (v3, then v2, then v1) and parses its metadata.
pub async fn open_array(store: &Store, path: &StoreKey) -> Result<ArrayMeta, OpenError> {
    let key = |name: &str| path.join(name).map_err(|_| OpenError::NotFound(path.to_string()));
    let wrap = |k: &StoreKey| {
        let k = k.to_string();
        move |error| OpenError::Meta { key: k, error }
    };
    let v3 = key("zarr.json")?;
    // A document of another format is invalid here as in a hierarchy (see hierarchy::v3).
    let other_format = |n: u8| MetaError::Invalid(format!("zarr_format is not {n}"));
    if let Some(doc) = json_doc(store, &v3).await? {
        return match doc.get("node_type").and_then(Value::as_str) {
            Some("array") if !doc.as_object().is_some_and(|d| format_is(d, 3)) => Err(wrap(&v3)(other_format(3))),
            Some("array") => parse_v3(&doc).map_err(wrap(&v3)),
            _ => Err(OpenError::NotFound(path.to_string())),
        };
    }
    let v2 = key(".zarray")?;
    if let Some(doc) = json_doc(store, &v2).await? {
        if !doc.as_object().is_some_and(|d| format_is(d, 2)) {
            return Err(wrap(&v2)(other_format(2)));
        }
        let attrs = json_doc(store, &key(".zattrs")?).await?;
        return parse_v2(&doc, attrs.as_ref()).map_err(wrap(&v2));
    }
    let v1 = key("meta")?;
    let meta = match json_doc(store, &v1).await {
        // A `meta` that is not JSON is some other file (a name plain directories use).
        Err(OpenError::Meta { .. }) => None,
        other => other?,
    };
    if let Some(doc) = meta
        && doc.get("zarr_format").and_then(Value::as_u64) == Some(1)
    {
        let attrs = match json_doc(store, &key("attrs")?).await? {
            Some(Value::String(s)) => serde_json::from_str(&s).ok(),
            other => other,
        };
        return parse_v1(&doc, attrs.as_ref()).map_err(wrap(&v1));
    }
    Err(OpenError::NotFound(path.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absurd_chunk_shapes_are_invalid() {
        // Chunks of more than 2^48 elements are a limit of this server (422), not bad metadata:
        // zarr-python reads such an array's missing chunks as fill.
        for chunks in [[1 << 40, 1 << 40], [1 << 49, 1], [u64::MAX, 2]] {
            assert!(
                matches!(check_grid(&[10, 10], &chunks), Err(MetaError::Unsupported(_))),
                "{chunks:?}"
            );
        }
        assert!(check_grid(&[10], &[0]).is_err());
        assert!(check_grid(&[1; MAX_DIMS], &[1; MAX_DIMS]).is_ok());
        let err = check_grid(&[1; MAX_DIMS + 1], &[1; MAX_DIMS + 1]).unwrap_err();
        assert!(err.to_string().contains("65 dimensions"), "{err}");
        // The document of the crash this prevents: 200 000 dimensions of 1.
        let many = vec![1u64; 200_000];
        let doc = serde_json::json!({
            "zarr_format": 2, "shape": many, "chunks": many, "dtype": "<f8", "order": "C",
            "fill_value": 0, "compressor": null, "filters": null
        });
        assert!(parse_v2(&doc, None).is_err());
        assert!(check_grid(&[10, 10], &[5]).is_err());
        assert!(check_grid(&[1 << 40], &[1 << 20]).is_ok());
    }

    /// vlen-utf8 and vlen-bytes encode variable-length elements: with a fixed-size type the
    /// metadata is invalid (it was read, and its chunks blamed).
    #[test]
    fn vlen_codecs_need_variable_length_types() {
        let doc = |data_type: &str, codec: &str| {
            serde_json::json!({
                "zarr_format": 3, "node_type": "array", "shape": [4], "data_type": data_type,
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2]}},
                "chunk_key_encoding": {"name": "default"}, "fill_value": if data_type == "int32" { serde_json::json!(0) } else { serde_json::json!("") },
                "codecs": [{"name": codec}], "attributes": {}
            })
        };
        for codec in ["vlen-utf8", "vlen-bytes"] {
            let err = parse_v3(&doc("int32", codec)).unwrap_err();
            assert!(matches!(&err, MetaError::Invalid(m) if m.contains(codec)), "{err}");
        }
        assert!(parse_v3(&doc("string", "vlen-utf8")).is_ok());
    }

    #[test]
    fn v3_extension_fields_must_be_understood_unless_they_say_otherwise() {
        let base = serde_json::json!({
            "zarr_format": 3, "node_type": "array", "shape": [4], "data_type": "int32",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2]}},
            "chunk_key_encoding": {"name": "default"}, "fill_value": 0,
            "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
            "attributes": {}, "storage_transformers": [], "dimension_names": ["x"]
        });
        assert!(parse_v3(&base).is_ok());
        let with = |name: &str, value: Value| {
            let mut doc = base.clone();
            doc[name] = value;
            parse_v3(&doc)
        };
        assert!(with("foo_ext", serde_json::json!({"name": "foo", "must_understand": false})).is_ok());
        for refused in [
            serde_json::json!({"name": "foo"}),
            serde_json::json!({"name": "foo", "must_understand": true}),
            serde_json::json!(1),
            serde_json::json!("must_understand"),
        ] {
            let err = with("foo_ext", refused.clone()).unwrap_err();
            assert!(
                matches!(&err, MetaError::Unsupported(m) if m.contains("foo_ext")),
                "{refused}: {err}"
            );
        }
        // v3 requires a fill value.
        assert!(matches!(with("fill_value", Value::Null), Err(MetaError::Invalid(_))));
    }

    #[test]
    fn chunk_keys() {
        let d = ChunkKeyEncoding::Default { separator: '/' };
        assert_eq!(d.key(&[1, 2]), "c/1/2");
        assert_eq!(d.key(&[]), "c");
        assert_eq!(ChunkKeyEncoding::Default { separator: '.' }.key(&[0, 3]), "c.0.3");
        assert_eq!(ChunkKeyEncoding::V2 { separator: '.' }.key(&[1, 2]), "1.2");
        assert_eq!(ChunkKeyEncoding::V2 { separator: '/' }.key(&[1, 2]), "1/2");
        assert_eq!(ChunkKeyEncoding::V2 { separator: '.' }.key(&[]), "0");
    }

    /// A chunk's store key is the array's joined with the chunk's, whether they fit the stack
    /// or not: keys of many large coordinates, and arrays of long paths.
    #[test]
    fn chunk_store_keys_join_the_array_and_the_chunk() {
        let long_path = format!("a/{}/b.zarr", "x".repeat(300));
        let arrays = ["", "group/array.zarr", long_path.as_str()].map(|p| StoreKey::new(p).unwrap());
        let many = vec![u64::MAX; 12];
        for encoding in [
            ChunkKeyEncoding::Default { separator: '/' },
            ChunkKeyEncoding::Default { separator: '.' },
            ChunkKeyEncoding::V2 { separator: '.' },
            ChunkKeyEncoding::V2 { separator: '/' },
        ] {
            for array in &arrays {
                for coords in [&[][..], &[1, 20, 300], &many] {
                    let key = encoding.key_in(array, coords).unwrap();
                    assert_eq!(key, array.join(&encoding.key(coords)).unwrap());
                    let whole = match array.is_root() {
                        true => encoding.key(coords),
                        false => format!("{}/{}", array.as_str(), encoding.key(coords)),
                    };
                    assert_eq!(key.as_str(), whole);
                }
            }
        }
    }

    /// Values counted in the text before parsing, as serde_json parses them: containers, the
    /// values in them, keys not counted, strings' own brackets and commas not counted.
    #[test]
    fn documents_values_are_counted_before_parsing() {
        fn parsed(text: &str) -> usize {
            fn count(v: &Value) -> usize {
                1 + match v {
                    Value::Array(items) => items.iter().map(count).sum(),
                    Value::Object(fields) => fields.values().map(count).sum(),
                    _ => 0,
                }
            }
            count(&serde_json::from_str(text).unwrap())
        }
        for text in [
            "1",
            "[]",
            "{}",
            "[1, 2, 3]",
            "[[], [ ], {}]",
            r#"{"a": [1, {"b": "x,[{"}], "c\"]": [[[]]]}"#,
            r#" { "s" : "\\" , "t" : [ 1 ] } "#,
        ] {
            assert_eq!(
                crate::json_text::document_values(text.as_bytes()),
                parsed(text),
                "{text}"
            );
        }
        let many = format!("[{}[]]", "[],".repeat(crate::json_text::MAX_DOCUMENT_VALUES + 5));
        assert_eq!(
            crate::json_text::document_values(many.as_bytes()),
            crate::json_text::MAX_DOCUMENT_VALUES + 1
        );
        // What a parsed value weighs: a value's share, and its text.
        assert_eq!(parsed_weight(&serde_json::json!([])), PARSED_VALUE_BYTES);
        assert_eq!(
            parsed_weight(&serde_json::from_str(r#"{"key": "text", "n": 12}"#).unwrap()),
            3 * PARSED_VALUE_BYTES + "key".len() + "text".len() + "n".len() + "12".len()
        );
    }
}
