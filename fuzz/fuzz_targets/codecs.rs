//! Every decompressor and filter: the first byte picks a codec from `codecs.json` (the v2
//! compressors, the v3 bytes->bytes codecs and the numcodecs filters through
//! `CodecChain::from_v2`); the rest is decoded with a 1 MiB limit, which the output may not
//! exceed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zarrgate_fuzz::{LIMIT, TableCodec, assert_count, codec_table};

fuzz_target!(|data: &[u8]| {
    let Some((&pick, input)) = data.split_first() else { return };
    let table = codec_table();
    let (label, codec) = &table[pick as usize % table.len()];
    match codec {
        TableCodec::Bytes(c) => {
            if let Ok(out) = c.decode(input, LIMIT) {
                assert!(out.len() <= LIMIT, "{label}: {} bytes out, limit {LIMIT}", out.len());
            }
            // A tight limit must be honoured too.
            let small = input.len() / 2;
            if let Ok(out) = c.decode(input, small) {
                assert!(out.len() <= small, "{label}: {} bytes out, limit {small}", out.len());
            }
        }
        TableCodec::Filter(chain, stored) => {
            for stage in &chain.bytes_to_bytes {
                if let Ok(out) = stage.decode(input, LIMIT) {
                    assert!(out.len() <= LIMIT, "{label}: {} bytes out, limit {LIMIT}", out.len());
                }
            }
            // The whole chain on 1-d chunks of the element counts the input could hold
            // (elements of 1, 2, 4 or 8 bytes as stored; packbits: 8 per byte).
            let len = input.len() as u64;
            for shape in [len, len / 2, len / 4, len / 8, len * 8].map(|n| vec![n]) {
                let fill = zarrgate::dtype::fill::FillValue::parse(&serde_json::Value::Null, stored, 2)
                    .map(|f| f.for_decoded(&chain.dtype));
                let Ok(fill) = fill else { continue };
                if let Ok(el) = chain.decode(input, &shape, &fill, LIMIT) {
                    assert_count(&el, shape[0], chain.dtype.item_size(), label);
                }
            }
        }
    }
});
