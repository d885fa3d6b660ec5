//! A v3 `zarr.json` from arbitrary bytes; when it parses, one arbitrary chunk (the bytes after
//! the first NUL) is decoded with its chain (sharded: its index is read too).
#![no_main]

use libfuzzer_sys::fuzz_target;
use zarrgate_fuzz::{exercise_meta, split_doc};

fuzz_target!(|data: &[u8]| {
    let (doc, chunk) = split_doc(data);
    let Ok(doc) = serde_json::from_slice::<serde_json::Value>(doc) else {
        return;
    };
    if let Ok(meta) = zarrgate::zarr::parse_v3(&doc) {
        exercise_meta(&meta, chunk);
    }
});
