//! A shard from arbitrary bytes through `ShardingCodec::decode_index` (as `read_shard` reads the
//! index of a stored shard, then each inner chunk's range) and `decode_shard` (nested sharding).
//!
//! Byte 0 is the mode: bits 0-1 pick the configuration (see `shard_cases`), bit 2 asks the
//! harness to rewrite the index checksum so that mutations reach the entries and inner chunks.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zarrgate::codec::sharding::IndexLocation;
use zarrgate_fuzz::{LIMIT, assert_count, elements, shard_cases, zero_fill};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, shard)) = data.split_first() else { return };
    let case = &shard_cases()[(mode & 3) as usize];
    let mut shard = shard.to_vec();
    let n = elements(&case.codec.inner_grid(&case.shape)).unwrap();
    let len = shard.len() as u64;
    if mode & 4 != 0 && case.crc {
        if let Some(r) = case.codec.index_range(n, len) {
            let (s, e) = (r.start as usize, r.end as usize);
            let crc = crc32c::crc32c(&shard[s..e - 4]);
            shard[e - 4..e].copy_from_slice(&crc.to_le_bytes());
        }
    }
    let fill = zero_fill(case.item);

    // The ranged path: the index alone, then each inner chunk by its range.
    if let Some(r) = case.codec.index_range(n, len) {
        assert!(r.end <= len);
        match case.codec.index_location {
            IndexLocation::Start => assert_eq!(r.start, 0),
            IndexLocation::End => assert_eq!(r.end, len),
        }
        if let Ok(index) = case.codec.decode_index(&shard[r.start as usize..r.end as usize], n) {
            assert_eq!(index.len() as u64, n);
            for i in 0..index.len() {
                match index.range(i, Some(len)) {
                    Ok(Some(cr)) => {
                        assert!(cr.start <= cr.end && cr.end <= len, "entry {i}: {cr:?} of {len}");
                        let inner = elements(&case.codec.inner_shape).unwrap();
                        if let Ok(el) = case.codec.inner.decode(
                            &shard[cr.start as usize..cr.end as usize],
                            &case.codec.inner_shape,
                            &fill,
                            LIMIT,
                        ) {
                            assert_count(&el, inner, Some(case.item), "inner chunk");
                        }
                    }
                    Ok(None) | Err(_) => {}
                }
            }
        }
    }
    // The in-memory path.
    if let Ok(el) = case.codec.decode_shard(&shard, &case.shape, &fill, LIMIT) {
        assert_count(&el, elements(&case.shape).unwrap(), Some(case.item), "shard");
    }
});
