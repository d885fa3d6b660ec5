//! Hardening: access control on every route family, limits (414, 413 on chunk counts, 503 with
//! Retry-After under overload, 504 on timeouts), and stored data that is corrupt or lies.

use std::time::Duration;

use crate::common::*;
use serde_json::json;
use tower::ServiceExt;
use zarrgate::config::{Config, MountConfig};
use zarrgate::state::Mount;
use zarrgate::store::{Backend, ByteRange, GetObject, Listing, ObjectMeta, Store, StoreError, StoreKey, open_local};

#[tokio::test]
async fn protected_mounts_need_their_token_everywhere() {
    // SAFETY: these variables are unique to this test and set before anything reads them; std
    // serialises its own reads and writes of the environment (clouds.rs sets others), and no C
    // code of the tests reads it meanwhile.
    unsafe {
        // Ending with a newline, as a secret read from a file does: no header can carry it.
        std::env::set_var("ZG_TEST_MOUNT_TOKEN", "s3cr3t-token\n");
        std::env::set_var("ZG_TEST_METRICS_TOKEN", "metrics-token\n");
    }
    let mut config = config_with(&[("secret", &fixtures()), ("open", &fixtures())]);
    config.mounts.get_mut("secret").unwrap().tokens = vec!["env:ZG_TEST_MOUNT_TOKEN".into()];
    config.server.metrics_token = Some("env:ZG_TEST_METRICS_TOKEN".into());
    config.validate().unwrap();
    let app = zarrgate::app(zarrgate::AppState::from_config(config.clone()).unwrap());
    let good = ("authorization", "Bearer s3cr3t-token");
    let uris = [
        "/zarr/secret/v3/zstd_i4/zarr.json",
        "/api/v1/slice/secret/v3/zstd_i4",
        "/api/v1/zom/secret/v3/group_nested",
        "/api/v1/list/secret/v3",
    ];
    for uri in uris {
        for bad in [
            None,
            Some("Bearer wrong"),
            Some("Bearer s3cr3t-toke"),
            Some("Basic czNjcjN0LXRva2Vu"),
        ] {
            let headers: Vec<(&str, &str)> = bad.map(|b| ("authorization", b)).into_iter().collect();
            let r = get(&app, uri, &headers).await;
            assert_eq!(r.status, 401, "{uri} {bad:?}");
            // RFC 6750: a bearer token presented and refused is an `invalid_token`; a request
            // with none is told only the scheme.
            if bad.is_some_and(|b| b.starts_with("Bearer")) {
                assert_eq!(
                    r.header("www-authenticate"),
                    Some("Bearer error=\"invalid_token\", error_description=\"the token is not one of this mount's\""),
                );
                assert_eq!(r.error_code(), "invalid_token");
            } else {
                assert_eq!(r.header("www-authenticate"), Some("Bearer"));
                assert_eq!(r.error_code(), "unauthorized");
            }
            assert!(!String::from_utf8_lossy(&r.body).contains("s3cr3t"));
        }
        assert_eq!(get(&app, uri, &[good]).await.status, 200, "{uri}");
        assert_eq!(
            get(&app, uri, &[("authorization", "bearer s3cr3t-token")]).await.status,
            200,
            "{uri}"
        );
        assert_eq!(
            get(&app, &uri.replace("/secret/", "/open/"), &[]).await.status,
            200,
            "{uri}"
        );
    }
    // The front's own answers to HEAD: the head of the GET's, no body.
    for uri in [uris[0], "/metrics"] {
        let (got, head) = (get(&app, uri, &[]).await, request(&app, "HEAD", uri, &[]).await);
        assert_eq!((got.status.as_u16(), head.status.as_u16()), (401, 401), "{uri}");
        assert!(head.body.is_empty() && !got.body.is_empty(), "{uri}");
        assert_eq!(
            head.header("content-length"),
            Some(got.body.len().to_string().as_str()),
            "{uri}"
        );
    }
    let want = std::fs::read(fixtures().join("v3/zstd_i4/zarr.json")).unwrap();
    assert_eq!(&get(&app, uris[0], &[good]).await.body[..], &want[..]);
    let validate = axum::http::Request::post("/api/v1/validate/secret/v3/group_nested")
        .body(axum::body::Body::from("{}"))
        .unwrap();
    assert_eq!(send(&app, validate).await.status, 401);
    // Every spelling of the protected mount's name is it (the mount segment is percent-decoded
    // once, here as in the handlers), and so are other spellings of the routes.
    for uri in uris {
        for spelled in [
            uri.replace("/secret/", "/%73ecret/"),
            uri.replace("/secret/", "/secre%74/"),
        ] {
            let r = get(&app, &spelled, &[]).await;
            assert_eq!(r.status, 401, "{spelled}");
            assert_eq!(get(&app, &spelled, &[good]).await.status, 200, "{spelled}");
        }
    }
    for uri in ["/%6Detrics", "/metrics/", "/%7Aarr/secret/v3/zstd_i4/zarr.json"] {
        let r = get(&app, uri, &[]).await;
        assert!(matches!(r.status.as_u16(), 401 | 404), "{uri}: {}", r.status);
        assert!(!String::from_utf8_lossy(&r.body).contains("zarr_format"), "{uri}");
    }
    // Preflights work without a token.
    let r = request(
        &app,
        "OPTIONS",
        uris[0],
        &[
            ("origin", "http://viewer.example"),
            ("access-control-request-method", "GET"),
            ("access-control-request-headers", "authorization, range"),
        ],
    )
    .await;
    assert!(r.status.is_success(), "{}", r.status);
    assert!(
        r.header("access-control-allow-headers")
            .unwrap()
            .to_ascii_lowercase()
            .contains("authorization")
    );
    // Protected mounts are hidden from anonymous callers.
    let names = |r: Reply| -> Vec<String> {
        r.json()["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(names(get(&app, "/api/v1/mounts", &[]).await), ["open"]);
    assert_eq!(names(get(&app, "/api/v1/mounts", &[good]).await), ["open", "secret"]);
    // Mount URLs (absolute local paths here) are shown only to callers that presented the
    // mount's token, or to all with `server.show_mount_urls`.
    let listed = get(&app, "/api/v1/mounts", &[good]).await.json();
    assert_eq!(
        listed["mounts"][0],
        json!({"name": "open", "kind": "local", "consolidated": true})
    );
    assert_eq!(listed["mounts"][1]["url"], json!(fixtures().display().to_string()));
    let mut shown = config.clone();
    shown.server.show_mount_urls = true;
    let shown = zarrgate::app(zarrgate::AppState::from_config(shown).unwrap());
    let listed = get(&shown, "/api/v1/mounts", &[]).await.json();
    assert_eq!(listed["mounts"][0]["url"], json!(fixtures().display().to_string()));
    // Unknown query parameters are refused here as on every /api/v1/ route.
    let r = get(&app, "/api/v1/mounts?x=1", &[]).await;
    assert_eq!((r.status.as_u16(), r.error_code().as_str()), (400, "bad_request"));
    // /metrics has its own token.
    assert_eq!(get(&app, "/metrics", &[]).await.status, 401);
    assert_eq!(get(&app, "/metrics", &[good]).await.status, 401);
    assert_eq!(
        get(&app, "/metrics", &[("authorization", "Bearer metrics-token")])
            .await
            .status,
        200
    );
    // A token variable that is not set stops start-up, naming the mount and the variable.
    config.mounts.get_mut("open").unwrap().tokens = vec!["env:ZG_TEST_UNSET_TOKEN".into()];
    let err = config.validate().unwrap_err().to_string();
    assert!(
        err.contains("mount 'open'") && err.contains("ZG_TEST_UNSET_TOKEN"),
        "{err}"
    );
    config.mounts.get_mut("open").unwrap().tokens = vec!["plain-text-token".into()];
    assert!(config.validate().unwrap_err().to_string().contains("env:"));
}

#[tokio::test]
async fn long_urls_and_wide_slices_are_refused() {
    let mut config = config_with(&[("fx", &fixtures())]);
    config.limits.max_url_bytes = 200;
    config.limits.max_chunks_per_slice = 3;
    let app = zarrgate::app(zarrgate::AppState::from_config(config).unwrap());
    let long = format!("/api/v1/slice/fx/v2/compressor_zstd_i4?select={}", "0:1,".repeat(60));
    let r = get(&app, &long, &[]).await;
    assert_eq!((r.status.as_u16(), r.error_code().as_str()), (414, "uri_too_long"));
    // compressor_zstd_i4 is 5x6 in 2x4 chunks: 6 chunks in all.
    let r = get(&app, "/api/v1/slice/fx/v2/compressor_zstd_i4", &[]).await;
    assert_eq!((r.status.as_u16(), r.error_code().as_str()), (413, "too_large"));
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("touches 6 chunks")
    );
    assert_eq!(
        get(&app, "/api/v1/slice/fx/v2/compressor_zstd_i4?select=0:2", &[])
            .await
            .status,
        200
    );
    // Inner chunks count too: sharding_empty_inner_chunks_i4 is one 6x12 shard of 2x3 inner
    // chunks, 12 of them under its 6x10 shape.
    let r = get(&app, "/api/v1/slice/fx/v3/sharding_empty_inner_chunks_i4", &[]).await;
    assert_eq!((r.status.as_u16(), r.error_code().as_str()), (413, "too_large"));
    let message = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(message.contains("touches 12 inner chunks"), "{message}");
    let r = get(
        &app,
        "/api/v1/slice/fx/v3/sharding_empty_inner_chunks_i4?select=0:2,0:9",
        &[],
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["shape"], serde_json::json!([2, 9]));
}

/// A store that takes its time, to hold requests open: for every key, or (`chunks_only`) for
/// all but metadata documents.
#[derive(Debug)]
struct SlowStore {
    inner: Store,
    delay: Duration,
    chunks_only: bool,
}

impl SlowStore {
    async fn wait(&self, key: &StoreKey) {
        let name = key.as_str().rsplit('/').next().unwrap_or("");
        let document = matches!(name, "zarr.json" | ".zarray" | ".zgroup" | ".zattrs" | ".zmetadata");
        if !(self.chunks_only && document) {
            tokio::time::sleep(self.delay).await;
        }
    }
}

#[async_trait::async_trait]
impl Backend for SlowStore {
    async fn head(&self, key: &StoreKey) -> Result<Option<ObjectMeta>, StoreError> {
        self.wait(key).await;
        self.inner.head(key).await
    }
    async fn get(&self, key: &StoreKey, range: Option<ByteRange>) -> Result<Option<GetObject>, StoreError> {
        self.wait(key).await;
        self.inner.get(key, range).await
    }
    async fn list(&self, prefix: &StoreKey) -> Result<Listing, StoreError> {
        self.inner.list(prefix).await
    }
}

fn slow_app(delay: Duration, config: Config) -> zarrgate::App {
    slow_store_app(delay, false, config)
}

fn slow_store_app(delay: Duration, chunks_only: bool, config: Config) -> zarrgate::App {
    let mount = Mount::new(
        "slow",
        "local",
        "slow".into(),
        Store::new(SlowStore {
            inner: Store::new(open_local(&fixtures()).unwrap()),
            delay,
            chunks_only,
        }),
    );
    zarrgate::app(zarrgate::AppState::with_mounts(config, vec![mount]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_is_503_with_retry_after_and_slowness_is_504() {
    let mut config = Config::default();
    config.limits.max_concurrent_requests = 1;
    let app = slow_app(Duration::from_millis(600), config);
    let uri = "/zarr/slow/v3/zstd_i4/zarr.json";
    let (a, b) = tokio::join!(get(&app, uri, &[]), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        get(&app, uri, &[]).await
    });
    assert_eq!(a.status, 200);
    assert_eq!((b.status.as_u16(), b.error_code().as_str()), (503, "overloaded"));
    assert_eq!(b.header("retry-after"), Some("1"));
    assert_eq!(get(&app, uri, &[]).await.status, 200, "capacity comes back");

    // The limit is the server's, not each route's: a slow raw read holds the one place, so a
    // slice (another route) is refused too, while liveness and metrics still answer.
    let (a, others) = tokio::join!(get(&app, uri, &[]), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        (
            get(&app, "/api/v1/slice/slow/v3/zstd_i4?select=0", &[]).await,
            get(&app, "/zarr/slow/v2/compressor_blosc_zstd_shuffle0_i4/.zarray", &[]).await,
            get(&app, "/api/v1/mounts", &[]).await,
            get(&app, "/healthz", &[]).await,
            get(&app, "/metrics", &[]).await,
        )
    });
    assert_eq!(a.status, 200);
    let (slice, raw, mounts, health, metrics) = others;
    for (what, r) in [("slice", &slice), ("raw", &raw), ("mounts", &mounts)] {
        assert_eq!(
            (r.status.as_u16(), r.error_code().as_str()),
            (503, "overloaded"),
            "{what}"
        );
    }
    assert_eq!(health.status, 200);
    assert_eq!(metrics.status, 200);
    assert!(String::from_utf8_lossy(&metrics.body).contains("zarrgate_requests_total"));

    let mut config = Config::default();
    // The message names the timeout as configured, not as a Duration rounds it.
    config.limits.request_timeout_s = 0.2000000000001;
    let app = slow_app(Duration::from_secs(2), config);
    let start = std::time::Instant::now();
    let r = get(&app, uri, &[]).await;
    assert_eq!((r.status.as_u16(), r.error_code().as_str()), (504, "timeout"));
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("0.2000000000001 s"),
        "{:?}",
        r.body
    );
    assert!(start.elapsed() < Duration::from_secs(1));
    // HEAD gets the same head with no body, as the router's answers do: over HTTP/2 hyper
    // sent the body, and clients refused the stream.
    let head = request(&app, "HEAD", uri, &[]).await;
    assert_eq!(head.status, 504);
    assert!(head.body.is_empty());
    assert_eq!(head.header("content-length"), Some(r.body.len().to_string().as_str()));
}

/// Loads that take longer than the request timeout (a chunk; a shard's index, then its inner
/// chunk): each request answers 504, but what it started goes on and is cached, so each one
/// gets further than the one before, and the slice answers once its loads are done. Before,
/// every request timed out and threw its loads away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loads_slower_than_the_request_timeout_are_cached_for_the_next_request() {
    let fast = fixture_app();
    for (slice, timeouts) in [
        ("v3/zstd_i4?select=0:2,0:4&format=json", 1),
        ("v3/sharding_end_i4?select=0:2,0:3&format=json", 2),
    ] {
        let mut config = Config::default();
        config.limits.request_timeout_s = 0.3;
        let app = slow_store_app(Duration::from_millis(400), true, config);
        let uri = format!("/api/v1/slice/slow/{slice}");
        for _ in 0..timeouts {
            let r = get(&app, &uri, &[]).await;
            assert_eq!(
                (r.status.as_u16(), r.error_code().as_str()),
                (504, "timeout"),
                "{slice}"
            );
            tokio::time::sleep(Duration::from_millis(600)).await;
        }
        let r = get(&app, &uri, &[]).await;
        assert_eq!(r.status, 200, "{slice}: {:?}", r.json());
        let expected = get(&fast, &format!("/api/v1/slice/fx/{slice}"), &[]).await;
        assert_eq!(expected.status, 200);
        assert_eq!(r.json()["data"], expected.json()["data"], "{slice}");
        assert_eq!(
            sample(&app, "zarrgate_cache_hits_total{cache=\"chunks\"}").await,
            1.0,
            "{slice}"
        );
        // Process-wide: loads of other tests of this binary may run on for a moment.
        let mut detached = f64::NAN;
        for _ in 0..100 {
            detached = sample(&app, "zarrgate_orphaned_loads").await;
            if detached == 0.0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(detached, 0.0, "{slice}");
    }
}

fn copy_case(dir: &std::path::Path, case: &str) -> std::path::PathBuf {
    let dst = dir.join(case);
    copy_dir(&fixtures().join(case), &dst);
    dst
}

#[tokio::test]
async fn corrupt_stored_data_is_a_named_error_never_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    // A truncated zstd chunk; flipped bits in a zstd frame with a checksum (without one, zstd
    // cannot tell); a wrong crc32c; a truncated shard.
    let zstd = copy_case(dir.path(), "v3/zstd_i4");
    let b = std::fs::read(zstd.join("c/0/0")).unwrap();
    std::fs::write(zstd.join("c/0/0"), &b[..b.len() - 3]).unwrap();
    let summed = copy_case(dir.path(), "v3/zstd_checksum_f8");
    let first = std::fs::read_dir(summed.join("c"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let first = if first.is_dir() { first.join("0") } else { first };
    let rel = first.strip_prefix(dir.path()).unwrap().to_string_lossy().into_owned();
    let mut b = std::fs::read(&first).unwrap();
    let n = b.len();
    b[n / 2] ^= 0x10;
    std::fs::write(&first, b).unwrap();
    let crc = copy_case(dir.path(), "v3/crc32c_i4");
    let mut b = std::fs::read(crc.join("c/0/0")).unwrap();
    b[0] ^= 1;
    std::fs::write(crc.join("c/0/0"), b).unwrap();
    let shard = copy_case(dir.path(), "v3/sharding_end_i4");
    let b = std::fs::read(shard.join("c/0/0")).unwrap();
    std::fs::write(shard.join("c/0/0"), &b[..b.len() / 3]).unwrap();
    // Shards of no bytes at all, their index at the end and at the start.
    for case in ["v3/sharding_end_i4", "v3/sharding_start_i4"] {
        let empty = copy_case(&dir.path().join("empty"), case);
        std::fs::write(empty.join("c/0/0"), b"").unwrap();
    }
    // A decompression bomb: a 4-element int32 array whose chunk inflates to 64 MiB.
    let bytes_gzip = json!([{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "gzip", "configuration": {"level": 9}}]);
    write_v3_array(&dir.path().join("bomb"), &[4], &[4], "int32", json!(0), bytes_gzip);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    std::io::Write::write_all(&mut gz, &vec![0u8; 64 << 20]).unwrap();
    std::fs::create_dir_all(dir.path().join("bomb/c")).unwrap();
    std::fs::write(dir.path().join("bomb/c/0"), gz.finish().unwrap()).unwrap();
    // Metadata that lies: says chunks of 8 where 4 elements are stored.
    let raw = json!([{"name": "bytes", "configuration": {"endian": "little"}}]);
    write_v3_array(&dir.path().join("liar"), &[8], &[8], "int32", json!(0), raw);
    std::fs::create_dir_all(dir.path().join("liar/c")).unwrap();
    std::fs::write(dir.path().join("liar/c/0"), [0u8; 16]).unwrap();

    // A shard index entry of no bytes (no inner chunk encodes to nothing).
    let sharded = json!([{"name": "sharding_indexed", "configuration": {
        "chunk_shape": [2],
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
        "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
        "index_location": "end"}}]);
    write_v3_array(&dir.path().join("zero"), &[4], &[4], "int32", json!(0), sharded);
    std::fs::create_dir_all(dir.path().join("zero/c")).unwrap();
    let mut shard: Vec<u8> = [1i32, 2].iter().flat_map(|v| v.to_le_bytes()).collect();
    for entry in [0u64, 8, 8, 0] {
        shard.extend_from_slice(&entry.to_le_bytes());
    }
    std::fs::write(dir.path().join("zero/c/0"), shard).unwrap();

    let app = app_for(&[("t", dir.path()), ("fx", &fixtures())]);
    for (path, key) in [
        ("zero", "zero/c/0"),
        ("v3/zstd_i4", "v3/zstd_i4/c/0/0"),
        ("v3/zstd_checksum_f8", rel.as_str()),
        ("v3/crc32c_i4", "v3/crc32c_i4/c/0/0"),
        ("v3/sharding_end_i4", "v3/sharding_end_i4/c/0/0"),
        ("empty/v3/sharding_end_i4", "empty/v3/sharding_end_i4/c/0/0"),
        ("empty/v3/sharding_start_i4", "empty/v3/sharding_start_i4/c/0/0"),
        ("bomb", "bomb/c/0"),
        ("liar", "liar/c/0"),
    ] {
        let start = std::time::Instant::now();
        let r = get(&app, &format!("/api/v1/slice/t/{path}"), &[]).await;
        assert_eq!(
            (r.status.as_u16(), r.error_code().as_str()),
            (500, "corrupt_data"),
            "{path}: {:?}",
            r.body
        );
        let message = r.json()["error"]["message"].as_str().unwrap().to_owned();
        assert!(message.contains(key), "{path}: {message}");
        assert!(
            !message.contains(&dir.path().display().to_string()),
            "no file system paths leak"
        );
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{path} took {:?}",
            start.elapsed()
        );
        // Not cached: asking again gives the same error, and other data is unaffected.
        assert_eq!(get(&app, &format!("/api/v1/slice/t/{path}"), &[]).await.status, 500);
        assert_eq!(get(&app, "/api/v1/slice/fx/v3/zstd_i4", &[]).await.status, 200);
    }
    // Raw keys still serve the stored bytes as they are.
    assert_eq!(get(&app, "/zarr/t/bomb/c/0", &[]).await.status, 200);
}

/// Metadata that is not valid (here: a sharding codec after a transpose whose inner chunks do
/// not divide the transposed chunk) is `corrupt_data` whose message says what is wrong with the
/// document, not only that it did not decode.
#[tokio::test]
async fn invalid_metadata_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let codecs = json!([
        {"name": "transpose", "configuration": {"order": [1, 0]}},
        {"name": "sharding_indexed", "configuration": {
            "chunk_shape": [2, 3],
            "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}]}}
    ]);
    write_v3_array(&dir.path().join("t"), &[4, 6], &[4, 6], "uint16", json!(0), codecs);
    let app = app_for(&[("m", dir.path())]);
    let r = get(&app, "/api/v1/slice/m/t", &[]).await;
    assert_eq!((r.status.as_u16(), r.error_code().as_str()), (500, "corrupt_data"));
    assert_eq!(
        r.json()["error"]["message"],
        "the metadata at 't/zarr.json' is invalid: invalid codec configuration: shard shape [6, 4] \
         is not a multiple of inner chunk shape [2, 3]"
    );
}

#[test]
fn mount_config_defaults_for_limits() {
    let c = Config::default();
    assert_eq!(c.limits.max_url_bytes, 8192);
    assert!(c.limits.max_concurrent_requests >= 64);
    assert!(MountConfig::new("/", "/").tokens.is_empty());
}

/// A shard's index is read whole: metadata whose shards hold more inner chunks than an index
/// the server reads (2^27 inner chunks, a 2 GiB index) is refused before anything is read.
#[tokio::test]
async fn shards_with_vast_indexes_are_refused_before_reading() {
    let dir = tempfile::tempdir().unwrap();
    let raw = json!([{"name": "bytes", "configuration": {"endian": "little"}}]);
    let sharding = json!([{"name": "sharding_indexed", "configuration": {
        "chunk_shape": [1], "codecs": raw, "index_location": "end",
        "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}]}}]);
    write_v3_array(
        &dir.path().join("vast"),
        &[1 << 27],
        &[1 << 27],
        "uint8",
        json!(0),
        sharding,
    );
    // A shard file that would be read if the index were.
    std::fs::create_dir_all(dir.path().join("vast/c")).unwrap();
    std::fs::write(dir.path().join("vast/c/0"), [0u8; 64]).unwrap();
    let app = app_for(&[("m", dir.path())]);
    let r = get(&app, "/api/v1/slice/m/vast?select=0:4", &[]).await;
    assert_eq!(
        (r.status.as_u16(), r.error_code().as_str()),
        (422, "unsupported"),
        "{:?}",
        r.body
    );
    let message = r.json()["error"]["message"].as_str().unwrap().to_owned();
    // (Read, the 64-byte shard would have been a corrupt shard, 500.)
    assert!(message.contains("index of 2147483648 bytes"), "{message}");
}

/// A stored chunk is read only up to what its chain can decode a chunk from: a stray file of
/// 64 MiB under the key of a 40-byte chunk (or an inner chunk of a shard whose index says so)
/// is refused (413) by its size, without reading it, and the chunks beside it are served.
#[tokio::test]
async fn stray_large_files_under_chunk_keys_are_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let gzip = json!([{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "gzip", "configuration": {"level": 1}}]);
    write_v3_array(&dir.path().join("a"), &[20], &[10], "int32", json!(0), gzip);
    std::fs::create_dir_all(dir.path().join("a/c")).unwrap();
    std::fs::File::create(dir.path().join("a/c/0"))
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    for v in 10i32..20 {
        std::io::Write::write_all(&mut gz, &v.to_le_bytes()).unwrap();
    }
    std::fs::write(dir.path().join("a/c/1"), gz.finish().unwrap()).unwrap();
    // An inner chunk of 4 int32 that its index says is 32 MiB long.
    let sharded = json!([{"name": "sharding_indexed", "configuration": {
        "chunk_shape": [4],
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
        "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
        "index_location": "end"}}]);
    write_v3_array(&dir.path().join("s"), &[4], &[4], "int32", json!(0), sharded);
    std::fs::create_dir_all(dir.path().join("s/c")).unwrap();
    let shard = std::fs::File::create(dir.path().join("s/c/0")).unwrap();
    shard.set_len(32 << 20).unwrap();
    let mut index = Vec::new();
    for entry in [0u64, 32 << 20] {
        index.extend_from_slice(&entry.to_le_bytes());
    }
    std::os::unix::fs::FileExt::write_all_at(&shard, &index, 32 << 20).unwrap();

    let (app, state, _) = counting_app(dir.path(), config_with(&[]));
    let r = get(&app, "/api/v1/slice/m/a?select=10:20", &[]).await;
    assert_eq!(r.json()["data"], json!([10, 11, 12, 13, 14, 15, 16, 17, 18, 19]));
    for path in ["a?select=0:10", "s"] {
        let r = get(&app, &format!("/api/v1/slice/m/{path}"), &[]).await;
        assert_eq!(
            (r.status.as_u16(), r.error_code().as_str()),
            (413, "too_large"),
            "{path}: {}",
            String::from_utf8_lossy(&r.body)
        );
        let message = r.json()["error"]["message"].as_str().unwrap().to_owned();
        assert!(message.contains("at most 1") && message.len() < 200, "{message}");
    }
    // Nothing was decoded but the chunk that is what it says.
    assert_eq!(state.caches.decodes.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// A shard read whole (sharding behind another codec) is as large as its inner chunks' encodings
/// and its index make it, more than its decoded size: 2^20 uint8 in inner chunks of 4 are a
/// shard of 5 MiB (a 4 MiB index), read and served, not refused by the bound of other chunks.
#[tokio::test]
async fn whole_shards_larger_than_their_data_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let n = 1u64 << 20;
    let codecs = json!([
        {"name": "transpose", "configuration": {"order": [0]}},
        {"name": "sharding_indexed", "configuration": {
            "chunk_shape": [4],
            "codecs": [{"name": "bytes"}],
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
            "index_location": "end"}}]);
    write_v3_array(&dir.path().join("t"), &[n], &[n], "uint8", json!(0), codecs);
    let mut shard: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
    for i in 0..n / 4 {
        shard.extend_from_slice(&(4 * i).to_le_bytes());
        shard.extend_from_slice(&4u64.to_le_bytes());
    }
    std::fs::create_dir_all(dir.path().join("t/c")).unwrap();
    std::fs::write(dir.path().join("t/c/0"), shard).unwrap();
    let app = app_for(&[("m", dir.path())]);
    let r = get(&app, "/api/v1/slice/m/t?select=1000:1010", &[]).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let want: Vec<u64> = (1000..1010).map(|i| i % 251).collect();
    assert_eq!(r.json()["data"], json!(want));
}

/// A writer the tests' log subscriber appends to.
#[derive(Clone, Default)]
struct LogBuffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl LogBuffer {
    /// A buffer that takes the log lines `filter` passes, written on this thread while the
    /// guard lives.
    fn capture(filter: &str) -> (LogBuffer, tracing::subscriber::DefaultGuard) {
        let logs = LogBuffer::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_env_filter(filter)
            .with_writer(move || writer.clone())
            .finish();
        (logs, tracing::subscriber::set_default(subscriber))
    }
}

impl std::io::Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl LogBuffer {
    /// The access log lines written since the last call.
    fn take(&self) -> Vec<String> {
        let text = String::from_utf8(std::mem::take(&mut *self.0.lock().unwrap())).unwrap();
        text.lines()
            .filter(|l| l.contains("zarrgate::access"))
            .map(str::to_owned)
            .collect()
    }
}

/// The value of a sample of /metrics.
async fn sample(app: &zarrgate::App, name: &str) -> f64 {
    let text = String::from_utf8(get(app, "/metrics", &[]).await.body.to_vec()).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no {name} in {text}"))
        .parse()
        .unwrap()
}

/// The access log line and the body metrics are written when the body is over: with the bytes
/// actually sent, and `aborted=true` for a body given up before its end; HEAD and 304 send
/// none and are not aborted.
#[tokio::test]
async fn access_log_and_body_metrics_follow_the_body() {
    // The test's runtime runs on this thread only: every line is written under this default.
    let (logs, _default) = LogBuffer::capture("zarrgate::access=info");
    let app = fixture_app();
    let uri = "/zarr/fx/v3/zstd_i4/c/0/0";
    let len = std::fs::read(fixtures().join("v3/zstd_i4/c/0/0")).unwrap().len();
    assert!(len > 0);

    let r = get(&app, uri, &[]).await;
    assert_eq!((r.status.as_u16(), r.body.len()), (200, len));
    let etag = r.headers["etag"].to_str().unwrap().to_owned();
    let lines = logs.take();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains(&format!("bytes={len} ")), "{lines:?}");
    assert!(
        lines[0].contains("status=200") && lines[0].contains("aborted=false"),
        "{lines:?}"
    );

    // Given up unread: nothing sent, aborted; the request stays in flight until then.
    let held = app
        .clone()
        .oneshot(axum::http::Request::get(uri).body(axum::body::Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(held.status(), 200);
    // This /metrics request is in flight too.
    assert_eq!(sample(&app, "zarrgate_requests_in_flight").await, 2.0);
    drop(held);
    assert_eq!(sample(&app, "zarrgate_requests_in_flight").await, 1.0);
    let lines = logs.take();
    let raw: Vec<_> = lines.iter().filter(|l| l.contains(uri)).collect();
    assert_eq!(raw.len(), 1, "{lines:?}");
    assert!(
        raw[0].contains("bytes=0 ") && raw[0].contains("aborted=true"),
        "{raw:?}"
    );

    for (method, headers) in [("HEAD", vec![]), ("GET", vec![("if-none-match", etag.as_str())])] {
        let r = request(&app, method, uri, &headers).await;
        assert!(r.body.is_empty());
        let lines = logs.take();
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].contains("bytes=0 ") && lines[0].contains("aborted=false"),
            "{lines:?}"
        );
    }
    assert_eq!(
        sample(&app, "zarrgate_response_body_bytes_total{route=\"raw\"}").await,
        len as f64
    );
    assert_eq!(
        sample(&app, "zarrgate_responses_aborted_total{route=\"raw\"}").await,
        1.0
    );

    // A request given up before its response head (the client left while a walk went on):
    // logged as 499 and aborted, and no longer in flight.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(".zgroup"), br#"{"zarr_format": 2}"#).unwrap();
    let (slow, _, _) = slow_listing_app(dir.path(), config_with(&[]), Duration::from_secs(3600));
    let cancelled = tokio::time::timeout(Duration::from_millis(200), get(&slow, "/api/v1/zom/m", &[])).await;
    assert!(cancelled.is_err(), "the walk does not end");
    assert_eq!(sample(&slow, "zarrgate_requests_in_flight").await, 1.0);
    let lines = logs.take();
    let zom: Vec<_> = lines.iter().filter(|l| l.contains("/api/v1/zom/m")).collect();
    assert_eq!(zom.len(), 1, "{lines:?}");
    assert!(
        zom[0].contains("status=499") && zom[0].contains("aborted=true"),
        "{zom:?}"
    );
    assert_eq!(
        sample(&slow, "zarrgate_responses_aborted_total{route=\"zom\"}").await,
        1.0
    );
}

/// A file truncated while its raw key is sent: the body ends before its `Content-Length`, so
/// the client's connection is cut, and the access log and the metrics say it was aborted (they
/// said `status=200 aborted=false`).
#[tokio::test]
async fn a_body_cut_short_by_a_truncated_file_is_aborted() {
    use http_body_util::BodyExt;
    let (logs, _default) = LogBuffer::capture("zarrgate=info");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("big");
    std::fs::write(&file, vec![7u8; 16 << 20]).unwrap();
    let app = app_for(&[("m", dir.path())]);
    let response = app
        .clone()
        .oneshot(
            axum::http::Request::get("/zarr/m/big")
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-length"], (16u64 << 20).to_string().as_str());
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert!(first.len() < 16 << 20);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .set_len(first.len() as u64)
        .unwrap();
    let mut sent = first.len();
    while let Some(Ok(frame)) = body.frame().await {
        sent += frame.into_data().map_or(0, |d| d.len());
    }
    assert!(sent < 16 << 20, "{sent}");
    drop(body);
    // The record that counts it writes the log line: the count is the check. (A subscriber set
    // for this thread may miss lines while other tests of the binary set theirs: tracing caches
    // a call site's interest process-wide.)
    assert_eq!(
        sample(&app, "zarrgate_responses_aborted_total{route=\"raw\"}").await,
        1.0
    );
    let lines = logs.take();
    for line in lines
        .iter()
        .filter(|l| l.contains("/zarr/m/big") && l.contains("status="))
    {
        assert!(line.contains("aborted=true"), "{line}");
    }
}

/// A handler that panics costs its request a 500 `internal` answer, without the panic's
/// message, logged and counted as any answer is; the service goes on answering.
#[tokio::test]
async fn a_panicking_handler_is_a_500() {
    async fn boom() -> &'static str {
        panic!("secret detail")
    }
    let state = zarrgate::AppState::from_config(Config::default()).unwrap();
    let routes = axum::Router::new()
        .route("/api/v1/boom", axum::routing::get(boom))
        .route("/api/v1/fine", axum::routing::get(|| async { "fine" }));
    let app = zarrgate::server::front(state.clone(), routes);
    let r = get(&app, "/api/v1/boom", &[]).await;
    assert_eq!(r.status, 500);
    assert_eq!(r.error_code(), "internal");
    assert!(!String::from_utf8_lossy(&r.body).contains("secret"));
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
    assert_eq!(get(&app, "/api/v1/fine", &[]).await.body.as_ref(), b"fine");
    let metrics = state.metrics.render(&state.caches);
    assert!(
        metrics.contains("zarrgate_requests_total{route=\"other\",status=\"500\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("zarrgate_requests_total{route=\"other\",status=\"200\"} 1"),
        "{metrics}"
    );
}
