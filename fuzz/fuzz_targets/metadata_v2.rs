//! A v2 `.zarray` (and the same document as a v1 `meta`) from arbitrary bytes; when it parses,
//! one arbitrary chunk (the bytes after the first NUL) is decoded with its chain.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zarrgate_fuzz::{exercise_meta, split_doc};

fuzz_target!(|data: &[u8]| {
    let (doc, chunk) = split_doc(data);
    let Ok(doc) = serde_json::from_slice::<serde_json::Value>(doc) else {
        return;
    };
    if let Ok(meta) = zarrgate::zarr::parse_v2(&doc, doc.get(".zattrs")) {
        exercise_meta(&meta, chunk);
    }
    if let Ok(meta) = zarrgate::zarr::parse_v1(&doc, doc.get("attrs")) {
        exercise_meta(&meta, chunk);
    }
});
