//! Buffers of decoded chunks that leave a full chunk cache are reused for the chunks decoded
//! next, and what is read through them is still every value. Its own test binary: the pool of
//! spare buffers is process-wide, and other tests decoding at the same time would take from it.

#[path = "integration/common/mod.rs"]
mod common;

use std::sync::atomic::Ordering;

use common::*;
use serde_json::json;
use zarrgate::buffers::DECODED;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_leaving_a_full_cache_lend_their_buffers_to_the_next() {
    // 1024 x 1024 float32 in 128 x 128 chunks of 64 KiB (the pool's smallest), zstd frames
    // that state their size; values i * 1024 + j.
    let (n, c) = (1024u64, 128u64);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("a");
    write_v3_array(
        &root,
        &[n, n],
        &[c, c],
        "float32",
        json!(0.0),
        json!([{"name": "bytes", "configuration": {"endian": "little"}},
               {"name": "zstd", "configuration": {"level": 1, "checksum": false}}]),
    );
    for ci in 0..n / c {
        for cj in 0..n / c {
            let mut block = Vec::with_capacity((c * c * 4) as usize);
            for i in ci * c..(ci + 1) * c {
                for j in cj * c..(cj + 1) * c {
                    block.extend(((i * n + j) as f32).to_le_bytes());
                }
            }
            let p = root.join(format!("c/{ci}"));
            std::fs::create_dir_all(&p).unwrap();
            std::fs::write(p.join(cj.to_string()), zstd::bulk::compress(&block, 1).unwrap()).unwrap();
        }
    }
    let mut config = config_with(&[("m", dir.path())]);
    config.cache.chunk_bytes = 1 << 20; // 14 of the 64 chunks cached, 2 spare buffers
    let state = zarrgate::AppState::from_config(config).unwrap();
    let app = zarrgate::app(state.clone());
    for pass in 0..3 {
        for ci in 0..n / c {
            let uri = format!("/api/v1/slice/m/a?select={}:{},:&format=bin", ci * c, (ci + 1) * c);
            let r = get(&app, &uri, &[]).await;
            assert_eq!(r.status, 200, "{uri}: {:?}", r.body);
            assert_eq!(r.body.len() as u64, c * n * 4);
            for (k, v) in r.body.chunks_exact(4).enumerate() {
                let (i, j) = (ci * c + k as u64 / n, k as u64 % n);
                assert_eq!(
                    f32::from_le_bytes(v.try_into().unwrap()),
                    (i * n + j) as f32,
                    "pass {pass}, ({i}, {j})"
                );
            }
            // Evictions are applied in moka's housekeeping; run it, as later requests would.
            state.caches.chunks.run_pending_tasks().await;
            assert!(
                DECODED.kept_bytes() <= 128 << 10,
                "the pool holds an eighth of the budget at most"
            );
        }
    }
    let decodes = state.caches.decodes.load(Ordering::Relaxed);
    assert!(
        decodes > (n / c) * (n / c) && decodes <= 3 * (n / c) * (n / c),
        "chunks evicted and decoded again: {decodes}"
    );
    assert!(state.caches.chunk_counters.evictions.load(Ordering::Relaxed) > 0);
    let reuses = DECODED.reuses();
    assert!(reuses > 0, "no decoded chunk buffer was reused");
    let metrics = get(&app, "/metrics", &[]).await;
    let text = String::from_utf8(metrics.body.to_vec()).unwrap();
    assert!(
        text.contains(&format!(
            "zarrgate_spare_buffer_reuses_total{{pool=\"decoded\"}} {reuses}"
        )),
        "{text}"
    );
}
