//! Shared pieces of the fuzz targets: the codec table (`codecs.json`, also read by
//! `make_seeds.py`), the fixed shard configurations, and the checks run on parsed metadata.

use std::sync::OnceLock;

use serde_json::{Value, json};
use zarrgate::codec::BytesToBytes;
use zarrgate::codec::chain::CodecChain;
use zarrgate::codec::sharding::ShardingCodec;
use zarrgate::zarr::ArrayMeta;
use zarrgate::zarr::dtype::DType;
use zarrgate::zarr::elements::Elements;
use zarrgate::zarr::fill::FillValue;

/// The output limit of every decode in the targets.
pub const LIMIT: usize = 1 << 20;

/// Splits an input into a JSON document and a chunk at the first NUL byte (JSON text never
/// holds a raw NUL, so the seeds are `document \0 chunk`).
pub fn split_doc(data: &[u8]) -> (&[u8], &[u8]) {
    match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[]),
    }
}

/// Element count of a shape; `None` when it overflows.
pub fn elements(shape: &[u64]) -> Option<u64> {
    shape.iter().try_fold(1u64, |a, b| a.checked_mul(*b))
}

/// Checks that decoded elements hold exactly `n` elements of `item` bytes (fixed) or `n` items.
pub fn assert_count(el: &Elements, n: u64, item: Option<usize>, what: &str) {
    match (el, item) {
        (Elements::Fixed(b), Some(item)) => {
            assert_eq!(b.len() as u64, n * item as u64, "{what}: fixed output of the wrong size")
        }
        (Elements::Fixed(_), None) => panic!("{what}: fixed output for a variable-length type"),
        (other, _) => assert_eq!(other.count(0) as u64, n, "{what}: wrong item count"),
    }
}

/// What the server does with parsed metadata and one stored object: name a chunk key, decode
/// the object with the array's chain (or, sharded, read its index as `read_shard` does).
pub fn exercise_meta(meta: &ArrayMeta, chunk: &[u8]) {
    let _ = meta.dtype.typestr();
    let _ = meta.dtype.descr();
    let grid = meta.grid_shape();
    let last: Vec<u64> = grid.iter().map(|g| g.saturating_sub(1)).collect();
    let _ = meta.key_encoding.key(&last);
    let _ = Elements::filled(&meta.fill, 3);

    if let Some(s) = meta.chain.sharding() {
        let inner = s.inner_grid(&meta.chunk_shape);
        if let Some(n) = elements(&inner) {
            if let Some(r) = s.index_range(n, chunk.len() as u64) {
                if let Ok(index) = s.decode_index(&chunk[r.start as usize..r.end as usize], n) {
                    assert_eq!(index.len() as u64, n);
                    for i in 0..index.len() {
                        if let Ok(Some(r)) = index.range(i, Some(chunk.len() as u64)) {
                            assert!(r.start <= r.end && r.end <= chunk.len() as u64);
                        }
                    }
                }
            }
        }
    }
    // The server decodes with the chunk shape whatever it is; the count is checked when the
    // shape's element count fits in a u64.
    if let Ok(el) = meta.chain.decode(chunk, &meta.chunk_shape, &meta.fill, LIMIT) {
        if let Some(n) = elements(&meta.chunk_shape) {
            assert_count(&el, n, meta.dtype.item_size(), "chunk");
        }
        let _ = el.heap_size();
    }
}

/// One entry of the codec table.
pub enum TableCodec {
    /// A bytes->bytes codec.
    Bytes(Box<dyn BytesToBytes>),
    /// A v2 filter chain (`filters: [config]`, no compressor) and its stored dtype.
    Filter(CodecChain, DType),
}

/// The codec table of `codecs.json`, built once.
pub fn codec_table() -> &'static [(String, TableCodec)] {
    static TABLE: OnceLock<Vec<(String, TableCodec)>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let entries: Vec<Value> = serde_json::from_str(include_str!("../codecs.json")).expect("codecs.json");
        entries
            .iter()
            .map(|e| {
                let config = &e["config"];
                let label = e.to_string();
                let codec = match e["kind"].as_str().unwrap() {
                    "v2" => TableCodec::Bytes(
                        zarrgate::codec::bytes_codec_v2(config).expect(&label).expect(&label),
                    ),
                    "v3" => TableCodec::Bytes(
                        zarrgate::codec::bytes_codec_v3(
                            e["name"].as_str().unwrap(),
                            (!config.is_null()).then_some(config),
                        )
                        .expect(&label)
                        .expect(&label),
                    ),
                    "filter" => {
                        let dtype = DType::from_v2(&e["dtype"]).expect(&label);
                        let chain = CodecChain::from_v2(&dtype, "C", std::slice::from_ref(config), None, 1)
                            .expect(&label);
                        TableCodec::Filter(chain, dtype)
                    }
                    other => panic!("unknown kind {other}"),
                };
                (label, codec)
            })
            .collect()
    })
}

/// The shard configurations of the `shard` target, by the low two bits of the mode byte:
/// 0 index at the end, 1 index at the start (both bytes+crc32c index, bytes(big)+gzip inner
/// chunks of uint16, as the fixture `sharding_index_crc32c_gzip_inner_u2`), 2 index without a
/// checksum, 3 nested sharding (the fixture `sharding_nested_i4`).
pub struct ShardCase {
    /// The codec.
    pub codec: ShardingCodec,
    /// The shard shape.
    pub shape: Vec<u64>,
    /// Element size.
    pub item: usize,
    /// Whether the index ends with a crc32c.
    pub crc: bool,
}

/// The four shard cases.
pub fn shard_cases() -> &'static [ShardCase] {
    static CASES: OnceLock<Vec<ShardCase>> = OnceLock::new();
    CASES.get_or_init(|| {
        let bytes_le = json!({"name": "bytes", "configuration": {"endian": "little"}});
        let crc = json!({"name": "crc32c"});
        let inner = json!([{"name": "bytes", "configuration": {"endian": "big"}}, {"name": "gzip", "configuration": {"level": 1}}]);
        let u2 = DType::from_v3(&json!("uint16")).unwrap();
        let i4 = DType::from_v3(&json!("int32")).unwrap();
        let flat = |location: &str, index: Value| {
            json!({"chunk_shape": [3, 5], "codecs": inner, "index_codecs": index, "index_location": location})
        };
        let nested = json!({"chunk_shape": [4, 4], "codecs": [{"name": "sharding_indexed", "configuration": {
            "chunk_shape": [2, 2],
            "codecs": [bytes_le, {"name": "zstd", "configuration": {"level": 1, "checksum": false}}],
            "index_codecs": [bytes_le, crc], "index_location": "end"}}],
            "index_codecs": [bytes_le, crc], "index_location": "end"});
        let make = |config: Value, dtype: &DType, shape: Vec<u64>, crc: bool| ShardCase {
            codec: ShardingCodec::from_v3(Some(&config), dtype, &shape).unwrap(),
            item: dtype.item_size().unwrap(),
            shape,
            crc,
        };
        vec![
            make(flat("end", json!([bytes_le, crc])), &u2, vec![6, 10], true),
            make(flat("start", json!([bytes_le, crc])), &u2, vec![6, 10], true),
            make(flat("end", json!([bytes_le])), &u2, vec![6, 10], false),
            make(nested, &i4, vec![8, 8], true),
        ]
    })
}

/// The zero fill of a shard case.
pub fn zero_fill(item: usize) -> FillValue {
    FillValue::Fixed(vec![0; item])
}
