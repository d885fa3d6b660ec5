//! v3 `sharding_indexed`: a shard holds inner chunks, each encoded with the inner codec chain,
//! and an index of (offset, nbytes) little-endian u64 pairs per inner chunk, at the start or the
//! end of the shard, itself encoded with the index codecs (bytes, optionally crc32c). An entry of
//! two `u64::MAX` marks an empty inner chunk, which reads as the fill value.
//! Spec: <https://zarr-specs.readthedocs.io/en/latest/v3/codecs/sharding-indexed/index.html>
//!
//! Readers fetch the index alone (a suffix or prefix range of the shard) and then only the byte
//! ranges of the inner chunks they need; [`ShardingCodec::decode_shard`] decodes a shard that is
//! already in memory (nested sharding).

use std::ops::Range;

use serde_json::Value;

use super::CodecError;
use super::chain::CodecChain;
use crate::dtype::elements::{BlockCopy, Elements};
use crate::dtype::fill::FillValue;
use crate::dtype::{DType, Kind};

/// Where the index sits in a shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexLocation {
    /// The first bytes of the shard.
    Start,
    /// The last bytes of the shard.
    End,
}

/// The sharding codec's configuration.
#[derive(Debug)]
pub struct ShardingCodec {
    /// Shape of an inner chunk.
    pub inner_shape: Vec<u64>,
    /// Codecs of the inner chunks.
    pub inner: CodecChain,
    /// Codecs of the index.
    index: CodecChain,
    /// Bytes of checksum the index codecs add.
    index_extra: usize,
    /// Where the index is.
    pub index_location: IndexLocation,
}

/// A decoded shard index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardIndex {
    entries: Vec<u64>,
}

impl ShardIndex {
    /// Number of inner chunks.
    pub fn len(&self) -> usize {
        self.entries.len() / 2
    }

    /// Whether the index has no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Byte range of inner chunk `i` in the shard; `None` when it is empty.
    pub fn range(&self, i: usize, shard_len: Option<u64>) -> Result<Option<Range<u64>>, CodecError> {
        let (offset, nbytes) = match (self.entries.get(2 * i), self.entries.get(2 * i + 1)) {
            (Some(o), Some(n)) => (*o, *n),
            _ => return Err(CodecError::Corrupt(format!("shard index has no entry {i}"))),
        };
        if offset == u64::MAX && nbytes == u64::MAX {
            return Ok(None);
        }
        // No encoding of an inner chunk (which holds at least one element) is empty.
        if nbytes == 0 {
            return Err(CodecError::Corrupt(format!("shard index entry {i} has no bytes")));
        }
        let end = offset
            .checked_add(nbytes)
            .filter(|end| shard_len.is_none_or(|len| *end <= len))
            .ok_or_else(|| CodecError::Corrupt(format!("shard index entry {i} points past the shard")))?;
        Ok(Some(offset..end))
    }

    /// Heap size in bytes (cache weight).
    pub fn heap_size(&self) -> usize {
        self.entries.len() * 8
    }
}

impl ShardingCodec {
    /// Parses the codec configuration for shards of `shard_shape` holding `dtype` elements.
    pub fn from_v3(config: Option<&Value>, dtype: &DType, shard_shape: &[u64]) -> Result<Self, CodecError> {
        let config = config.ok_or_else(|| CodecError::Config("sharding_indexed needs a configuration".into()))?;
        let inner_shape: Vec<u64> = config
            .get("chunk_shape")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().map(Value::as_u64).collect())
            .ok_or_else(|| CodecError::Config("sharding needs chunk_shape".into()))?;
        if inner_shape.len() != shard_shape.len() || inner_shape.contains(&0) {
            return Err(CodecError::Config(format!(
                "inner chunk shape {inner_shape:?} does not fit shard shape {shard_shape:?}"
            )));
        }
        if shard_shape.iter().zip(&inner_shape).any(|(s, c)| s % c != 0) {
            return Err(CodecError::Config(format!(
                "shard shape {shard_shape:?} is not a multiple of inner chunk shape {inner_shape:?}"
            )));
        }
        let list = |key: &str| -> Result<Vec<Value>, CodecError> {
            match config.get(key) {
                Some(Value::Array(a)) => Ok(a.clone()),
                None => Ok(Vec::new()),
                Some(_) => Err(CodecError::Config(format!("sharding {key} must be a list"))),
            }
        };
        let inner = CodecChain::from_v3(dtype, &list("codecs")?, &inner_shape).map_err(meta_to_codec)?;
        let index_codecs = match config.get("index_codecs") {
            None => vec![
                serde_json::json!({"name": "bytes", "configuration": {"endian": "little"}}),
                serde_json::json!({"name": "crc32c"}),
            ],
            Some(_) => list("index_codecs")?,
        };
        let mut index_extra = 0;
        for c in &index_codecs {
            match c.get("name").and_then(Value::as_str) {
                Some("bytes") => {}
                Some("crc32c") => index_extra += 4,
                other => {
                    return Err(CodecError::Unsupported(format!(
                        "shard index codec '{}' (only bytes and crc32c keep the index a fixed size)",
                        other.unwrap_or("?")
                    )));
                }
            }
        }
        let mut index_shape: Vec<u64> = shard_shape.iter().zip(&inner_shape).map(|(s, c)| s / c).collect();
        index_shape.push(2);
        let index =
            CodecChain::from_v3(&DType::new(Kind::UInt(8)), &index_codecs, &index_shape).map_err(meta_to_codec)?;
        let index_location = match config.get("index_location").and_then(Value::as_str) {
            None | Some("end") => IndexLocation::End,
            Some("start") => IndexLocation::Start,
            Some(other) => return Err(CodecError::Config(format!("unknown index_location '{other}'"))),
        };
        Ok(Self {
            inner_shape,
            inner,
            index,
            index_extra,
            index_location,
        })
    }

    /// Inner chunks per dimension of a shard.
    pub fn inner_grid(&self, shard_shape: &[u64]) -> Vec<u64> {
        self.inner_per_dim(shard_shape).collect()
    }

    /// Inner chunks per dimension of a shard, without a list of them.
    pub fn inner_per_dim<'a>(&'a self, shard_shape: &'a [u64]) -> impl Iterator<Item = u64> + 'a {
        shard_shape.iter().zip(&self.inner_shape).map(|(s, c)| s / c)
    }

    /// Inner chunks in a shard, saturating.
    pub fn inner_count(&self, shard_shape: &[u64]) -> u64 {
        self.inner_per_dim(shard_shape).fold(1u64, u64::saturating_mul)
    }

    /// Encoded size of the index of a shard with `n` inner chunks.
    pub fn index_size(&self, n: u64) -> u64 {
        n.saturating_mul(16).saturating_add(self.index_extra as u64)
    }

    /// Decodes the index bytes of a shard with `n` inner chunks.
    pub fn decode_index(&self, bytes: &[u8], n: u64) -> Result<ShardIndex, CodecError> {
        if bytes.len() as u64 != self.index_size(n) {
            return Err(CodecError::Corrupt(format!(
                "shard index is {} bytes, expected {}",
                bytes.len(),
                self.index_size(n)
            )));
        }
        let zero = FillValue::Fixed(vec![0; 8]);
        let decoded = self.index.decode(bytes, &[n, 2], &zero, bytes.len())?;
        let Elements::Fixed(raw) = decoded else {
            return Err(CodecError::Corrupt("shard index is not fixed-size".into()));
        };
        let entries = raw
            .chunks_exact(8)
            .map(|b| u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
            .collect();
        Ok(ShardIndex { entries })
    }

    /// Where the index lies in a shard of `shard_len` bytes.
    pub fn index_range(&self, n: u64, shard_len: u64) -> Option<Range<u64>> {
        let size = self.index_size(n);
        (size <= shard_len).then(|| match self.index_location {
            IndexLocation::Start => 0..size,
            IndexLocation::End => shard_len - size..shard_len,
        })
    }

    /// Decodes a whole shard held in memory into an array of `shard_shape`.
    pub fn decode_shard(
        &self,
        bytes: &[u8],
        shard_shape: &[u64],
        fill: &FillValue,
        limit: usize,
    ) -> Result<Elements, CodecError> {
        let grid = self.inner_grid(shard_shape);
        let n: u64 = grid.iter().product();
        let range = self
            .index_range(n, bytes.len() as u64)
            .ok_or_else(|| CodecError::Corrupt("shard is smaller than its index".into()))?;
        let index = self.decode_index(&bytes[range.start as usize..range.end as usize], n)?;
        let total: u64 = shard_shape.iter().product();
        let item = self.inner.dtype.item_size().unwrap_or(0);
        // What the filled shard takes before any inner chunk is decoded into it.
        if Elements::filled_size(fill, total).max(total) > limit as u64 {
            return Err(CodecError::TooLarge { limit });
        }
        let mut out = Elements::filled(fill, total as usize);
        // Variable-length elements: what the inner chunks' elements hold, added as they are copied.
        let mut held = Elements::filled_size(fill, total);
        let ones = vec![1u64; grid.len()];
        let zeros = vec![0u64; grid.len()];
        let mut coords = vec![0u64; grid.len()];
        for i in 0..n as usize {
            if let Some(r) = index.range(i, Some(bytes.len() as u64))? {
                let chunk =
                    self.inner
                        .decode(&bytes[r.start as usize..r.end as usize], &self.inner_shape, fill, limit)?;
                let dst_start: Vec<u64> = coords.iter().zip(&self.inner_shape).map(|(c, s)| c * s).collect();
                let content = out
                    .copy_block(
                        &chunk,
                        item,
                        &BlockCopy {
                            src_shape: &self.inner_shape,
                            src_start: &zeros,
                            src_step: &ones,
                            dst_shape: shard_shape,
                            dst_start: &dst_start,
                            count: &self.inner_shape,
                        },
                    )
                    .map_err(|e| CodecError::Corrupt(e.to_string()))?;
                held = held.saturating_add(content as u64);
                if held > limit as u64 {
                    return Err(CodecError::OverLimit(format!(
                        "the shard's variable-length elements take more than the limit of {limit} bytes"
                    )));
                }
            }
            // Next inner chunk coordinates, C order.
            for d in (0..coords.len()).rev() {
                coords[d] += 1;
                if coords[d] < grid[d] {
                    break;
                }
                coords[d] = 0;
            }
        }
        Ok(out)
    }
}

fn meta_to_codec(e: crate::dtype::MetaError) -> CodecError {
    match e {
        crate::dtype::MetaError::Unsupported(m) => CodecError::Unsupported(m),
        crate::dtype::MetaError::Invalid(m) => CodecError::Config(m),
    }
}
