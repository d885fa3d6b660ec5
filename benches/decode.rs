//! Decode + assemble of a 64 MiB float32 region (a whole 4096x4096 array) through zarrgate's
//! library API, for zstd, blosc and gzip arrays, sharded and not, next to a plain memcpy of the
//! same size (the ceiling; once into a mapped buffer, once into a fresh allocation) and an
//! uncompressed array (fetch + assemble with no codec).
//!
//! The `floor_1thread_64MiB/*` benches decompress the same chunk files, already in memory, on one thread with
//! the codec crates zarrgate links (no store, no tokio, no assembly): the single-core codec cost
//! that `read_region` (two cores here) spreads over its blocking pool; for blosc, both c-blosc
//! as linked and zarrgate's blosc codec (which decodes byte-shuffled lz4 and zstd buffers itself).
//!
//! The arrays are made by `bench/make_datasets.py` (group `small`, plus `raw`) into
//! `${ZARRGATE_BENCH_DATA:-${ZARRGATE_CACHE:-~/.cache/zarrgate}/bench-data}`; without them the
//! bench prints how to make them and does nothing.
//!
//!     CARGO_TARGET_DIR=/work/target-bench cargo bench --bench decode

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput};
use zarrgate::array::{ReadContext, Selection, read_region};
use zarrgate::store::{Store, StoreKey, open_local};
use zarrgate::zarr::ArrayMeta;

const REGION_BYTES: u64 = 64 << 20;

fn data_dir() -> PathBuf {
    if let Ok(d) = std::env::var("ZARRGATE_BENCH_DATA") {
        return PathBuf::from(d);
    }
    let cache = std::env::var("ZARRGATE_CACHE").map(PathBuf::from).unwrap_or_else(|_| {
        PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| ".".into())).join(".cache/zarrgate")
    });
    cache.join("bench-data")
}

struct Case {
    name: &'static str,
    store: Store,
    key: StoreKey,
    meta: Arc<ArrayMeta>,
}

fn open(rt: &tokio::runtime::Runtime, dir: &Path, name: &'static str) -> Case {
    let store = Store::new(open_local(dir).expect("open data dir"));
    let key = StoreKey::new(name).unwrap();
    let meta = rt
        .block_on(zarrgate::zarr::open_array(&store, &key))
        .unwrap_or_else(|e| panic!("open {name}: {e}"));
    assert_eq!(meta.shape, [4096, 4096], "{name}");
    Case {
        name,
        store,
        key,
        meta: Arc::new(meta),
    }
}

/// All chunk files of an unsharded 8x8-chunk array, read into memory.
fn chunk_files(dir: &Path, array: &str) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for i in 0..8 {
        for j in 0..8 {
            out.push(std::fs::read(dir.join(array).join(format!("c/{i}/{j}"))).expect("chunk file"));
        }
    }
    out
}

fn main() {
    let root = data_dir();
    let (small, raw) = (root.join("small"), root.join("raw"));
    if !small.join(".stamp").exists() || !raw.join(".stamp").exists() {
        eprintln!(
            "decode bench skipped: no bench data under {} (make it with \
             `venv=$(scripts/python-env.sh bench bench/requirements.txt) && \
             $venv/bin/python bench/make_datasets.py --only small,raw`)",
            root.display()
        );
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(6))
        .configure_from_args();

    let mut cases: Vec<Case> = ["zstd", "zstd_sharded", "blosc", "blosc_sharded", "gzip", "gzip_sharded"]
        .into_iter()
        .map(|n| {
            let name: &'static str = Box::leak(format!("{n}.zarr").into_boxed_str());
            open(&rt, &small, name)
        })
        .collect();
    cases.push(open(&rt, &raw, "c1m.zarr"));

    let mut g = c.benchmark_group("region_64MiB");
    g.throughput(Throughput::Bytes(REGION_BYTES));

    // The ceiling: one copy into a buffer that is already mapped...
    g.bench_function("memcpy", |b| {
        let src = vec![1u8; REGION_BYTES as usize];
        let mut dst = vec![0u8; REGION_BYTES as usize];
        b.iter(|| {
            dst.copy_from_slice(black_box(&src));
            black_box(&mut dst);
        })
    });
    // ...and into a fresh allocation, as a new result buffer is (page faults included).
    g.bench_function("memcpy_fresh_alloc", |b| {
        let src = vec![1u8; REGION_BYTES as usize];
        b.iter(|| {
            let mut dst = Vec::with_capacity(REGION_BYTES as usize);
            dst.extend_from_slice(black_box(&src));
            black_box(dst);
        })
    });

    for case in &cases {
        let sel = Selection::all(&case.meta.shape);
        let label = match case.name {
            "c1m.zarr" => "uncompressed".to_string(),
            n => n.trim_end_matches(".zarr").to_string(),
        };
        let ctx = ReadContext::uncached(case.store.clone());
        // (Setup inside the closure runs only when the filter selects this bench.)
        g.bench_function(label, |b| {
            // Check once that the read is complete and the right size.
            let got = rt
                .block_on(read_region(&ctx, &case.key, case.meta.clone(), &sel))
                .expect("read");
            assert_eq!(got.heap_size() as u64, REGION_BYTES, "{}", case.name);
            drop(got);
            b.iter(|| {
                let out = rt
                    .block_on(read_region(&ctx, &case.key, case.meta.clone(), &sel))
                    .expect("read");
                black_box(out);
            })
        });
    }
    g.finish();

    // Codec floors: one thread, bytes already in memory, output buffer reused.
    let mut g = c.benchmark_group("floor_1thread_64MiB");
    g.throughput(Throughput::Bytes(REGION_BYTES));
    let mut out = vec![0u8; 1 << 20];
    g.bench_function("zstd", |b| {
        let zstd_files = chunk_files(&small, "zstd.zarr");
        let mut d = zstd::bulk::Decompressor::new().unwrap();
        b.iter(|| {
            for f in &zstd_files {
                let n = d.decompress_to_buffer(f, &mut out).unwrap();
                assert_eq!(n, 1 << 20);
            }
            black_box(&out);
        })
    });
    // blosc (lz4, byte shuffle, 4-byte items): c-blosc as linked (its SSE2 unshuffle), and
    // zarrgate's codec, which decodes such buffers itself (an AVX2 unshuffle where the CPU has
    // it). Each decoded buffer goes back to the pool, as an evicted chunk's does.
    let blosc_files = chunk_files(&small, "blosc.zarr");
    g.bench_function("blosc_c", |b| {
        b.iter(|| {
            for f in &blosc_files {
                // The v3 chunk is the blosc buffer: the array's only bytes->bytes codec.
                let n = unsafe {
                    blosc_src::blosc_decompress_ctx(f.as_ptr().cast(), out.as_mut_ptr().cast(), out.len(), 1)
                };
                assert_eq!(n, 1 << 20);
            }
            black_box(&out);
        })
    });
    g.bench_function("blosc_codec", |b| {
        use zarrgate::codec::BytesToBytes;
        let codec = zarrgate::codec::blosc::Blosc::from_v3(None).unwrap();
        zarrgate::buffers::DECODED.set_max_total(16 << 20);
        b.iter(|| {
            for f in &blosc_files {
                let decoded = codec.decode(f, 1 << 20).unwrap();
                assert_eq!(decoded.len(), 1 << 20);
                zarrgate::buffers::DECODED.give(black_box(decoded));
            }
        })
    });
    g.bench_function("gzip", |b| {
        let gzip_files = chunk_files(&small, "gzip.zarr");
        b.iter(|| {
            for f in &gzip_files {
                let mut dec = flate2::read::GzDecoder::new(&f[..]);
                std::io::Read::read_exact(&mut dec, &mut out).unwrap();
            }
            black_box(&out);
        })
    });
    g.finish();
    c.final_summary();
}
