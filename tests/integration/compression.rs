//! Compression of text answers (src/http/compress.rs): JSON and CSV slices, hierarchies, the
//! web page and the metrics come in the coding the request accepts and decode to the bytes of
//! the answer sent as it is; raw keys, binary answers and small answers never are compressed.

use std::io::Read;

use crate::common::*;
use zarrgate::AppState;

const BROWSER: &str = "gzip, deflate, br, zstd";

/// The body of a reply, decoded from its `Content-Encoding`.
fn decoded(r: &Reply) -> Vec<u8> {
    match r.header("content-encoding") {
        None => r.body.to_vec(),
        Some("gzip") => {
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(&r.body[..]).read_to_end(&mut out).unwrap();
            out
        }
        Some("zstd") => zstd::stream::decode_all(&r.body[..]).unwrap(),
        Some(other) => panic!("unexpected coding {other}"),
    }
}

/// Whether the reply says `Vary: accept-encoding` (once: twice fails).
fn varies_on_encoding(r: &Reply) -> bool {
    let n = r
        .headers
        .get_all("vary")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter(|t| t.trim().eq_ignore_ascii_case("accept-encoding"))
        .count();
    assert!(n <= 1, "accept-encoding {n} times in Vary: {:?}", r.headers);
    n == 1
}

/// An app over a directory holding a 2048 x 2048 float32 array of distinct values (16 MiB,
/// over a streamed slice's band) in four raw chunks, beside the fixtures.
fn large_app(dir: &std::path::Path) -> zarrgate::App {
    let array = dir.join("big");
    write_v3_array(
        &array,
        &[2048, 2048],
        &[1024, 1024],
        "float32",
        serde_json::json!(0.0),
        serde_json::json!([{"name": "bytes", "configuration": {"endian": "little"}}]),
    );
    for (ci, cj) in [(0u64, 0u64), (0, 1), (1, 0), (1, 1)] {
        let mut bytes = Vec::with_capacity(4 << 20);
        for i in 0..1024u64 {
            for j in 0..1024u64 {
                let (r, c) = (ci * 1024 + i, cj * 1024 + j);
                bytes.extend_from_slice(&((r * 2048 + c) as f32 * 0.37).to_le_bytes());
            }
        }
        let path = array.join(format!("c/{ci}/{cj}"));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }
    let fx = fixtures();
    app_for(&[("big", dir), ("fx", &fx)])
}

/// A JSON slice, whole and small enough to be answered at once, in each coding a client may
/// prefer: the same JSON, with no Content-Length, and `Vary: accept-encoding` either way.
#[tokio::test]
async fn json_slices_come_in_the_coding_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let app = large_app(dir.path());
    // Encoded on the worker (64 x 64) and on the blocking pool (300 x 300, about 1 MB of
    // JSON: compressed there too).
    for uri in [
        "/api/v1/slice/big/big?select=0:64,0:64",
        "/api/v1/slice/big/big?select=100:400,1000:1300",
    ] {
        each_coding(&app, uri).await;
    }
}

async fn each_coding(app: &zarrgate::App, uri: &str) {
    let plain = get(app, uri, &[]).await;
    assert_eq!(plain.status, 200);
    assert!(
        plain.body.len() as u64 >= zarrgate::http::compress::MIN_BYTES,
        "{}",
        plain.body.len()
    );
    assert_eq!(plain.header("content-encoding"), None);
    assert_eq!(
        plain.header("content-length"),
        Some(plain.body.len().to_string().as_str())
    );
    assert!(varies_on_encoding(&plain));
    for (accept, coding) in [
        (BROWSER, "zstd"),
        ("gzip", "gzip"),
        ("gzip, deflate", "gzip"),
        ("zstd;q=0.5, gzip", "gzip"),
        ("*", "zstd"),
    ] {
        let r = get(app, uri, &[("accept-encoding", accept)]).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-encoding"), Some(coding), "{accept}");
        assert_eq!(r.header("content-length"), None, "{accept}");
        assert!(varies_on_encoding(&r), "{accept}");
        assert!(r.body.len() < plain.body.len(), "{accept}: {} bytes", r.body.len());
        assert_eq!(decoded(&r), plain.body, "{accept}");
        assert_eq!(r.header("x-zarr-shape"), plain.header("x-zarr-shape"));
    }
    // Codings we do not send, or identity preferred: the answer as it is.
    for accept in ["br, deflate", "identity", "gzip;q=0", "gzip;q=0.5, identity"] {
        let r = get(app, uri, &[("accept-encoding", accept)]).await;
        assert_eq!(r.header("content-encoding"), None, "{accept}");
        assert_eq!(r.body, plain.body, "{accept}");
    }
}

/// Large slices stream in bands; compressed (on the blocking pool), they decode to the same
/// text. CSV too; and a slice of 8 MiB, answered whole and sent in pieces. A HEAD of a slice of
/// text states neither coding nor length.
#[tokio::test]
async fn streamed_text_slices_decode_to_the_same_text() {
    let dir = tempfile::tempdir().unwrap();
    let app = large_app(dir.path());
    for (select, format) in [("0:1600,:", "json"), ("0:1600,:", "csv"), ("0:1024,:", "json")] {
        let uri = format!("/api/v1/slice/big/big?select={select}&format={format}");
        let head = request(&app, "HEAD", &uri, &[("accept-encoding", "zstd")]).await;
        assert_eq!(head.status, 200);
        assert_eq!(head.header("content-encoding"), None, "{uri}");
        assert_eq!(head.header("content-length"), None, "{uri}");
        assert!(varies_on_encoding(&head), "{uri}");
        let plain = get(&app, &uri, &[]).await;
        assert_eq!(plain.status, 200, "{format}");
        assert!(plain.body.len() > 16 << 20, "{uri}: {}", plain.body.len());
        for coding in ["zstd", "gzip"] {
            let r = get(&app, &uri, &[("accept-encoding", coding)]).await;
            assert_eq!(r.status, 200);
            assert_eq!(r.header("content-encoding"), Some(coding), "{uri}");
            assert!(r.body.len() * 2 < plain.body.len(), "{uri} {coding}: {}", r.body.len());
            assert!(decoded(&r) == plain.body, "{uri} {coding}: the text differs");
        }
    }
}

/// Binary formats, raw keys (JSON metadata documents included) and small answers are sent as
/// they are, whatever the request accepts.
#[tokio::test]
async fn raw_keys_binary_and_small_answers_are_sent_as_they_are() {
    let app = fixture_app();
    let fx = fixtures();
    for uri in [
        "/api/v1/slice/fx/v3/sharding_missing_shard_f8?format=bin",
        "/api/v1/slice/fx/v3/sharding_missing_shard_f8?format=npy",
        "/api/v1/slice/fx/v2/compressor_none_i4?format=png",
    ] {
        let plain = get(&app, uri, &[]).await;
        let r = get(&app, uri, &[("accept-encoding", BROWSER)]).await;
        assert_eq!(r.status, 200, "{uri}");
        assert_eq!(r.header("content-encoding"), None, "{uri}");
        assert!(!varies_on_encoding(&r), "{uri}");
        assert_eq!(r.body, plain.body, "{uri}");
    }
    // Raw keys, directly and through the router (the front's handlers called or not).
    let state = AppState::from_config(config_with(&[("fx", &fx)])).unwrap();
    let routed = zarrgate::server::front(state.clone(), zarrgate::server::routes(state));
    for app in [&app, &routed] {
        for key in [
            "v3/gzip_i4/zarr.json",
            "v2/compressor_none_i4/.zarray",
            "v2/group_consolidated/.zmetadata",
        ] {
            let uri = format!("/zarr/fx/{key}");
            let r = get(app, &uri, &[("accept-encoding", BROWSER)]).await;
            assert_eq!(r.status, 200, "{uri}");
            assert_eq!(r.header("content-encoding"), None, "{uri}");
            assert!(!varies_on_encoding(&r), "{uri}");
            assert_eq!(r.body, std::fs::read(fx.join(key)).unwrap(), "{uri}");
        }
    }
    // Small: a 404's JSON, a tiny slice.
    for uri in [
        "/api/v1/slice/fx/v2/no_such_array",
        "/api/v1/slice/fx/v3/gzip_i4?select=0,0",
    ] {
        let r = get(&app, uri, &[("accept-encoding", BROWSER)]).await;
        assert!((r.body.len() as u64) < zarrgate::http::compress::MIN_BYTES, "{uri}");
        assert_eq!(r.header("content-encoding"), None, "{uri}");
    }
}

/// Hierarchies, the web page and the metrics are compressed too; a HEAD states the GET's
/// coding (and then no length), or its length when it is sent as it is.
#[tokio::test]
async fn hierarchies_page_and_metrics_are_compressed() {
    let app = fixture_app();
    let page = include_bytes!("../../static/index.html");
    for uri in ["/api/v1/zom/demo/v3.zarr", "/", "/api/v1/zom-schema", "/metrics"] {
        let plain = get(&app, uri, &[]).await;
        assert_eq!(plain.status, 200, "{uri}");
        let r = get(&app, uri, &[("accept-encoding", "gzip")]).await;
        assert_eq!(r.header("content-encoding"), Some("gzip"), "{uri}");
        assert!(varies_on_encoding(&r), "{uri}");
        if uri == "/" {
            assert_eq!(decoded(&r), page, "{uri}");
        }
        if uri != "/metrics" {
            // The metrics count the requests in between.
            assert_eq!(decoded(&r), plain.body, "{uri}");
        }
    }
    let uri = "/api/v1/zom/demo/v3.zarr";
    let whole = get(&app, uri, &[]).await;
    let head = request(&app, "HEAD", uri, &[("accept-encoding", "zstd")]).await;
    assert_eq!(head.status, 200);
    assert_eq!(head.header("content-encoding"), Some("zstd"));
    assert_eq!(head.header("content-length"), None);
    assert!(head.body.is_empty());
    let head = request(&app, "HEAD", uri, &[]).await;
    assert_eq!(head.header("content-encoding"), None);
    assert_eq!(
        head.header("content-length"),
        Some(whole.body.len().to_string().as_str())
    );
}

/// At most MAX_COMPRESSING bodies are compressed at once: while that many are being sent,
/// the next answer is sent as it is (still saying it varies); once they are gone, compressed.
#[tokio::test]
async fn compressors_are_bounded() {
    use tower::ServiceExt;
    let app = fixture_app();
    let uri = "/api/v1/zom/demo/v3.zarr";
    let ask = || {
        axum::http::Request::builder()
            .uri(uri)
            .header("accept-encoding", "zstd")
            .body(axum::body::Body::empty())
            .unwrap()
    };
    let mut held = Vec::new();
    for _ in 0..zarrgate::http::compress::MAX_COMPRESSING {
        let response = app.clone().oneshot(ask()).await.unwrap();
        assert_eq!(response.headers()["content-encoding"], "zstd");
        held.push(response);
    }
    let plain = send(&app, ask()).await;
    assert_eq!(plain.status, 200);
    assert_eq!(plain.header("content-encoding"), None);
    assert!(varies_on_encoding(&plain));
    // A HEAD says what the GET would be answered now.
    let head = request(&app, "HEAD", uri, &[("accept-encoding", "zstd")]).await;
    assert_eq!(head.header("content-encoding"), None);
    assert_eq!(
        head.header("content-length"),
        Some(plain.body.len().to_string().as_str())
    );
    drop(held);
    let r = send(&app, ask()).await;
    assert_eq!(r.header("content-encoding"), Some("zstd"));
    assert_eq!(decoded(&r), plain.body);
}

/// `server.compression = false` sends every answer as it is, and says it varies on nothing of
/// the kind.
#[tokio::test]
async fn compression_can_be_turned_off() {
    let demo = repo().join("data/demo");
    let mut config = config_with(&[("demo", &demo)]);
    config.server.compression = false;
    let app = zarrgate::app(AppState::from_config(config).unwrap());
    for uri in ["/api/v1/zom/demo/v3.zarr", "/", "/metrics"] {
        let r = get(&app, uri, &[("accept-encoding", BROWSER)]).await;
        assert_eq!(r.status, 200, "{uri}");
        assert_eq!(r.header("content-encoding"), None, "{uri}");
        assert!(!varies_on_encoding(&r), "{uri}");
    }
}
