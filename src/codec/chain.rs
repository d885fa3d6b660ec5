//! The codec chain of an array (or of a shard's inner chunks): how the stored bytes of one
//! chunk become [`Elements`]. Built from v3 `codecs` or from v2 `filters` + `compressor` +
//! `order`, so the rest of the server sees one model.

use std::borrow::Cow;

use bytes::Bytes;
use serde_json::Value;

use super::categorize::Categorize;
use super::numeric::Scalar;
use super::sharding::ShardingCodec;
use super::{
    BytesToBytes, CodecError, astype, delta, fixedscaleoffset, json2, msgpack2, packbits, transpose, vlen, zep0007,
};
use crate::dtype::MetaError;
use crate::dtype::elements::Elements;
use crate::dtype::fill::FillValue;
use crate::dtype::{DType, Kind};

/// An array->array stage.
#[derive(Debug)]
pub enum ArrayToArray {
    /// Axis permutation (v3 `transpose`, v2 `order: "F"`).
    Transpose(Vec<usize>),
    /// A numcodecs filter applied to the element bytes (v3 `numcodecs.delta`, ...); `encoded` is
    /// the element type it stores.
    Filter {
        /// The filter.
        codec: Box<dyn BytesToBytes>,
        /// The stored element type.
        encoded: DType,
    },
    /// v3 `numcodecs.packbits`: booleans packed eight to a byte, stored as a 1-D array of
    /// `1 + ceil(n / 8)` bytes (a count of padding bits, then the bits) whatever the chunk's
    /// shape, as numcodecs' v3 codec declares it.
    PackBits,
}

/// The array->bytes stage.
#[derive(Debug)]
pub enum ArrayToBytes {
    /// Fixed-size elements in the given stored type (v3 `bytes`, v2 plain data).
    Fixed(DType),
    /// numcodecs `vlen-utf8`.
    VlenUtf8,
    /// numcodecs `vlen-bytes`.
    VlenBytes,
    /// numcodecs `json2`.
    Json2,
    /// numcodecs `msgpack2`; `raw`: strings are read as bytes.
    Msgpack2 {
        /// The codec's `raw` option.
        raw: bool,
    },
    /// numcodecs `vlen-array` of 1-d arrays of this type.
    VlenArray(DType),
    /// numcodecs `categorize`.
    Categorize(Categorize),
    /// ZEP0007 variable-length layout (`binary` for bytes).
    Zep0007 {
        /// Bytes rather than strings.
        binary: bool,
    },
    /// v3 `sharding_indexed`.
    Sharding(Box<ShardingCodec>),
}

/// A full chain.
#[derive(Debug)]
pub struct CodecChain {
    /// Array->array stages, in encoding order.
    pub array_to_array: Vec<ArrayToArray>,
    /// The array->bytes stage.
    pub array_to_bytes: ArrayToBytes,
    /// Bytes->bytes stages, in encoding order.
    pub bytes_to_bytes: Vec<Box<dyn BytesToBytes>>,
    /// The element type the chain decodes to (little-endian).
    pub dtype: DType,
}

fn codec_id(config: &Value) -> &str {
    config.get("id").and_then(Value::as_str).unwrap_or("")
}

/// A numcodecs numeric filter and the element type it stores (`None`: the type it is given).
type NumericFilter = (Box<dyn BytesToBytes>, Option<DType>);

fn numeric_filter(id: &str, config: &Value) -> Result<Option<NumericFilter>, CodecError> {
    Ok(Some(match id {
        "delta" => {
            let c = delta::Delta::from_config(config)?;
            let enc = c.encoded().dtype().clone();
            (Box::new(c), Some(enc))
        }
        "fixedscaleoffset" => {
            let c = fixedscaleoffset::FixedScaleOffset::from_config(config)?;
            let enc = c.encoded().dtype().clone();
            (Box::new(c), Some(enc))
        }
        "quantize" => {
            let c = astype::AsType::from_quantize(config)?;
            let enc = c.encoded().dtype().clone();
            (Box::new(c), Some(enc))
        }
        "astype" => {
            let c = astype::AsType::from_astype(config)?;
            let enc = c.encoded().dtype().clone();
            (Box::new(c), Some(enc))
        }
        "packbits" => (Box::new(packbits::PackBits), Some(DType::new(Kind::UInt(1)))),
        // BitRound only zeroes mantissa bits when encoding; decoding is the identity.
        "bitround" => (Box::new(Identity), None),
        _ => return Ok(None),
    }))
}

/// The type a numcodecs filter decodes to, as its configuration names it (`None` for filters
/// that keep the type).
fn numeric_decoded(id: &str, config: &Value) -> Option<DType> {
    let key = match id {
        "delta" | "fixedscaleoffset" | "quantize" => "dtype",
        "astype" => "decode_dtype",
        _ => return None,
    };
    super::numeric::Scalar::parse(config, key)
        .ok()
        .map(|s| s.dtype().clone())
}

/// Whether two types hold the same elements in the same byte order.
fn same_type(a: &DType, b: &DType) -> bool {
    a.kind == b.kind && (a.big_endian == b.big_endian || a.item_size().is_some_and(|n| n <= 1))
}

/// A stage whose decoding changes nothing (numcodecs `bitround`).
#[derive(Debug)]
struct Identity;

impl BytesToBytes for Identity {
    fn decode(&self, input: &[u8], limit: usize) -> Result<Vec<u8>, CodecError> {
        if input.len() > limit {
            return Err(CodecError::TooLarge { limit });
        }
        Ok(input.to_vec())
    }
}

/// A v2 filter or compressor given elements of type `given` (`None`: bytes), and the type of
/// what it encodes to (`None`: bytes).
fn bytes_stage_v2(config: &Value, given: Option<&DType>) -> Result<(Box<dyn BytesToBytes>, Option<DType>), MetaError> {
    let id = codec_id(config);
    if let Some((codec, encoded)) = numeric_filter(id, config)? {
        return Ok((codec, encoded.or_else(|| given.cloned())));
    }
    if let Some(codec) = super::typed_codec(id, config, given)? {
        return Ok((codec, None));
    }
    let codec = super::bytes_codec_v2(config)?.ok_or_else(|| MetaError::Unsupported(format!("codec '{id}'")))?;
    Ok((codec, None))
}

impl CodecChain {
    /// The chain of a v2 (or v1) array.
    pub fn from_v2(
        stored: &DType,
        order: &str,
        filters: &[Value],
        compressor: Option<&Value>,
        ndim: usize,
    ) -> Result<Self, MetaError> {
        let first = filters.first().map(codec_id);
        let (array_to_bytes, rest, dtype) = match first {
            Some("vlen-utf8") => (ArrayToBytes::VlenUtf8, &filters[1..], DType::new(Kind::String)),
            Some("vlen-bytes") => (ArrayToBytes::VlenBytes, &filters[1..], DType::new(Kind::Bytes)),
            Some("json2") => (ArrayToBytes::Json2, &filters[1..], DType::new(Kind::Object)),
            Some("categorize") => {
                let c = Categorize::from_config(&filters[0])?;
                let dtype = match stored.kind {
                    Kind::Object => DType::new(Kind::String),
                    _ => stored.little_endian(),
                };
                (ArrayToBytes::Categorize(c), &filters[1..], dtype)
            }
            Some("vlen-array") => {
                let item = filters[0]
                    .get("dtype")
                    .ok_or_else(|| MetaError::Invalid("vlen-array has no dtype".into()))
                    .and_then(DType::from_v2)?;
                // Structured items numcodecs writes as `|V` (raw bytes); fields would be a map
                // an element, of a weight none of the others has.
                if item.is_variable()
                    || matches!(item.kind, Kind::Structured(_))
                    || item.item_size().is_none_or(|s| s == 0)
                {
                    return Err(MetaError::Unsupported(format!("vlen-array of {}", item.typestr())));
                }
                (ArrayToBytes::VlenArray(item), &filters[1..], DType::new(Kind::Object))
            }
            Some("msgpack2") => {
                let raw = super::optional_bool("msgpack2", filters[0].as_object(), "raw")?.unwrap_or(false);
                (ArrayToBytes::Msgpack2 { raw }, &filters[1..], DType::new(Kind::Object))
            }
            Some(id @ ("pickle" | "json")) => {
                return Err(MetaError::Unsupported(format!("object codec '{id}'")));
            }
            _ if stored.kind == Kind::Object => {
                return Err(MetaError::Unsupported(
                    "an object array without a known object codec".into(),
                ));
            }
            _ => (ArrayToBytes::Fixed(stored.clone()), filters, stored.little_endian()),
        };
        // The type each stage is given: the stored elements, then what numeric filters store.
        let mut given = match &array_to_bytes {
            ArrayToBytes::Fixed(_) => Some(stored.clone()),
            ArrayToBytes::Categorize(c) => Some(c.astype().clone()),
            _ => None,
        };
        let mut bytes_to_bytes = Vec::new();
        for config in rest.iter().chain(compressor) {
            let (stage, encoded) = bytes_stage_v2(config, given.as_ref())?;
            bytes_to_bytes.push(stage);
            given = encoded;
        }
        let array_to_array = match order {
            "C" => Vec::new(),
            "F" => vec![ArrayToArray::Transpose((0..ndim).rev().collect())],
            other => return Err(MetaError::Invalid(format!("unknown order '{other}'"))),
        };
        Ok(Self {
            array_to_array,
            array_to_bytes,
            bytes_to_bytes,
            dtype,
        })
    }

    /// The chain of a v3 array (or of inner chunks) of `dtype` with chunks of `chunk_shape`.
    pub fn from_v3(dtype: &DType, codecs: &[Value], chunk_shape: &[u64]) -> Result<Self, MetaError> {
        let mut array_to_array = Vec::new();
        let mut array_to_bytes = None;
        let mut bytes_to_bytes: Vec<Box<dyn BytesToBytes>> = Vec::new();
        // The first bytes->bytes codec before the array->bytes codec.
        let mut early: Option<&str> = None;
        // The element type and chunk shape as they reach the array->bytes codec.
        let mut stage_dtype = dtype.clone();
        let mut stage_shape = chunk_shape.to_vec();
        for codec in codecs {
            let (name, config) = match codec {
                Value::String(s) => (s.as_str(), None),
                Value::Object(o) => (
                    o.get("name").and_then(Value::as_str).unwrap_or(""),
                    o.get("configuration"),
                ),
                _ => return Err(MetaError::Invalid(format!("codec {codec} is not an object"))),
            };
            let before_bytes = array_to_bytes.is_none();
            match name {
                // A second array->bytes codec, or an array->array one after it: the spec allows
                // neither (and zarr-python refuses the array), which is no codec missing here.
                "transpose" | "bytes" | "endian" | "vlen-utf8" | "vlen-bytes" | "sharding_indexed"
                | "numcodecs.pcodec" | "numcodecs.zfpy"
                    if !before_bytes =>
                {
                    return Err(MetaError::Invalid(format!(
                        "codec '{name}' comes after the array->bytes codec"
                    )));
                }
                "transpose" if before_bytes => {
                    let order = transpose::parse_order(config, stage_shape.len())?;
                    stage_shape = transpose::encoded_shape(&stage_shape, &order);
                    array_to_array.push(ArrayToArray::Transpose(order));
                }
                "bytes" | "endian" if before_bytes => {
                    let endian = config.and_then(|c| c.get("endian")).and_then(Value::as_str);
                    let mut stored = stage_dtype.clone();
                    stored.big_endian = match endian {
                        Some("big") => true,
                        Some("little") | None => false,
                        Some(other) => return Err(MetaError::Invalid(format!("unknown endian '{other}'"))),
                    };
                    // Every field, nested ones too, is in the codec's byte order.
                    fn set_order(dtype: &mut DType, big: bool) {
                        dtype.big_endian = big;
                        if let Kind::Structured(fields) = &mut dtype.kind {
                            for f in fields {
                                set_order(&mut f.dtype, big);
                            }
                        }
                    }
                    let big = stored.big_endian;
                    set_order(&mut stored, big);
                    if stored.is_variable() {
                        return Err(MetaError::Invalid(format!(
                            "the bytes codec cannot encode {} elements",
                            dtype.typestr()
                        )));
                    }
                    array_to_bytes = Some(ArrayToBytes::Fixed(stored));
                }
                "vlen-utf8" | "vlen-bytes" if before_bytes && !stage_dtype.is_variable() => {
                    return Err(MetaError::Invalid(format!(
                        "the {name} codec encodes variable-length elements, not {}",
                        stage_dtype.typestr()
                    )));
                }
                "vlen-utf8" if before_bytes => array_to_bytes = Some(ArrayToBytes::VlenUtf8),
                "vlen-bytes" if before_bytes => array_to_bytes = Some(ArrayToBytes::VlenBytes),
                "sharding_indexed" if before_bytes => {
                    let codec = ShardingCodec::from_v3(config, &stage_dtype, &stage_shape)?;
                    array_to_bytes = Some(ArrayToBytes::Sharding(Box::new(codec)));
                }
                // numcodecs' PCodec and ZFPY as zarr-python writes them in v3: array->bytes codecs.
                "numcodecs.pcodec" | "numcodecs.zfpy" => {
                    let id = &name["numcodecs.".len()..];
                    if let Some(codec) = super::typed_codec(id, config.unwrap_or(&Value::Null), Some(&stage_dtype))? {
                        bytes_to_bytes.push(codec);
                    }
                    array_to_bytes = Some(ArrayToBytes::Fixed(stage_dtype.little_endian()));
                }
                n if before_bytes && n.starts_with("numcodecs.") => {
                    let id = &n["numcodecs.".len()..];
                    let mut cfg = config.cloned().unwrap_or_else(|| Value::Object(Default::default()));
                    if let Value::Object(o) = &mut cfg {
                        o.insert("id".into(), id.into());
                    }
                    match numeric_filter(id, &cfg)? {
                        Some(_) if id == "packbits" => {
                            if stage_dtype.kind != Kind::Bool {
                                return Err(MetaError::Invalid(format!(
                                    "codec '{name}' packs booleans, not {}",
                                    stage_dtype.typestr()
                                )));
                            }
                            stage_shape = vec![packed_len(&stage_shape)];
                            stage_dtype = DType::new(Kind::UInt(1));
                            array_to_array.push(ArrayToArray::PackBits);
                        }
                        Some((codec, encoded)) => {
                            // The filter must decode to what the stage before it holds: v3
                            // chains are little-endian between stages, and nothing converts
                            // the filter's output to another type.
                            if let Some(decoded) = numeric_decoded(id, &cfg).filter(|d| !same_type(d, &stage_dtype)) {
                                return Err(MetaError::Invalid(format!(
                                    "codec '{name}' decodes to {} where the chain holds {}",
                                    decoded.typestr(),
                                    stage_dtype.typestr()
                                )));
                            }
                            let encoded = encoded.unwrap_or_else(|| stage_dtype.clone());
                            stage_dtype = encoded.clone();
                            array_to_array.push(ArrayToArray::Filter { codec, encoded });
                        }
                        None => match super::bytes_codec_v3(name, config)? {
                            Some(c) => {
                                early = early.or(before_bytes.then_some(name));
                                bytes_to_bytes.push(c);
                            }
                            None => return Err(MetaError::Unsupported(format!("codec '{name}'"))),
                        },
                    }
                }
                _ => match super::bytes_codec_v3(name, config)? {
                    Some(c) => {
                        early = early.or(before_bytes.then_some(name));
                        bytes_to_bytes.push(c);
                    }
                    None => return Err(MetaError::Unsupported(format!("codec '{name}'"))),
                },
            }
        }
        // A bytes->bytes codec before the array->bytes codec: the spec allows it no more than
        // zarr-python does. (Without an array->bytes codec, ZEP0007, every one comes first.)
        if let (Some(_), Some(name)) = (&array_to_bytes, early) {
            return Err(MetaError::Invalid(format!(
                "codec '{name}' comes before the array->bytes codec"
            )));
        }
        let array_to_bytes = match array_to_bytes {
            Some(a) => a,
            // ZEP0007: variable-length types without an array->bytes codec.
            None => match stage_dtype.kind {
                Kind::String => ArrayToBytes::Zep0007 { binary: false },
                Kind::Bytes => ArrayToBytes::Zep0007 { binary: true },
                _ => return Err(MetaError::Invalid("the codecs have no array->bytes codec".into())),
            },
        };
        Ok(Self {
            array_to_array,
            array_to_bytes,
            bytes_to_bytes,
            dtype: dtype.little_endian(),
        })
    }

    /// The sharding codec, when the chain is sharded with nothing before it (the case readers
    /// can serve with ranged reads).
    pub fn sharding(&self) -> Option<&ShardingCodec> {
        match (
            &self.array_to_bytes,
            self.array_to_array.is_empty(),
            self.bytes_to_bytes.is_empty(),
        ) {
            (ArrayToBytes::Sharding(s), true, true) => Some(s),
            _ => None,
        }
    }

    /// [`CodecChain::decode`] of a buffer the caller gives up: a chunk stored as plain
    /// fixed-size elements (no compressor, filter or transpose) becomes the elements without a
    /// copy, where the buffer is not shared.
    pub fn decode_bytes(
        &self,
        input: Bytes,
        shape: &[u64],
        fill: &FillValue,
        limit: usize,
    ) -> Result<Elements, CodecError> {
        match &self.array_to_bytes {
            ArrayToBytes::Fixed(stored) if self.bytes_to_bytes.is_empty() && self.array_to_array.is_empty() => {
                check_fixed_len(stored, input.len(), shape.iter().product::<u64>() as usize)?;
                let mut owned = Vec::from(input);
                stored.to_little_endian(&mut owned);
                Ok(coerce(Elements::Fixed(owned), &self.dtype))
            }
            _ => self.decode(&input, shape, fill, limit),
        }
    }

    /// Decodes one stored chunk of `shape` elements. `limit` bounds every intermediate buffer.
    pub fn decode(&self, input: &[u8], shape: &[u64], fill: &FillValue, limit: usize) -> Result<Elements, CodecError> {
        let (shapes, items) = self.stages(shape);
        let encoded_shape = &shapes[shapes.len() - 1];
        let n = encoded_shape.iter().product::<u64>() as usize;
        let limit = self.widened(limit, &items, encoded_shape);
        let mut bytes = Cow::Borrowed(input);
        for stage in self.bytes_to_bytes.iter().rev() {
            bytes = Cow::Owned(stage.decode(&bytes, limit)?);
        }
        let mut elements = match &self.array_to_bytes {
            ArrayToBytes::Fixed(stored) => {
                check_fixed_len(stored, bytes.len(), n)?;
                let mut owned = bytes.into_owned();
                stored.to_little_endian(&mut owned);
                Elements::Fixed(owned)
            }
            ArrayToBytes::VlenUtf8 => vlen::decode_utf8(&bytes, n, limit)?,
            ArrayToBytes::VlenBytes => vlen::decode_bytes(&bytes, n, limit)?,
            ArrayToBytes::Msgpack2 { raw } => msgpack2::decode(&bytes, n, *raw, limit)?,
            ArrayToBytes::VlenArray(item) => vlen::decode_arrays(&bytes, n, item, limit)?,
            ArrayToBytes::Json2 => json2::decode(&bytes, n, limit)?,
            ArrayToBytes::Categorize(c) => c.decode(&bytes, n, limit)?,
            ArrayToBytes::Zep0007 { binary } => zep0007::decode(&bytes, n, *binary, limit)?,
            ArrayToBytes::Sharding(s) => s.decode_shard(&bytes, encoded_shape, &self.stored_fill(fill), limit)?,
        };
        for (i, stage) in self.array_to_array.iter().enumerate().rev() {
            elements = match stage {
                ArrayToArray::Transpose(order) => transpose::decode(elements, &shapes[i + 1], order, items[i + 1])?,
                ArrayToArray::Filter { codec, .. } => match elements {
                    Elements::Fixed(b) => Elements::Fixed(codec.decode(&b, limit)?),
                    _ => return Err(CodecError::Corrupt("numeric filter on variable-length data".into())),
                },
                ArrayToArray::PackBits => match elements {
                    Elements::Fixed(b) => Elements::Fixed(packbits::PackBits.decode(&b, limit)?),
                    _ => return Err(CodecError::Corrupt("packbits on variable-length data".into())),
                },
            };
        }
        // Whatever the stages did, a fixed-size chunk holds exactly its elements.
        if let (Elements::Fixed(b), Some(_)) = (&elements, self.dtype.item_size().filter(|&s| s > 0)) {
            check_fixed_len(&self.dtype, b.len(), shape.iter().product::<u64>() as usize)?;
        }
        Ok(coerce(elements, &self.dtype))
    }
}

impl CodecChain {
    /// The fill value as the array->bytes codec sees it: cast to each numeric filter's stored
    /// type on the way, as zarr-python casts it (a shard behind `numcodecs.delta` with astype
    /// int16 fills its empty inner chunks with int16 values). Where no cast applies, as given.
    fn stored_fill(&self, fill: &FillValue) -> FillValue {
        let FillValue::Fixed(mut bytes) = fill.clone() else {
            return fill.clone();
        };
        let mut dtype = self.dtype.clone();
        for stage in &self.array_to_array {
            if let ArrayToArray::Filter { encoded, .. } = stage {
                // Elements between stages are little-endian.
                let mut to = encoded.clone();
                to.big_endian = false;
                let cast = Scalar::new(dtype.clone())
                    .and_then(|from| Scalar::new(to.clone())?.convert_from(&from, &bytes, usize::MAX));
                match cast {
                    Ok(b) => bytes = b,
                    Err(_) => return fill.clone(),
                }
                dtype = to;
            }
        }
        FillValue::Fixed(bytes)
    }

    /// `limit`, given for the decoded chunk, widened for what the stages before the last hold:
    /// a filter's stored type wider than the array's (`items`, per array->array stage), Base64
    /// text (4/3 of what it encodes), and the strings categorize makes of a `<U` array before
    /// they are fixed-width. Valid chunks of such chains were refused as too large.
    /// Shapes and element sizes of a chunk of `shape` as each array->array stage leaves it
    /// (the first, decoded; the last, encoded).
    fn stages(&self, shape: &[u64]) -> (Vec<Vec<u64>>, Vec<usize>) {
        let mut shapes = vec![shape.to_vec()];
        let mut items = vec![self.dtype.item_size().unwrap_or(0)];
        for stage in &self.array_to_array {
            let (last_shape, last_item) = (&shapes[shapes.len() - 1], items[items.len() - 1]);
            match stage {
                ArrayToArray::Transpose(order) => {
                    shapes.push(transpose::encoded_shape(last_shape, order));
                    items.push(last_item);
                }
                ArrayToArray::Filter { encoded, .. } => {
                    shapes.push(last_shape.clone());
                    items.push(encoded.item_size().unwrap_or(0));
                }
                ArrayToArray::PackBits => {
                    shapes.push(vec![packed_len(last_shape)]);
                    items.push(1);
                }
            }
        }
        (shapes, items)
    }

    /// The most bytes any buffer decoding a chunk of `shape` holds, the stored chunk included,
    /// when the decoded chunk may take `limit`: what its stages may widen it to. `None` for a
    /// shard read whole (sharding inside other codecs), whose inner chunks' encodings and index
    /// are not bounded so.
    pub fn bound(&self, shape: &[u64], limit: usize) -> Option<usize> {
        if matches!(self.array_to_bytes, ArrayToBytes::Sharding(_)) {
            return None;
        }
        let (shapes, items) = self.stages(shape);
        Some(self.widened(limit, &items, &shapes[shapes.len() - 1]))
    }

    /// `limit` widened for the stages: `items` are the item sizes of the array->array stages'
    /// elements, `encoded` the shape the array->bytes codec encodes.
    fn widened(&self, limit: usize, items: &[usize], encoded: &[u64]) -> usize {
        let n = encoded.iter().product::<u64>() as usize;
        let decoded = items.first().copied().unwrap_or(0);
        let widest = items.iter().copied().max().unwrap_or(0);
        let mut limit = match decoded {
            0 => limit,
            d => limit.saturating_mul(widest.div_ceil(d).max(1)),
        };
        for stage in &self.bytes_to_bytes {
            let (num, den) = stage.expansion(encoded);
            if num > den {
                limit = (limit.saturating_mul(num) / den.max(1)).saturating_add(num);
            }
        }
        if matches!(self.array_to_bytes, ArrayToBytes::Categorize(_))
            && matches!(self.dtype.kind, Kind::FixedUnicode(_))
        {
            limit = limit.saturating_add(n.saturating_mul(crate::dtype::elements::ELEMENT_BYTES));
        }
        limit
    }
}

/// The bytes packbits stores `shape`'s booleans in: a count of padding bits, then eight to a byte.
fn packed_len(shape: &[u64]) -> u64 {
    1 + shape.iter().product::<u64>().div_ceil(8)
}

/// Plain fixed-size elements must fill the chunk exactly.
fn check_fixed_len(stored: &DType, len: usize, n: usize) -> Result<(), CodecError> {
    let size = stored.item_size().unwrap_or(0);
    if len != n * size {
        return Err(CodecError::Corrupt(format!(
            "chunk decodes to {len} bytes, expected {} ({n} elements of {size} bytes)",
            n * size
        )));
    }
    Ok(())
}

/// Strings decoded for a fixed-width unicode array (categorize on `<U`) become UTF-32.
fn coerce(elements: Elements, dtype: &DType) -> Elements {
    match (elements, &dtype.kind) {
        (Elements::Strings(v), Kind::FixedUnicode(n)) => {
            let mut out = Vec::with_capacity(v.len() * 4 * n);
            for s in v {
                let start = out.len();
                out.extend(
                    s.unwrap_or_default()
                        .chars()
                        .take(*n)
                        .flat_map(|c| (c as u32).to_le_bytes()),
                );
                out.resize(start + 4 * n, 0);
            }
            Elements::Fixed(out)
        }
        (e, _) => e,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn chain(data_type: &str, codecs: Value) -> Result<CodecChain, MetaError> {
        let dtype = DType::from_v3(&json!(data_type)).unwrap();
        CodecChain::from_v3(&dtype, codecs.as_array().unwrap(), &[4])
    }

    /// The chain of a 1-d v2 array of `dtype` with `filters` and `compressor`.
    fn v2_chain(dtype: &str, filters: Value, compressor: Value) -> Result<CodecChain, MetaError> {
        let stored = DType::from_v2(&json!(dtype)).unwrap();
        CodecChain::from_v2(&stored, "C", filters.as_array().unwrap(), Some(&compressor), 1)
    }

    #[test]
    fn v3_numcodecs_filters_decode_to_the_type_they_replace() {
        let bytes = json!({"name": "bytes", "configuration": {"endian": "little"}});
        let astype = |decode: &str| json!([{"name": "numcodecs.astype", "configuration": {"encode_dtype": "|i1", "decode_dtype": decode}}, bytes]);
        // int8 stored, int32 decoded: four elements of 1 byte each decode to 16 bytes.
        let c = chain("int32", astype("<i4")).unwrap();
        let out = c
            .decode(&[1, 2, 0xff, 4], &[4], &FillValue::Fixed(vec![0; 4]), 1 << 10)
            .unwrap();
        let want: Vec<u8> = [1i32, 2, -1, 4].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(out, Elements::Fixed(want));
        // A filter that decodes to another type or byte order than the array's is refused.
        for decode in ["<i8", ">i4"] {
            let err = chain("int32", astype(decode)).unwrap_err().to_string();
            assert!(err.contains("decodes to"), "{decode}: {err}");
        }
    }

    /// A shard behind a numeric filter that stores another type: its empty inner chunks are
    /// the fill cast to that type. Values as zarr-python reads the same bytes (written by it
    /// with `numcodecs.zarr3.Delta(dtype="int32", astype="int16")`, fill 5, and the third inner
    /// chunk's index entry then marked empty): [1, 2, 5, 5, 10, 15, 17, 19].
    #[test]
    fn shards_behind_type_changing_filters_fill_in_the_stored_type() {
        let bytes = json!({"name": "bytes", "configuration": {"endian": "little"}});
        let codecs = json!([
            {"name": "numcodecs.delta", "configuration": {"dtype": "int32", "astype": "int16"}},
            {"name": "sharding_indexed", "configuration": {"chunk_shape": [2], "codecs": [bytes],
                "index_codecs": [bytes], "index_location": "end"}}
        ]);
        let dtype = DType::from_v3(&json!("int32")).unwrap();
        let c = CodecChain::from_v3(&dtype, codecs.as_array().unwrap(), &[8]).unwrap();
        let mut shard: Vec<u8> = [1i16, 1, 3, 0, 2, 2].iter().flat_map(|v| v.to_le_bytes()).collect();
        for (offset, len) in [(0u64, 4u64), (4, 4), (u64::MAX, u64::MAX), (8, 4)] {
            shard.extend(offset.to_le_bytes());
            shard.extend(len.to_le_bytes());
        }
        let fill = FillValue::Fixed(5i32.to_le_bytes().to_vec());
        let out = c.decode(&shard, &[8], &fill, 1 << 10).unwrap();
        let want: Vec<u8> = [1i32, 2, 5, 5, 10, 15, 17, 19]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(out, Elements::Fixed(want));
    }

    /// pcodec and zfpy encode typed numbers: the type that reaches them is the array's, or what the
    /// numeric filters before them store; in v3 they are the array->bytes codec.
    #[test]
    fn typed_codecs_get_the_type_that_reaches_them() {
        let v2 = |dtype: &str, filters: Value| v2_chain(dtype, filters, json!({"id": "pcodec"}));
        let pcodec_of = |c: &CodecChain| format!("{:?}", c.bytes_to_bytes.last().unwrap());
        assert!(pcodec_of(&v2("<i4", json!([])).unwrap()).contains("I32"));
        assert!(pcodec_of(&v2("<M8[s]", json!([])).unwrap()).contains("I64"));
        let delta = json!([{"id": "delta", "dtype": "<i8", "astype": "<i2"}]);
        assert!(pcodec_of(&v2("<i8", delta).unwrap()).contains("I16"));
        // Filters that keep the type pass it on; bytes codecs leave bytes.
        assert!(pcodec_of(&v2("<f4", json!([{"id": "bitround", "keepbits": 3}])).unwrap()).contains("F32"));
        // Categorize stores its codes in its astype; big-endian datetimes are int64 to numcodecs.
        let categorize = json!([{"id": "categorize", "labels": ["a", "b"], "dtype": "|O", "astype": "<u2"}]);
        assert!(pcodec_of(&v2("|O", categorize).unwrap()).contains("U16"));
        assert!(pcodec_of(&v2(">M8[s]", json!([])).unwrap()).contains("I64"));
        for (dtype, filters) in [
            ("<i4", json!([{"id": "shuffle", "elementsize": 4}])),
            ("<i4", json!([{"id": "zlib", "level": 1}])),
            (">i4", json!([])),
            ("|b1", json!([])),
        ] {
            assert!(
                matches!(v2(dtype, filters.clone()), Err(MetaError::Unsupported(_))),
                "{dtype} {filters}"
            );
        }
        // v3: the array->bytes codec, decoded after every bytes->bytes codec.
        let pcodec = json!({"name": "numcodecs.pcodec", "configuration": {"level": 8}});
        let c = chain(
            "float64",
            json!([pcodec, {"name": "zstd", "configuration": {"level": 1}}]),
        )
        .unwrap();
        assert!(matches!(&c.array_to_bytes, ArrayToBytes::Fixed(d) if d.kind == Kind::Float(8)));
        assert!(format!("{:?}", c.bytes_to_bytes).starts_with("[Pcodec { numbers: F64 }, Zstd"));
        let bytes = json!({"name": "bytes", "configuration": {"endian": "little"}});
        let err = chain("float64", json!([bytes, pcodec])).unwrap_err().to_string();
        assert!(err.contains("comes after the array->bytes codec"), "{err}");
        assert!(matches!(
            chain("string", json!([pcodec])),
            Err(MetaError::Unsupported(_))
        ));
        // zfpy takes the same places.
        let zfpy = json!({"name": "numcodecs.zfpy", "configuration": {"mode": 4, "tolerance": 0.1}});
        let c = chain("int64", json!([zfpy, {"name": "zstd", "configuration": {"level": 1}}])).unwrap();
        assert!(format!("{:?}", c.bytes_to_bytes).starts_with("[Zfpy { scalar: I64 }, Zstd"));
        let err = chain("float64", json!([bytes, zfpy])).unwrap_err().to_string();
        assert!(err.contains("comes after the array->bytes codec"), "{err}");
        let delta = json!([{"id": "delta", "dtype": "<i8", "astype": "<i4"}]);
        let c = v2_chain("<i8", delta, json!({"id": "zfpy"})).unwrap();
        assert!(format!("{:?}", c.bytes_to_bytes.last().unwrap()).contains("I32"));
        assert!(matches!(
            v2_chain("<i8", json!([{"id": "zlib"}]), json!({"id": "zfpy"})),
            Err(MetaError::Unsupported(_))
        ));
    }

    /// A bytes->bytes codec before the array->bytes codec is refused, as zarr-python refuses it;
    /// without an array->bytes codec (ZEP0007) every one comes first.
    #[test]
    fn bytes_codecs_come_after_the_array_to_bytes_codec() {
        let gzip = json!({"name": "gzip", "configuration": {"level": 1}});
        for serializer in [
            json!({"name": "bytes", "configuration": {"endian": "little"}}),
            json!({"name": "numcodecs.pcodec"}),
            json!({"name": "numcodecs.crc32"}),
        ] {
            let codecs = json!([gzip, serializer]);
            let err = chain("int32", codecs.clone());
            if serializer["name"] == "numcodecs.crc32" {
                // Two bytes->bytes codecs and no array->bytes one: ZEP0007 is for strings only.
                assert!(matches!(err, Err(MetaError::Invalid(_))), "{codecs}");
                continue;
            }
            let err = err.unwrap_err().to_string();
            assert!(
                err.contains("'gzip' comes before the array->bytes codec"),
                "{codecs}: {err}"
            );
        }
        let zep0007 = chain("string", json!([gzip, {"name": "zstd", "configuration": {"level": 1}}])).unwrap();
        assert!(matches!(
            zep0007.array_to_bytes,
            ArrayToBytes::Zep0007 { binary: false }
        ));
    }

    /// ZFP codes each dimension padded to blocks of four, with up to twice the type's bits: a
    /// chunk of 1 x 1024 x 1024 float32 at zfpy's tightest tolerance is stored in 13,033,128
    /// bytes (numcodecs, tolerance 1e-7), three times its 4 MiB, and must not be refused.
    #[test]
    fn zfpy_chunks_may_be_larger_than_their_data() {
        let zfpy = json!({"name": "numcodecs.zfpy", "configuration": {"mode": 4, "tolerance": 1e-7}});
        let dtype = DType::from_v3(&json!("float32")).unwrap();
        let c = CodecChain::from_v3(&dtype, std::slice::from_ref(&zfpy), &[1, 1024, 1024]).unwrap();
        let decoded = 4 << 20;
        let bound = c.bound(&[1, 1024, 1024], decoded).unwrap();
        assert!(bound >= 13_033_128, "{bound}");
        assert!(bound <= 8 * decoded + 8, "{bound}");
        // Without padding, twice.
        let c = CodecChain::from_v3(&dtype, &[zfpy], &[1024, 1024]).unwrap();
        assert_eq!(c.bound(&[1024, 1024], decoded).unwrap(), 2 * decoded + 2);
    }

    fn zlib(data: &[u8]) -> Vec<u8> {
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut z, data).unwrap();
        z.finish().unwrap()
    }

    /// Stages before the last may hold more than the decoded chunk: the limit given for the
    /// decoded chunk (here exactly its size) is widened for them, and such chunks decode.
    #[test]
    fn stages_larger_than_the_chunk_decode_within_the_limit() {
        let v2 = |dtype: &str, filters: Value| v2_chain(dtype, filters, json!({"id": "zlib", "level": 1})).unwrap();
        let fill = FillValue::Fixed(vec![0; 2]);
        // float16 stored as int32 (fixedscaleoffset): the inflated chunk is twice the decoded.
        let c = v2(
            "<f2",
            json!([{"id": "fixedscaleoffset", "scale": 10, "offset": 0, "dtype": "<f2", "astype": "<i4"}]),
        );
        let stored: Vec<u8> = [15i32, -20, 0, 100].iter().flat_map(|v| v.to_le_bytes()).collect();
        let out = c.decode(&zlib(&stored), &[4], &fill, 8).unwrap();
        let want: Vec<u8> = [1.5f32, -2.0, 0.0, 10.0]
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect();
        assert_eq!(out, Elements::Fixed(want));
        // Base64 text is 4/3 of the bytes it holds.
        let c = v2("<i4", json!([{"id": "base64"}]));
        let data: Vec<u8> = (0..64i32).flat_map(|v| v.to_le_bytes()).collect();
        let text = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &data);
        let out = c.decode(&zlib(text.as_bytes()), &[64], &fill, data.len()).unwrap();
        assert_eq!(out, Elements::Fixed(data));
        // Categorize on <U3: strings first, then fixed-width.
        let c = v2(
            "<U3",
            json!([{"id": "categorize", "labels": ["foo", "bar"], "dtype": "<U3", "astype": "|u1"}]),
        );
        let codes: Vec<u8> = (0..1000).map(|i| (i % 3) as u8).collect();
        let Elements::Fixed(out) = c.decode(&zlib(&codes), &[1000], &fill, 12 * 1000).unwrap() else {
            panic!("fixed-width strings")
        };
        assert_eq!(out.len(), 12 * 1000);
        assert_eq!(&out[12..24], [b'f', 0, 0, 0, b'o', 0, 0, 0, b'o', 0, 0, 0]);
    }
}
