//! Variable-length chunks: ZEP0007 (`string`, `binary`), numcodecs `vlen-utf8`, `vlen-bytes`,
//! `json2`, `msgpack2`, `categorize` (object and `<U5`) and `vlen-array` (`<f8` and `>i2` items).
//!
//! Byte 0 picks the codec (mod 10), bytes 1-2 are the item count the chunk should hold
//! (little-endian u16), the rest is the chunk.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::json;
use zarrgate::codec::categorize::Categorize;
use zarrgate::codec::{json2, msgpack2, vlen, zep0007};
use zarrgate_fuzz::assert_count;

/// What one decode may hold, as the server's limit for chunks of variable-length elements.
const LIMIT: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let [mode, n0, n1, chunk @ ..] = data else { return };
    let n = u16::from_le_bytes([*n0, *n1]) as usize;
    let result = match mode % 10 {
        0 => zep0007::decode(chunk, n, false, LIMIT),
        1 => zep0007::decode(chunk, n, true, LIMIT),
        2 => vlen::decode_utf8(chunk, n, LIMIT),
        3 => vlen::decode_bytes(chunk, n, LIMIT),
        4 => json2::decode(chunk, n, LIMIT),
        9 => msgpack2::decode(chunk, n, *mode >= 128, LIMIT),
        7 | 8 => {
            let item = zarrgate::dtype::DType::from_v2(&json!(if mode % 10 == 7 { "<f8" } else { ">i2" })).unwrap();
            vlen::decode_arrays(chunk, n, &item, LIMIT)
        }
        m => {
            let dtype = if m == 5 { "|O" } else { "<U5" };
            let config = json!({"id": "categorize", "labels": ["red", "green", "blue"], "dtype": dtype, "astype": "|u1"});
            Categorize::from_config(&config).unwrap().decode(chunk, n, LIMIT)
        }
    };
    if let Ok(el) = result {
        let item = match &el {
            zarrgate::dtype::elements::Elements::Fixed(_) => Some(20),
            _ => None,
        };
        assert_count(&el, n as u64, item, "varlen");
        let _ = el.heap_size();
    }
});
